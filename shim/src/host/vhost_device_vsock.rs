//! The pod's vsock backend when the VM's vsock is vhost-user: a `vhost-device-vsock` process
//! per pod, as root, serving the guest's CID [`crate::guest::vsock::HYBRID_GUEST_CID`] on two
//! sockets: the vhost-user one QEMU's side is on (the shim connects it where it starts QEMU,
//! [`connect`]; under libvirt it is given to the pod's QEMU's user, which connects it) and
//! the shim's own, where the shim reaches the guest's ports (hybrid vsock). Before its
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

/// The pod a `vhost-device-vsock` command line (NUL-separated) serves: the directory under
/// `state_dir` its `socket=` lies in.
pub fn serving_pod(cmdline: &[u8], state_dir: &Path) -> Option<String> {
    let text = String::from_utf8_lossy(cmdline);
    let mut args = text.split('\0');
    if !args.next()?.ends_with("vhost-device-vsock") {
        return None;
    }
    let socket = args
        .flat_map(|a| a.split(','))
        .find_map(|part| part.strip_prefix("socket="))?;
    let relative = Path::new(socket).strip_prefix(state_dir).ok()?;
    let mut parts = relative.components();
    let pod = parts.next()?.as_os_str().to_str()?.to_owned();
    // The socket itself is inside the pod's directory.
    parts.next()?;
    Some(pod)
}

/// Kills the vsock backend `pid` of the pod whose directory is `pod_dir`, if that PID is
/// still one (an earlier vmlet's record, or `vmletctl gc`'s find, has the PID alone): the
/// process is held by a pidfd first, then taken for the pod's only if its command line names
/// a socket in that directory, then signalled through the pidfd, so that a process that
/// took the PID since is never signalled.
pub fn kill_if_serving(pid: u32, pod_dir: &Path) -> Result<(), Error> {
    let Some(pidfd) = crate::host::pidfd::open_if_running(pid)? else {
        return Ok(());
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let (Some(state_dir), Some(pod_id)) = (pod_dir.parent(), pod_dir.file_name()) else {
        return Ok(());
    };
    if serving_pod(&cmdline, state_dir).as_deref() != pod_id.to_str() {
        return Ok(());
    }
    crate::host::pidfd::signal(&pidfd, libc::SIGKILL, NAME)
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

/// The shim's connection to the backend's vhost-user socket, for the pod's QEMU (the one
/// connection the backend serves): made within [`READY_WAIT`] (a socket bound but not yet
/// listening refuses it).
pub fn connect(vhost_socket: &Path) -> Result<std::os::fd::OwnedFd, Error> {
    let deadline = Instant::now() + READY_WAIT;
    loop {
        match std::os::unix::net::UnixStream::connect(vhost_socket) {
            Ok(stream) => return Ok(stream.into()),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(Error::io(format!("connect {}", vhost_socket.display()), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vsock_helper_is_known_by_its_socket_in_a_pod_directory() {
        let state = Path::new("/run/vmlet");
        let cmdline = |args: &[&str]| args.join("\0").into_bytes();
        let ours = cmdline(&[
            "/usr/local/bin/vhost-device-vsock",
            "--vm",
            "guest-cid=3,socket=/run/vmlet/pod-a/vhost-vsock.sock,uds-path=/run/vmlet/pod-a/v.sock",
        ]);
        assert_eq!(serving_pod(&ours, state).as_deref(), Some("pod-a"));
        for other in [
            // Another state dir, another program, the state dir itself, no socket.
            cmdline(&[
                "vhost-device-vsock",
                "--vm",
                "socket=/run/other/pod-a/s.sock",
            ]),
            cmdline(&["qemu", "--vm", "socket=/run/vmlet/pod-a/s.sock"]),
            cmdline(&["vhost-device-vsock", "--vm", "socket=/run/vmlet/s.sock"]),
            cmdline(&["vhost-device-vsock", "--help"]),
        ] {
            assert_eq!(serving_pod(&other, state), None);
        }
    }

    #[test]
    fn only_the_pods_own_backend_is_killed_by_its_pid() {
        // A process whose command line reads as pod-a's backend (bash under that name,
        // with its socket among its arguments).
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let script = format!(
            "exec -a {d}/vhost-device-vsock bash -c 'sleep 100; true' --vm \
             guest-cid=3,socket={d}/pod-a/vhost-vsock.sock"
        );
        let mut backend = std::process::Command::new("bash")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let pid = backend.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap()
            .starts_with(format!("{d}/vhost-device-vsock").as_bytes())
        {
            assert!(std::time::Instant::now() < deadline, "no exec -a");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Another pod's, or no pod's: left alone.
        kill_if_serving(pid, &dir.path().join("pod-b")).unwrap();
        kill_if_serving(std::process::id(), &dir.path().join("pod-a")).unwrap();
        assert!(backend.try_wait().unwrap().is_none(), "left alone");
        kill_if_serving(pid, &dir.path().join("pod-a")).unwrap();
        let status = backend.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
    }
}
