//! A container's exec server, as `vmlet-agent __exec-server`: started at the container's
//! first exec, it joins the namespaces and the root of the container's init once, then
//! starts every exec process of that container by forking itself, which under TCG costs a
//! fraction of executing the agent again and joining the namespaces for each exec.
//!
//! File descriptors set up by [`crate::launch`]: 0-2 stdio (stderr is the agent's console),
//! 3 the [`ExecServerSpec`] as JSON, 4 the start pipe (unused), 5 the status pipe (`R` once
//! joined, `E<message>` if not), 6 the request socket ([`REQUESTS_FD`]).
//!
//! Each request on that `SOCK_SEQPACKET` socket is one byte carrying six descriptors: the
//! exec process's stdin, stdout, stderr, spec pipe, start pipe and status pipe. The server
//! clones the process with CLONE_PARENT, so that it is a child of the agent (whose reaper
//! collects it) and a member of the PID namespace the server joined for its children, and
//! answers `P<pid>` (the agent's view of the PID) or `E<message>`. The process takes the
//! helpers' handshake ([`crate::helper_fds`]): it reads its [`ProcessSpec`] from fd 3,
//! reports `R`, waits for the start byte and becomes the process. The server exits when
//! the agent closes the socket (the container's removal).

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{recvmsg, send, ControlMessageOwned, MsgFlags};
use nix::unistd::{chdir, chroot, fchdir};
use serde::{Deserialize, Serialize};

use crate::become_process::become_process;
use crate::helper_fds::{Handshake, REQUESTS_FD};
use crate::init_spec::ProcessSpec;

/// The namespaces an exec process shares with its container's init. The mount namespace
/// comes last: after it, the init's /proc entries are out of reach.
const NAMESPACES: &[&str] = &["ipc", "uts", "pid", "cgroup", "mnt"];

/// Descriptors in one request: stdin, stdout, stderr, spec, start, status.
pub const REQUEST_FDS: usize = 6;

/// Whose namespaces and root the server joins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecServerSpec {
    /// Guest PID of the container's init.
    pub init_pid: i32,
}

/// Entry point of `vmlet-agent __exec-server`. Never returns.
pub fn run() -> ! {
    let mut handshake = Handshake::take();
    // SAFETY: launch.rs hands this descriptor over open and owned by nobody else.
    let requests = unsafe { OwnedFd::from_raw_fd(REQUESTS_FD) };
    let _ = nix::fcntl::fcntl(
        &requests,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    match handshake
        .read_spec::<ExecServerSpec>("exec server spec")
        .and_then(|spec| join(&spec))
    {
        Ok(()) => handshake.ready(),
        Err(message) => handshake.fail(&message, 1),
    }
    loop {
        match receive(&requests) {
            Ok(Some(fds)) => {
                let answer = match spawn(fds, &requests) {
                    Ok(pid) => format!("P{pid}"),
                    Err(message) => format!("E{message}"),
                };
                if send(requests.as_raw_fd(), answer.as_bytes(), MsgFlags::empty()).is_err() {
                    std::process::exit(1);
                }
            }
            Ok(None) => std::process::exit(0),
            Err(message) => {
                eprintln!("vmlet-agent exec server: {message}");
                std::process::exit(1);
            }
        }
    }
}

/// Enters the init's namespaces and root directory.
fn join(spec: &ExecServerSpec) -> Result<(), String> {
    let pid = spec.init_pid;
    let open = |what: &str| {
        File::open(format!("/proc/{pid}/{what}"))
            .map_err(|e| format!("open /proc/{pid}/{what} (has the container exited?): {e}"))
    };
    let root = open("root")?;
    let namespaces = NAMESPACES
        .iter()
        .map(|ns| open(&format!("ns/{ns}")).map(|f| (*ns, f)))
        .collect::<Result<Vec<_>, _>>()?;
    for (name, file) in &namespaces {
        setns(file.as_fd(), CloneFlags::empty())
            .map_err(|e| format!("join {name} namespace: {e}"))?;
    }
    fchdir(&root).map_err(|e| format!("enter the container's root: {e}"))?;
    chroot(".").map_err(|e| format!("chroot: {e}"))?;
    chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// One request's descriptors (close-on-exec), or `None` once the agent closed the socket.
/// A request without exactly [`REQUEST_FDS`] descriptors is an error: only the agent holds
/// the other end.
pub(crate) fn receive(requests: &OwnedFd) -> Result<Option<[OwnedFd; REQUEST_FDS]>, String> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; REQUEST_FDS]);
    let message = loop {
        match recvmsg::<()>(
            requests.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(|e| format!("receive a request: {e}"))?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in message.cmsgs().map_err(|e| format!("request: {e}"))? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: the kernel just installed these descriptors for this process.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if message.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let count = fds.len();
    fds.try_into()
        .map(Some)
        .map_err(|_| format!("a request carried {count} descriptors, not {REQUEST_FDS}"))
}

/// Clones the exec process and returns its PID (the agent's view).
fn spawn(fds: [OwnedFd; REQUEST_FDS], requests: &OwnedFd) -> Result<i32, String> {
    // SAFETY: the server is single-threaded, so the child (fork semantics: no CLONE_VM,
    // null stack) may run ordinary code.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        let _ = nix::unistd::close(requests.as_raw_fd());
        become_exec_process(fds)
    }
    if pid < 0 {
        return Err(format!("clone: {}", std::io::Error::last_os_error()));
    }
    Ok(pid as i32)
}

