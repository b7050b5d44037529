//! The VM's vsock device: the kernel's vhost-vsock when the node has `/dev/vhost-vsock`
//! (and libvirt starts the VM, allocating its CID), else a vhost-device-vsock process per
//! pod (vhost-user), recorded and put in the pod's cgroup.

use std::path::Path;

use vmlet_config::{Launcher, NodeConfig, VsockTransport};

use super::{block, Recorder};
use crate::guest::vsock;
use crate::host::pod_paths::PodPaths;
use crate::host::pod_user::PodUser;
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
            if config.launcher == Launcher::Libvirt && Path::new("/dev/vhost-vsock").exists() =>
        {
            VsockTransport::Vhost
        }
        VsockTransport::Auto => VsockTransport::VhostUser,
        other => other,
    };
    if transport != VsockTransport::VhostUser {
        return Ok(VsockDevice::Vhost);
    }
    let (binary, socket, uds, log) = (
        config.helpers.vhost_device_vsock.clone(),
        paths.vhost_socket.clone(),
        paths.vsock_uds.clone(),
        paths.vsock_log.clone(),
    );
    let pid =
        block(move || vsock::start_vhost_device_vsock(&binary, &socket, &uds, &log)).await??;
    rec.record(crate::host::undo::Made::VsockBackend(pid))?;
    rec.place(pid, "vhost-device-vsock")?;
    user.give_private(&paths.vhost_socket)?;
    Ok(VsockDevice::VhostUser {
        socket: paths.vhost_socket.to_string_lossy().into_owned(),
    })
}
