//! What PID 1 does before it serves: file systems, kernel modules, the shared directory.

use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use crate::Error;

/// The list of modules to load at boot, in order, written by `vmlet-image` into
/// `/lib/modules/<release>` (paths relative to it). A kernel of another release, or one with
/// everything built in (the lean kernel), finds no list and loads nothing.
pub const MODULE_LIST: &str = "vmlet-modules.list";

/// The list of modules a disk driver needs, loaded when a device of that driver is first
/// attached (`vmlet-modules.<driver>.list`; none for drivers the boot list covers).
pub fn driver_module_list(driver: &str) -> String {
    format!("vmlet-modules.{driver}.list")
}
/// Where the virtio-fs share is mounted in the guest.
pub const SHARE_DIR: &str = "/run/vmlet/share";
/// Kernel command-line parameter naming the virtio-fs tag to mount.
pub const SHARE_PARAM: &str = "vmlet.share=";

/// Kernel command-line parameter switching on test faults (comma-separated names): only
/// the node's admin sets it (`guest.kernel_params`; a pod's `vmlet.io/kernel-params` may
/// not name `vmlet.` parameters).
pub const FAULT_PARAM: &str = "vmlet.fault=";

/// Faults the agent plays for the tests of the shim's distrust of the guest.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// `ignore-signals`: SignalProcess answers success and signals nothing (a guest that
    /// will not let its pod be killed).
    pub ignore_signals: bool,
    /// `share-in-containers`: every container gets the guest's whole view of the share at
    /// [`EXPOSED_SHARE`] (guest root, or a compromised agent, writing where the host works).
    pub share_in_containers: bool,
    /// `slow-boot`: the agent waits [`SLOW_BOOT`] before it serves (a guest slower to come up
    /// than the node allows).
    pub slow_boot: bool,
}

/// How long `slow-boot` holds the agent back.
pub const SLOW_BOOT: std::time::Duration = std::time::Duration::from_secs(3);

/// Where `share-in-containers` puts the share in each container.
pub const EXPOSED_SHARE: &str = "/.vmlet-share";

impl Faults {
    pub fn from_cmdline(cmdline: &str) -> Self {
        let names = cmdline
            .split_whitespace()
            .filter_map(|w| w.strip_prefix(FAULT_PARAM))
            .flat_map(|list| list.split(','));
        let mut faults = Faults::default();
        for name in names {
            match name {
                "ignore-signals" => faults.ignore_signals = true,
                "share-in-containers" => faults.share_in_containers = true,
                "slow-boot" => faults.slow_boot = true,
                other => log::warn!("unknown fault {other:?} ignored"),
            }
        }
        faults
    }
}

/// What boot found out, handed to the service.
pub struct Boot {
    pub share: Option<PathBuf>,
    pub faults: Faults,
    /// What every host connection must prove it holds ([`crate::host_gate`]).
    pub key: vmlet_protocol::auth::AgentKey,
}

/// Kernel settings of a Kubernetes node, which kubelet sets on its hosts: a container sees
/// the same memory behaviour in a VM as on a node (an allocation beyond the VM's size
/// succeeds, and the container's memory limit, not the VM, decides when it is OOM-killed).
const NODE_SYSCTLS: &[(&str, &str)] = &[
    ("/proc/sys/vm/overcommit_memory", "1"),
    ("/proc/sys/vm/panic_on_oom", "0"),
];

