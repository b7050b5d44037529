//! KVM or TCG: `accel` in the node config, `auto` by whether libvirt offers KVM for the
//! config's QEMU and machine type (where the shim starts QEMU itself, the direct launcher,
//! whether `/dev/kvm` is there) and a guest boots on it ([`kvm_probe`]). A CPU
//! model that passes the host's CPU through needs KVM and is refused under TCG, by name.

use std::path::Path;
use std::sync::Arc;

use vmlet_config::{Accel, CpuModel, NodeConfig, VmOptions};

use super::block;
use crate::vmm::kvm_probe;
use crate::vmm::VmManager;
use crate::Error;

/// Whether the VM runs on KVM.
pub(super) async fn use_kvm(
    config: &NodeConfig,
    vmm: &Arc<dyn VmManager>,
    options: &VmOptions,
) -> Result<bool, Error> {
    let kvm = match config.accel {
        Accel::Kvm => true,
        Accel::Tcg => false,
        Accel::Auto => {
            let (vmm, qemu, machine) = (
                vmm.clone(),
                config.helpers.qemu.to_string_lossy().into_owned(),
                config.guest.machine.clone(),
            );
            let offered = Path::new("/dev/kvm").exists()
                && (crate::vmm::launcher_choice::choose(config).direct
                    || block(move || vmm.kvm_usable(&qemu, &machine)).await?);
            offered && guest_boots(config).await
        }
    };
    let host_cpu = options.cpu_model.as_ref().and_then(CpuModel::host_mode);
    if let (false, Some(name)) = (kvm, host_cpu) {
        return Err(Error::FailedPrecondition(format!(
            "CPU mode {name} (the pod's CPU annotation) needs KVM, and this node runs TCG"
        )));
    }
    Ok(kvm)
}

/// Whether a guest boots on the KVM libvirt offers ([`kvm_probe`]: once per host boot).
async fn guest_boots(config: &NodeConfig) -> bool {
    let answer = kvm_probe::guest_boots_on_kvm(
        &config.helpers.qemu,
        &config.guest.kernel,
        &config.guest.machine,
        Some(&config.state_dir),
    )
    .await;
    match answer {
        Ok(_) => true,
        Err(why) => {
            log::warn!("accel = \"auto\": TCG, since libvirt offers KVM but {why}");
            false
        }
    }
}
