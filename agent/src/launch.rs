//! Starting a container's init process in new namespaces or a container's exec server
//! ([`launch`]), and an exec process through that server ([`request_exec`]).
//!
//! The agent is multi-threaded, so the child of clone(2) may only make async-signal-safe
//! calls: it moves its descriptors into place and executes this binary again as
//! `__container-init` or `__exec-server`, which does the real work single-threaded.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use nix::fcntl::OFlag;
use nix::sys::socket::{recv, sendmsg, ControlMessage, MsgFlags};
use nix::unistd::pipe2;

use crate::exec_server::REQUEST_FDS;
use crate::helper_fds::{REQUESTS_FD, SPEC_FD, START_FD, STATUS_FD};
use crate::init_spec::ProcessSpec;
use crate::{Error, CONTAINER_INIT_ARG, EXEC_SERVER_ARG};

/// The container's ends of its stdio, already opened (pipes or `/dev/null`).
pub struct ChildStdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The agent's ends of a launched container init.
pub struct Launched {
    /// Write one byte to start the process; close to make it give up.
    pub start: OwnedFd,
    /// Readiness and exec errors (see `container_init`).
    pub status: OwnedFd,
}

/// What to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helper {
    /// `__container-init` in new mount, PID, UTS and IPC namespaces.
    ContainerInit,
    /// `__container-init` in new mount, UTS and IPC namespaces: it joins the pod's PID
    /// namespace itself (see `container_init`).
    ContainerInitInPodPidNamespace,
    /// `__exec-server` in the agent's namespaces (it joins the container's itself), with
    /// its end of the request socket.
    ExecServer(std::os::fd::RawFd),
}

impl Helper {
    /// The agent's argument that makes the re-executed agent this helper.
    fn arg(&self) -> &'static str {
        match self {
            Helper::ContainerInit | Helper::ContainerInitInPodPidNamespace => CONTAINER_INIT_ARG,
            Helper::ExecServer(_) => EXEC_SERVER_ARG,
        }
    }

    /// The namespaces the helper is cloned into.
    fn clone_flags(&self) -> libc::c_int {
        match self {
            Helper::ContainerInit => {
                libc::CLONE_NEWNS
                    | libc::CLONE_NEWPID
                    | libc::CLONE_NEWUTS
                    | libc::CLONE_NEWIPC
                    | libc::SIGCHLD
            }
            Helper::ContainerInitInPodPidNamespace => {
                libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC | libc::SIGCHLD
            }
            Helper::ExecServer(_) => libc::SIGCHLD,
        }
    }
}

