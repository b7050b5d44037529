//! The VM's vsock device: the kernel's vhost-vsock when the node has `/dev/vhost-vsock`
//! (and libvirt starts the VM, allocating its CID), else a vhost-device-vsock process per
//! pod (vhost-user: [`crate::host::vhost_device_vsock`]), in the pod's cgroup from its exec,
//! recorded as soon as it runs.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
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
/// starts its backend. Where the shim starts QEMU itself (`direct`), the shim connects the
/// backend's vhost-user socket (root's, 0600) and QEMU gets the connection (returned
/// beside the device); libvirt's QEMU connects the socket itself, given to the pod's user.
pub(super) async fn start(
    config: &NodeConfig,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    user: &PodUser,
    direct: bool,
) -> Result<(VsockDevice, Option<OwnedFd>), Error> {
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
        return Ok((VsockDevice::Vhost, None));
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
    let connection = if direct {
        std::fs::set_permissions(&paths.vhost_socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod {}", paths.vhost_socket.display()), e))?;
        let socket = paths.vhost_socket.clone();
        Some(block(move || vhost_device_vsock::connect(&socket)).await??)
    } else {
        user.give_private(&paths.vhost_socket)?;
        None
    };
    let device = VsockDevice::VhostUser {
        socket: paths.vhost_socket.to_string_lossy().into_owned(),
        connection: connection.as_ref().map(AsRawFd::as_raw_fd),
    };
    Ok((device, connection))
}