pub fn boot() -> Result<Boot, Error> {
    mount_basics()?;
    for (path, value) in NODE_SYSCTLS {
        std::fs::write(path, value).map_err(|e| Error::io(format!("write {path}"), e))?;
    }
    load_modules(MODULE_LIST)?;
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").map_err(|e| Error::io("read /proc/cmdline", e))?;
    let template = cmdline
        .split_whitespace()
        .any(|w| w == vmlet_protocol::TEMPLATE_PARAM);
    if template {
        crate::template::prepare()?;
        let mut kernel = crate::template::KernelCid::open()?;
        let cid = crate::template::await_restore(&mut kernel, crate::template::POLL)?;
        log::info!("restored from a template as vsock CID {cid}");
    }
    // Fatal without it: the agent would have no way to tell its shim from anyone else.
    let key = crate::host_gate::read_key()?;
    if template {
        crate::template::reseed(key.as_bytes())?;
        log::info!("reseeded the random number generator from this pod's key");
    }
    let share = match cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(SHARE_PARAM))
    {
        Some(tag) => {
            mount_fs(tag, SHARE_DIR, "virtiofs", MsFlags::empty(), None)?;
            Some(PathBuf::from(SHARE_DIR))
        }
        None => None,
    };
    let _ = nix::unistd::sethostname("vmlet");
    let faults = Faults::from_cmdline(&cmdline);
    if faults != Faults::default() {
        log::warn!("test faults on: {faults:?}");
    }
    Ok(Boot { share, faults, key })
}

fn mount_fs(
    source: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), Error> {
    std::fs::create_dir_all(target).map_err(|e| Error::io(format!("mkdir {target}"), e))?;
    mount(Some(source), target, Some(fstype), flags, data)
        .map_err(|e| Error::Boot(format!("mount {fstype} on {target}: {e}")))
}

fn mount_basics() -> Result<(), Error> {
    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount_fs("proc", "/proc", "proc", nosuid_nodev_noexec, None)?;
    mount_fs("sysfs", "/sys", "sysfs", nosuid_nodev_noexec, None)?;
    mount_fs(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )?;
    mount_fs(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    mount_fs(
        "shm",
        "/dev/shm",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    // favordynmods (Linux 6.0): moving a process into a cgroup, which the agent does for
    // every container init and exec process, no longer waits for an RCU grace period
    // (8-13 ms each under TCG, 0.4 ms with it), for slightly dearer forks and exits.
    mount_fs(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        nosuid_nodev_noexec,
        Some("favordynmods"),
    )?;
    mount_fs(
        "tmpfs",
        "/run",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )?;
    mount_fs(
        "tmpfs",
        "/tmp",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    Ok(())
}

/// Loads the modules the list `/lib/modules/<release>/<list>` names, in order (a missing
/// list loads nothing; loaded ones are skipped).
pub fn load_modules(list: &str) -> Result<(), Error> {
    let release = nix::sys::utsname::uname()
        .map_err(|e| Error::Boot(format!("uname: {e}")))?
        .release()
        .to_string_lossy()
        .into_owned();
    let base = Path::new("/lib/modules").join(&release);
    let list = base.join(list);
    let list = match std::fs::read_to_string(&list) {
        Ok(list) => list,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("read {}", list.display()), e)),
    };
    for module in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = base.join(module);
        let file = std::fs::File::open(&path)
            .map_err(|e| Error::io(format!("open module {}", path.display()), e))?;
        match nix::kmod::finit_module(&file, c"", nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(Error::Boot(format!("load module {module}: {e}"))),
        }
    }
    Ok(())
}

/// Flushes and powers the VM off. Used on shutdown and on fatal errors.
pub fn power_off() -> ! {
    nix::unistd::sync();
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
    // reboot(2) only returns on error; PID 1 must not exit (that panics the kernel).
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_come_from_the_command_line_only_when_named() {
        assert_eq!(
            Faults::from_cmdline("console=ttyS0 vmlet.share=vmlet"),
            Faults::default()
        );
        let on = Faults::from_cmdline("quiet vmlet.fault=nothing,ignore-signals");
        assert!(on.ignore_signals && !on.share_in_containers);
        let on = Faults::from_cmdline("vmlet.fault=share-in-containers");
        assert!(on.share_in_containers && !on.ignore_signals);
        let on = Faults::from_cmdline("vmlet.fault=slow-boot");
        assert!(on.slow_boot && !on.ignore_signals && !on.share_in_containers);
    }
}