/// Clones a child with `flags` that moves `sources` (at most 7) to its fds 0.. and executes
/// `exe` with `argv` and `envp`; returns its PID.
fn clone_exec(
    flags: libc::c_int,
    sources: &[RawFd],
    exe: &CString,
    argv: &[*const libc::c_char; 3],
    envp: &[*const libc::c_char; 1],
) -> Result<i32, Error> {
    let mut moved = [0; 7];
    assert!(sources.len() <= moved.len(), "a helper gets at most 7 fds");
    // SAFETY: clone without CLONE_VM and with a null stack behaves like fork(2). The child
    // only calls async-signal-safe functions (fcntl, dup2, execve, _exit) on data the
    // parent prepared, then replaces its image.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: see above; every pointer refers to memory that stays valid until execve.
        unsafe {
            for (i, src) in sources.iter().enumerate() {
                moved[i] = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 100);
                if moved[i] < 0 {
                    libc::_exit(120);
                }
            }
            for (target, src) in moved.iter().take(sources.len()).enumerate() {
                if libc::dup2(*src, target as i32) < 0 {
                    libc::_exit(121);
                }
            }
            libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(122);
        }
    }
    if pid < 0 {
        return Err(Error::io(
            "clone container init",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(pid as i32)
}

/// The three pipes between the agent and a helper it launches: the helper's spec, its start
/// signal, and its status.
struct HelperPipes {
    spec: (OwnedFd, OwnedFd),
    start: (OwnedFd, OwnedFd),
    status: (OwnedFd, OwnedFd),
}

impl HelperPipes {
    fn new() -> Result<Self, Error> {
        let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::io("pipe", e.into()));
        Ok(HelperPipes {
            spec: pipe()?,
            start: pipe()?,
            status: pipe()?,
        })
    }

    /// The helper's fds 0 to 5: its stdio, then the read ends of its spec and start pipes
    /// and the write end of its status pipe.
    fn child_fds(&self, stdio: &ChildStdio) -> [RawFd; REQUEST_FDS] {
        [
            stdio.stdin.as_raw_fd(),
            stdio.stdout.as_raw_fd(),
            stdio.stderr.as_raw_fd(),
            self.spec.0.as_raw_fd(),
            self.start.0.as_raw_fd(),
            self.status.1.as_raw_fd(),
        ]
    }

    /// Once the helper has its ends: the agent's (the spec's writer, and the start's
    /// writer and the status's reader as [`Launched`]); the helper's are closed.
    fn keep_agents_ends(self) -> (OwnedFd, Launched) {
        (
            self.spec.1,
            Launched {
                start: self.start.1,
                status: self.status.0,
            },
        )
    }
}

/// Clones a child running `helper`, calls `before_spec` with its PID (the child waits for
/// its spec: a container's init is put in its cgroup there, before it makes its cgroup
/// namespace), and sends it `spec` (serialized as JSON). Returns the child's PID (as seen by
/// the agent); a child whose `before_spec` failed is killed.
pub fn launch(
    helper: Helper,
    spec: &impl serde::Serialize,
    stdio: ChildStdio,
    before_spec: impl FnOnce(i32) -> Result<(), Error>,
) -> Result<(i32, Launched), Error> {
    let json = encode(spec)?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find own executable", e))?;
    let exe = CString::new(exe.as_os_str().as_bytes())
        .map_err(|_| Error::InvalidRequest("executable path has a NUL".into()))?;
    let arg0 = CString::new("vmlet-agent").unwrap();
    let arg1 = CString::new(helper.arg()).unwrap();
    let argv = [arg0.as_ptr(), arg1.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];

    let pipes = HelperPipes::new()?;
    let mut sources = pipes.child_fds(&stdio).to_vec();
    if let Helper::ExecServer(requests) = helper {
        sources.push(requests);
    }
    debug_assert_eq!((SPEC_FD, START_FD, STATUS_FD, REQUESTS_FD), (3, 4, 5, 6));

    let pid = clone_exec(helper.clone_flags(), &sources, &exe, &argv, &envp)?;
    let (spec_w, launched) = pipes.keep_agents_ends();
    drop(stdio);
    if let Err(e) = before_spec(pid) {
        // Its spec pipe closes with this: it gives up, and is killed in case it does not.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        return Err(e);
    }
    std::fs::File::from(spec_w)
        .write_all(&json)
        .map_err(|e| Error::io("send init spec", e))?;
    Ok((pid, launched))
}

/// Asks a container's exec server (the agent's end of its request socket, with a receive
/// timeout) to clone an exec process with `stdio` and sends that process `spec`. Returns
/// the process's PID (as seen by the agent).
pub fn request_exec(
    id: &str,
    server: &OwnedFd,
    spec: &ProcessSpec,
    stdio: ChildStdio,
) -> Result<(i32, Launched), Error> {
    let json = encode(spec)?;
    let pipes = HelperPipes::new()?;
    let fds: [RawFd; REQUEST_FDS] = pipes.child_fds(&stdio);
    let iov = [std::io::IoSlice::new(b"x")];
    let rights = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(server.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None)
        .map_err(|e| Error::io("send a request to the exec server", e.into()))?;
    let (spec_w, launched) = pipes.keep_agents_ends();
    drop(stdio);
    let mut answer = [0u8; 4096];
    let setup = |message: String| Error::ContainerSetup {
        id: id.into(),
        message,
    };
    let n = match recv(server.as_raw_fd(), &mut answer, MsgFlags::empty()) {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN) => {
            return Err(setup("the exec server did not answer in time".into()))
        }
        Err(e) => return Err(Error::io("read the exec server's answer", e.into())),
    };
    let answer = String::from_utf8_lossy(&answer[..n]);
    let pid = match (answer.strip_prefix('P'), answer.strip_prefix('E')) {
        (Some(pid), _) => pid.parse::<i32>().ok().filter(|p| *p > 0),
        (_, Some(message)) => return Err(setup(format!("exec server: {message}"))),
        _ => None,
    }
    .ok_or_else(|| setup(format!("the exec server answered {answer:?}")))?;
    std::fs::File::from(spec_w)
        .write_all(&json)
        .map_err(|e| Error::io("send exec spec", e))?;
    Ok((pid, launched))
}