/// In the clone: moves the request's descriptors to 0-5 and takes the helpers' handshake.
fn become_exec_process(fds: [OwnedFd; REQUEST_FDS]) -> ! {
    // Out of the way first: a received descriptor may have any number, 0-5 included.
    let moved: Vec<OwnedFd> = fds
        .iter()
        .map(|fd| {
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(100))
                // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor this process owns.
                .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) })
        })
        .collect::<Result<_, _>>()
        .unwrap_or_else(|_| std::process::exit(120));
    drop(fds);
    for (target, fd) in moved.iter().enumerate() {
        // SAFETY: dup2 onto the fixed numbers of the handshake; the sources stay open.
        if unsafe { libc::dup2(fd.as_raw_fd(), target as RawFd) } < 0 {
            std::process::exit(121);
        }
    }
    drop(moved);
    let mut handshake = Handshake::take();
    let spec = match handshake.read_spec::<ProcessSpec>("exec spec") {
        Ok(spec) => spec,
        Err(message) => handshake.fail(&message, 1),
    };
    handshake.ready_then_wait_for_start();
    let message = become_process(&spec);
    handshake.fail(&message, 127)
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use nix::sys::socket::{
        sendmsg, socketpair, AddressFamily, ControlMessage, SockFlag, SockType,
    };

    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn send_fds(socket: &OwnedFd, count: usize) {
        let null = File::open("/dev/null").unwrap();
        let fds = vec![null.as_raw_fd(); count];
        let rights = [ControlMessage::ScmRights(&fds)];
        let iov = [IoSlice::new(b"x")];
        sendmsg::<()>(socket.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None).unwrap();
    }

    #[test]
    fn a_request_carries_six_descriptors() {
        let (agent, server) = pair();
        send_fds(&agent, REQUEST_FDS);
        let fds = receive(&server).unwrap().expect("a request");
        for fd in &fds {
            let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
            assert_ne!(
                flags & libc::FD_CLOEXEC,
                0,
                "received descriptors are close-on-exec"
            );
        }
    }

    #[test]
    fn a_request_with_other_descriptors_is_refused_by_count() {
        let (agent, server) = pair();
        send_fds(&agent, 2);
        let err = receive(&server).expect_err("refused");
        assert!(err.contains("carried 2 descriptors, not 6"), "{err}");
    }

    #[test]
    fn the_agent_closing_its_end_stops_the_server() {
        let (agent, server) = pair();
        drop(agent);
        assert!(receive(&server).unwrap().is_none());
    }
}
