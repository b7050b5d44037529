//! The pod's host process: a child of the shim that only holds the pod's network
//! namespace (a new one, or the one the spec names). OCI hooks find a container's
//! namespaces through the PID in their state (nerdctl's CNI hook opens `/proc/PID/ns/net`);
//! a VM has no such host process, so vmlet gives them this one. It is named
//! [`PROCESS_NAME`]; teardown kills it (the state file records its PID).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::Error;

/// The holder's `/proc/PID/comm`, checked before it is killed (PIDs are recycled).
pub const PROCESS_NAME: &str = "vmlet-netns";

/// Starts the holder in a new network namespace, or in the one at `join`. Returns its PID
/// once it is in place.
pub fn spawn(join: Option<&Path>) -> Result<u32, Error> {
    let target = join
        .map(|p| {
            std::fs::File::open(p)
                .map_err(|e| Error::io(format!("open network namespace {}", p.display()), e))
        })
        .transpose()?;
    let target_fd = target.as_ref().map_or(-1, |f| f.as_raw_fd());
    let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("pipe", e.into()))?;
    let status_w_fd = status_w.as_raw_fd();
    // SAFETY: the shim is multi-threaded, so the child calls only async-signal-safe
    // functions (prctl, signal, setns/unshare, write, close_range, pause, _exit), all on
    // values prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io("fork", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        unsafe { hold(target_fd, status_w_fd) }
    }
    drop(status_w);
    drop(target);
    // One byte 0 when it holds the namespace, else 1 and the errno.
    let mut reply = [0u8; 5];
    let mut file = std::fs::File::from(status_r);
    let n = std::io::Read::read(&mut file, &mut reply).unwrap_or(0);
    if n >= 1 && reply[0] == 0 {
        return Ok(pid as u32);
    }
    stop(pid as u32);
    let errno = if n == 5 {
        i32::from_ne_bytes([reply[1], reply[2], reply[3], reply[4]])
    } else {
        0
    };
    let what = match join {
        Some(p) => format!("enter network namespace {}", p.display()),
        None => "create a network namespace".to_owned(),
    };
    Err(Error::io(
        format!("pod host process: {what}"),
        std::io::Error::from_raw_os_error(errno),
    ))
}

/// The child's whole life.
unsafe fn hold(target_fd: i32, status_fd: i32) -> ! {
    let name = b"vmlet-netns\0"; // PROCESS_NAME
    libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
    // The shim's signal handlers would keep SIGTERM and SIGINT from ending it.
    libc::signal(libc::SIGTERM, libc::SIG_DFL);
    libc::signal(libc::SIGINT, libc::SIG_DFL);
    let rc = if target_fd >= 0 {
        libc::setns(target_fd, libc::CLONE_NEWNET)
    } else {
        libc::unshare(libc::CLONE_NEWNET)
    };
    let mut reply = [0u8; 5];
    if rc != 0 {
        reply[0] = 1;
        reply[1..].copy_from_slice(&(*libc::__errno_location()).to_ne_bytes());
    }
    libc::write(status_fd, reply.as_ptr().cast(), reply.len());
    if rc != 0 {
        libc::_exit(1);
    }
    // Nothing of the shim's (containerd's sockets, the VM's fds) stays open here.
    libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
    loop {
        libc::pause();
    }
}

/// The holder's network namespace.
pub fn netns_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// Kills the holder if `pid` still is one.
pub fn stop(pid: u32) {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim_end() == PROCESS_NAME {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn netns_of(pid: &str) -> PathBuf {
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap()
    }

    #[test]
    fn holds_a_new_namespace_until_stopped() {
        let pid = spawn(None).unwrap();
        assert_ne!(netns_of(&pid.to_string()), netns_of("self"));
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm.trim_end(), PROCESS_NAME);
        stop(pid);
        nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None).unwrap();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn joins_a_given_namespace() {
        let pid = spawn(Some(Path::new("/proc/self/ns/net"))).unwrap();
        assert_eq!(netns_of(&pid.to_string()), netns_of("self"));
        stop(pid);
        nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None).unwrap();
    }

    #[test]
    fn a_missing_namespace_is_named() {
        let err = spawn(Some(Path::new("/nonexistent/netns"))).unwrap_err();
        assert!(
            err.message().contains("/nonexistent/netns"),
            "{}",
            err.message()
        );
    }
}
