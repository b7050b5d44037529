//! The pod's virtiofsd when the shim starts QEMU itself (`launcher = "direct"`), as libvirt
//! starts it for a domain: as root (it sandboxes itself in namespaces of its own), on a
//! listening socket the shim bound and handed over (`--fd`). Before its exec it joins the
//! pod's cgroup (a process it forks is in it too), takes a session of its own, the OOM
//! score a process starts with (not the shim's, which containerd lowers) and no core
//! dumps, and closes every descriptor but stdio and the socket; its output goes to a file
//! of the pod's log tmpfs.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
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
    let cgroups: Vec<RawFd> = cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect();
    let mut shared_dir = std::ffi::OsString::from("--shared-dir=");
    shared_dir.push(share);
    let oom_score_adj = qemu_process::oom_score_adj_path();
    let mut command = qemu_process::detached_command(binary, log)?;
    command.arg(format!("--fd={socket}")).arg(shared_dir);
    // SAFETY: the closure makes only async-signal-safe system calls on data made before
    // the fork, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            libc::umask(0o077);
            if !qemu_process::join_cgroups(&cgroups) || !qemu_process::detach(&oom_score_adj) {
                return fail();
            }
            // The listening socket is the one descriptor it inherits beside stdio.
            if !qemu_process::close_all_but(&[socket]) {
                return fail();
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| Error::io(format!("start {}", binary.display()), e))?;
    Ok(child.id())
}
