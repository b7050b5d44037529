//! The side of the launch handshake that a helper (`__container-init`, `__exec-server`, or
//! an exec process cloned by the latter) runs: fd 3 carries its spec as JSON, fd 4 the
//! start byte (EOF: give up), fd 5 the status (`R` when ready, `E<message>` on failure;
//! close-on-exec, so EOF after a good execve), preceded by `P<pid>\n` when the helper
//! handed over to a clone of itself. An exec server gets its request socket as fd 6.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::unistd::pipe2;
use serde::de::DeserializeOwned;

pub const SPEC_FD: i32 = 3;
pub const START_FD: i32 = 4;
pub const STATUS_FD: i32 = 5;
pub const REQUESTS_FD: i32 = 6;

/// The helper's end of the handshake.
pub struct Handshake {
    status: File,
}

impl Handshake {
    /// Takes over fds 3-5 (set up by [`crate::launch`]) and marks them close-on-exec.
    pub fn take() -> Self {
        for fd in [SPEC_FD, START_FD, STATUS_FD] {
            // SAFETY: launch.rs hands these descriptors over open; only their flag changes.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
        }
        // SAFETY: launch.rs hands this descriptor over open and owned by nobody else.
        Self {
            status: unsafe { File::from_raw_fd(STATUS_FD) },
        }
    }

    /// Reads the spec; `what` names it in errors.
    pub fn read_spec<T: DeserializeOwned>(&self, what: &str) -> Result<T, String> {
        // SAFETY: launch.rs hands this descriptor over open and owned by nobody else.
        let mut file = unsafe { File::from_raw_fd(SPEC_FD) };
        let mut json = Vec::new();
        file.read_to_end(&mut json)
            .map_err(|e| format!("read {what}: {e}"))?;
        serde_json::from_slice(&json).map_err(|e| format!("parse {what}: {e}"))
    }

    /// Reports ready, then waits for the start byte; exits quietly if the agent gave up.
    pub fn ready_then_wait_for_start(&mut self) {
        if self.status.write_all(b"R").is_err() {
            std::process::exit(1);
        }
        // SAFETY: launch.rs hands this descriptor over open and owned by nobody else.
        let mut start = unsafe { File::from_raw_fd(START_FD) };
        let mut byte = [0u8; 1];
        match start.read(&mut byte) {
            Ok(1) => {}
            _ => std::process::exit(0),
        }
    }

    /// Reports ready and lets go of the start and status pipes (the exec server, which
    /// waits for requests instead of a start byte). Exits if the agent is gone.
    pub fn ready(self) {
        let mut status = self.status;
        if status.write_all(b"R").is_err() {
            std::process::exit(1);
        }
        // SAFETY: launch.rs hands this descriptor over open and owned by nobody else.
        drop(unsafe { File::from_raw_fd(START_FD) });
    }

    /// Writes raw bytes on the status pipe (a handed-over helper's `P<pid>` line).
    pub fn report(&mut self, bytes: &[u8]) {
        let _ = self.status.write_all(bytes);
    }

    /// Clones this helper with CLONE_PARENT and returns in the clone, which is then a child
    /// of the agent (its reaper collects it) and a member of the PID namespace the helper
    /// joined for its children. The helper reports `P<pid>\n` and exits; the clone waits
    /// for that before it returns, so the PID is on the status pipe before anything else.
    pub fn continue_as_agent_child(&mut self) {
        let (go_r, go_w) = match pipe2(OFlag::O_CLOEXEC) {
            Ok(p) => p,
            Err(e) => self.fail(&format!("pipe: {e}"), 1),
        };
        // SAFETY: helpers are single-threaded, so the child (fork semantics: no CLONE_VM,
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
            drop(go_w);
            let mut rest = Vec::new();
            let _ = File::from(go_r).read_to_end(&mut rest);
            return;
        }
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            self.fail(&format!("clone: {e}"), 1);
        }
        self.report(format!("P{pid}\n").as_bytes());
        std::process::exit(0)
    }

    /// Reports `message` as the failure and exits with `code`.
    pub fn fail(&mut self, message: &str, code: i32) -> ! {
        let _ = self.status.write_all(format!("E{message}").as_bytes());
        std::process::exit(code)
    }
}