fn encode(spec: &impl serde::Serialize) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(spec).map_err(|e| Error::InvalidRequest(format!("encode spec: {e}")))
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::thread;

    use nix::sys::socket::{
        send, setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType,
    };
    use nix::sys::time::{TimeVal, TimeValLike};

    use super::*;
    use crate::exec_server::receive;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn null_stdio() -> ChildStdio {
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        ChildStdio {
            stdin: null(),
            stdout: null(),
            stderr: null(),
        }
    }

    fn spec() -> ProcessSpec {
        ProcessSpec {
            args: vec!["true".into()],
            env: vec!["PATH=/bin".into()],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            additional_gids: vec![],
            rlimits: vec![],
            terminal: false,
            capabilities: None,
            no_new_privileges: false,
            seccomp: None,
        }
    }

    /// Answers one request with `answer`, then returns what arrived on its spec pipe.
    fn fake_server(server: OwnedFd, answer: &'static str) -> thread::JoinHandle<Vec<u8>> {
        thread::spawn(move || {
            let fds = receive(&server).unwrap().expect("a request");
            send(server.as_raw_fd(), answer.as_bytes(), MsgFlags::empty()).unwrap();
            let [_, _, _, spec, _, _] = fds;
            let mut json = Vec::new();
            std::fs::File::from(spec).read_to_end(&mut json).unwrap();
            json
        })
    }

    #[test]
    fn an_exec_gets_its_pid_from_the_server_then_its_spec() {
        let (agent, server) = pair();
        let fake = fake_server(server, "P4242");
        let (pid, _launched) = request_exec("c/e", &agent, &spec(), null_stdio()).unwrap();
        assert_eq!(pid, 4242);
        let sent: ProcessSpec = serde_json::from_slice(&fake.join().unwrap()).unwrap();
        assert_eq!(sent, spec());
    }

    #[test]
    fn a_server_error_names_the_exec() {
        let (agent, server) = pair();
        let fake = fake_server(server, "Eclone: out of memory");
        let err = request_exec("c/e", &agent, &spec(), null_stdio())
            .err()
            .expect("an error");
        assert_eq!(
            err.to_string(),
            "container c/e: exec server: clone: out of memory"
        );
        assert!(fake.join().unwrap().is_empty(), "no spec after a failure");
    }

    #[test]
    fn a_garbled_answer_is_an_error() {
        let (agent, server) = pair();
        let _fake = fake_server(server, "P-1");
        let err = request_exec("c/e", &agent, &spec(), null_stdio())
            .err()
            .expect("an error");
        assert!(err.to_string().contains("answered \"P-1\""), "{err}");
    }

    #[test]
    fn a_silent_server_times_out() {
        let (agent, _server) = pair();
        setsockopt(&agent, sockopt::ReceiveTimeout, &TimeVal::milliseconds(100)).unwrap();
        let err = request_exec("c/e", &agent, &spec(), null_stdio())
            .err()
            .expect("an error");
        assert!(err.to_string().contains("did not answer in time"), "{err}");
    }
}
