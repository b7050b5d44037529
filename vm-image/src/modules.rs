//! Which kernel modules the guest needs, resolved through `modules.dep`.

use std::collections::{HashMap, HashSet};

use crate::Error;

/// Modules the guest loads, by name: virtio PCI transport, vsock, virtio-fs, network,
/// block, console and bridges. Their dependencies come from `modules.dep`.
pub const GUEST_MODULES: &[&str] = &[
    "virtio_pci",
    "vmw_vsock_virtio_transport",
    "virtiofs",
    "virtio_net",
    "virtio_blk",
    "virtio_console",
    // The fw_cfg device in sysfs: the agent's key, which the shim gives each VM.
    "qemu_fw_cfg",
    // The region a pod's VM grows by when its containers' memory limits need it.
    "virtio_mem",
    // A privileged container (or one with CAP_NET_ADMIN) may make bridges, as on a node.
    "bridge",
];

/// Modules a disk driver needs, packed but loaded only when the first disk of that driver
/// is attached (the list goes to `/lib/modules/<release>/vmlet-modules.<driver>.list`). virtio-blk is
/// in the boot list; NVMe is built into the kernel; SCSI needs these.
pub const DRIVER_MODULES: &[(&str, &[&str])] = &[("scsi", &["virtio_scsi", "sd_mod"])];

/// `virtio-pci.ko` and `virtio_pci` name the same module.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// Returns the module paths to load, dependencies first, each once. Built-in modules
/// (listed in `modules.builtin`) need no loading; a module found in neither is an error.
pub fn resolve(
    modules_dep: &str,
    modules_builtin: &str,
    wanted: &[&str],
) -> Result<Vec<String>, Error> {
    let mut deps: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for line in modules_dep.lines() {
        let Some((path, rest)) = line.split_once(':') else {
            continue;
        };
        let requires = rest.split_whitespace().map(str::to_owned).collect();
        deps.insert(module_name(path), (path.to_owned(), requires));
    }
    let builtin: HashSet<String> = modules_builtin.lines().map(module_name).collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for name in wanted {
        let name = name.replace('-', "_");
        if builtin.contains(&name) {
            continue;
        }
        let (path, _) = deps
            .get(&name)
            .ok_or_else(|| Error::MissingModule(name.clone()))?;
        visit(path, &deps, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn visit(
    path: &str,
    deps: &HashMap<String, (String, Vec<String>)>,
    seen: &mut HashSet<String>,
    order: &mut Vec<String>,
) -> Result<(), Error> {
    if !seen.insert(path.to_owned()) {
        return Ok(());
    }
    let name = module_name(path);
    let (_, requires) = deps
        .get(&name)
        .ok_or_else(|| Error::MissingModule(name.clone()))?;
    for dep in requires {
        visit(dep, deps, seen, order)?;
    }
    order.push(path.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/net/vmw_vsock/vsock.ko
kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko
kernel/net/vmw_vsock/vsock.ko:
kernel/drivers/virtio/virtio-pci.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
";

    #[test]
    fn dependencies_come_first_and_once() {
        let order = resolve(DEP, "", &["vmw_vsock_virtio_transport", "virtio_pci"]).unwrap();
        assert_eq!(
            order,
            [
                "kernel/net/vmw_vsock/vsock.ko",
                "kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko",
                "kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko",
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/drivers/virtio/virtio-pci.ko",
            ]
        );
    }

    #[test]
    fn builtin_modules_are_skipped() {
        let order = resolve(
            DEP,
            "kernel/drivers/virtio/virtio_pci.ko\n",
            &["virtio_pci"],
        )
        .unwrap();
        assert!(order.is_empty());
    }

    #[test]
    fn unknown_module_is_an_error() {
        assert!(matches!(
            resolve(DEP, "", &["virtiofs"]),
            Err(Error::MissingModule(name)) if name == "virtiofs"
        ));
    }
}
