//! The VM's vsock device: the kernel's vhost-vsock when the node has `/dev/vhost-vsock`
//! (and libvirt starts the VM, allocating its CID), else a vhost-device-vsock process per
//! pod (vhost-user: [`crate::host::vhost_device_vsock`]), in the pod's cgroup from its exec,
//! recorded as soon as it runs.

use std::path::Path;

use vmlet_config::{NodeConfig, VsockTransport};

use crate::vmm::launcher_choice;

use super::{block, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::pod_user::PodUser;
use crate::host::vhost_device_vsock;
use crate::vmm::vm_spec::VsockDevice;
use crate::Error;

/// Picks the transport (`vsock` in the node config, `auto` by what the node has) and
/// starts its backend.
pub(super) async fn start(
    config: &NodeConfig,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    user: &PodUser,
) -> Result<VsockDevice, Error> {
    let transport = match config.vsock {
        VsockTransport::Auto
            if !launcher_choice::choose(config).direct
                && Path::new("/dev/vhost-vsock").exists() =>
        {
            VsockTransport::Vhost
        }
        VsockTransport::Auto => VsockTransport::VhostUser,
        other => other,
    };
    if transport != VsockTransport::VhostUser {
        return Ok(VsockDevice::Vhost);
    }
    let binary = config.helpers.vhost_device_vsock.clone();
    let cgroup_procs = crate::host::pod_cgroup::procs_files_of(rec.cgroup)?;
    let pid = vhost_device_vsock::spawn(
        &binary,
        &paths.vhost_socket,
        &paths.vsock_uds,
        cgroup_procs,
        super::helper_log::create(&paths.vsock_log)?,
    )?;
    // Recorded as soon as it runs: the journal ends it (through a pidfd, if its PID is still
    // that process) whatever happens next.
    rec.record_helper(pid, vhost_device_vsock::NAME, &paths.vsock_log)?;
    let (socket, uds) = (paths.vhost_socket.clone(), paths.vsock_uds.clone());
    block(move || vhost_device_vsock::wait_ready(&binary, &socket, &uds)).await??;
    user.give_private(&paths.vhost_socket)?;
    Ok(VsockDevice::VhostUser {
        socket: paths.vhost_socket.to_string_lossy().into_owned(),
    })
}
