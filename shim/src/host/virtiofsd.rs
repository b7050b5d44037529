//! The pod's virtiofsd, which the shim starts under either launcher
//! ([`crate::vm`]'s `pod_virtiofsd`), as libvirt would start it: as root (it sandboxes
//! itself in namespaces of its own), on a listening socket the shim bound and handed over
//! (`--fd`). Before its exec it joins the pod's cgroup, takes a session of its own, the OOM
//! score a process starts with and no core dumps, and keeps no descriptor but stdio and the
//! socket ([`qemu_process::helper_command`]); its output goes to a file of the pod's log
//! tmpfs.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

use crate::host::qemu_process;
use crate::Error;

/// Starts `binary` serving `share` on `listener`, joined to the cgroups whose
/// `cgroup.procs` are `cgroup_procs`, writing to `log`. Returns its PID.
pub fn spawn(
    binary: &Path,
    share: &Path,
    listener: UnixListener,
    cgroup_procs: Vec<File>,
    log: File,
) -> Result<u32, Error> {
    let socket: RawFd = listener.as_raw_fd();
    let mut shared_dir = std::ffi::OsString::from("--shared-dir=");
    shared_dir.push(share);
    // The listening socket is the one descriptor it inherits beside stdio.
    let mut command = qemu_process::helper_command(binary, log, cgroup_procs, vec![socket])?;
    command.arg(format!("--fd={socket}")).arg(shared_dir);
    let child = command
        .spawn()
        .map_err(|e| Error::io(format!("start {}", binary.display()), e))?;
    // Its copy is virtiofsd's now.
    drop(listener);
    Ok(child.id())
}
