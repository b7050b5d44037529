//! The pod's vsock backend when the VM's vsock is vhost-user: a `vhost-device-vsock` process
//! per pod, as root, serving the guest's CID [`crate::guest::vsock::HYBRID_GUEST_CID`] on two
//! sockets: the vhost-user one QEMU connects (given to the pod's QEMU's user by the caller)
//! and the shim's own, where the shim reaches the guest's ports (hybrid vsock). Before its
//! exec it joins the pod's cgroup, takes a session of its own, the OOM score a process
//! starts with and no core dumps, makes its sockets 0600 (umask 077) and keeps no
//! descriptor but stdio ([`qemu_process::helper_command`]); its output goes to a file of
//! the pod's log tmpfs. It is started first and waited for
//! after ([`wait_ready`]), so that the caller records it in the pod's journal as soon as it
//! runs.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::guest::vsock::HYBRID_GUEST_CID;
use crate::host::qemu_process;
use crate::Error;

/// What the pod's journal calls it ([`crate::host::undo::Made::Process`]).
pub(crate) const NAME: &str = "vhost-device-vsock";
/// How long it may take to bind its sockets.
const READY_WAIT: Duration = Duration::from_secs(10);

/// Starts `binary` for one VM, serving QEMU on `vhost_socket` and the shim on `uds`, joined
/// to the cgroups whose `cgroup.procs` are `cgroup_procs`, writing to `log`. Returns its
/// PID.
pub fn spawn(
    binary: &Path,
    vhost_socket: &Path,
    uds: &Path,
    cgroup_procs: Vec<File>,
    log: File,
) -> Result<u32, Error> {
    let mut command = qemu_process::helper_command(binary, log, cgroup_procs, Vec::new())?;
    command.arg("--vm").arg(format!(
        "guest-cid={HYBRID_GUEST_CID},socket={},uds-path={}",
        vhost_socket.display(),
        uds.display()
    ));
    let child = command
        .spawn()
        .map_err(|e| Error::io(format!("start {}", binary.display()), e))?;
    Ok(child.id())
}

/// Waits until the backend has bound its vhost-user socket (it binds the shim's, `uds`,
/// first, which only the shim connects: 0600 by its umask, and made so again here).
pub fn wait_ready(binary: &Path, vhost_socket: &Path, uds: &Path) -> Result<(), Error> {
    let deadline = Instant::now() + READY_WAIT;
    while !vhost_socket.exists() {
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "{} did not create {} within {} s",
                binary.display(),
                vhost_socket.display(),
                READY_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::set_permissions(uds, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod {}", uds.display()), e))
}
