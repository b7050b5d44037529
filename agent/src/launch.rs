//! Starting a container's init process in new namespaces, or an exec process's helper.
//!
//! The agent is multi-threaded, so the child of clone(2) may only make async-signal-safe
//! calls: it moves its descriptors into place and executes this binary again as
//! `__container-init` or `__exec-init`, which does the real work single-threaded.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;

use crate::helper_fds::{SPEC_FD, START_FD, STATUS_FD};
use crate::{Error, CONTAINER_INIT_ARG, EXEC_INIT_ARG};

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
    /// `__exec-init` in the agent's namespaces (it joins the container's itself).
    ExecInit,
}

/// Clones a child running `helper` and sends it `spec` (serialized as JSON). Returns the
/// child's PID (as seen by the agent).
pub fn launch(
    helper: Helper,
    spec: &impl serde::Serialize,
    stdio: ChildStdio,
) -> Result<(i32, Launched), Error> {
    let json = serde_json::to_vec(spec)
        .map_err(|e| Error::InvalidRequest(format!("encode init spec: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find own executable", e))?;
    let exe = CString::new(exe.as_os_str().as_bytes())
        .map_err(|_| Error::InvalidRequest("executable path has a NUL".into()))?;
    let arg0 = CString::new("vmlet-agent").unwrap();
    let arg1 = CString::new(match helper {
        Helper::ContainerInit | Helper::ContainerInitInPodPidNamespace => CONTAINER_INIT_ARG,
        Helper::ExecInit => EXEC_INIT_ARG,
    })
    .unwrap();
    let argv = [arg0.as_ptr(), arg1.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];

    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::io("pipe", e.into()));
    let (spec_r, spec_w) = pipe()?;
    let (start_r, start_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let sources = [
        stdio.stdin.as_raw_fd(),
        stdio.stdout.as_raw_fd(),
        stdio.stderr.as_raw_fd(),
        spec_r.as_raw_fd(),
        start_r.as_raw_fd(),
        status_w.as_raw_fd(),
    ];
    debug_assert_eq!((SPEC_FD, START_FD, STATUS_FD), (3, 4, 5));

    let flags = match helper {
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
        Helper::ExecInit => libc::SIGCHLD,
    };
    // SAFETY: clone without CLONE_VM and with a null stack behaves like fork(2). The child
    // only calls async-signal-safe functions (fcntl, dup2, execve, _exit) on data prepared
    // above, then replaces its image.
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
            let mut moved = [0; 6];
            for (i, src) in sources.iter().enumerate() {
                moved[i] = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 100);
                if moved[i] < 0 {
                    libc::_exit(120);
                }
            }
            for (target, src) in moved.iter().enumerate() {
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
    drop((spec_r, start_r, status_w, stdio));
    let mut spec_w = std::fs::File::from(spec_w);
    spec_w
        .write_all(&json)
        .map_err(|e| Error::io("send init spec", e))?;
    Ok((
        pid as i32,
        Launched {
            start: start_w,
            status: status_r,
        },
    ))
}
