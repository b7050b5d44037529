//! KVM or TCG: `accel` in the node config, `auto` by whether QEMU can use `/dev/kvm`. A CPU
//! model that passes the host's CPU through needs KVM and is refused under TCG, by name.

use std::path::Path;
use std::sync::Arc;

use vmlet_config::{Accel, CpuModel, NodeConfig, VmOptions};

use super::block;
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
            Path::new("/dev/kvm").exists() && block(move || vmm.kvm_usable(&qemu, &machine)).await?
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
