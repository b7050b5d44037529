//! An exec process's start, as `vmlet-agent __exec-init`: joins the namespaces and the root
//! of a container's init, then clones the process itself with CLONE_PARENT, so that it runs
//! inside the container's PID namespace as a child of the agent (whose reaper collects its
//! exit like any other).
//!
//! File descriptors set up by [`crate::launch`]: 0-2 stdio, 3 the [`ExecSpec`] as JSON, 4 the
//! start pipe (one byte means "start", EOF means "give up"), 5 the status pipe: `R` once the
//! namespaces are joined, then `P<pid>\n` with the process's guest PID, then `E<message>` if
//! its execve failed; EOF once it executed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::sched::{setns, CloneFlags};
use nix::unistd::{chdir, chroot, fchdir, pipe2};

use crate::become_process::become_process;
use crate::container_init::{SPEC_FD, START_FD, STATUS_FD};
use crate::init_spec::ExecSpec;

/// The namespaces an exec process shares with its container's init. The mount namespace
/// comes last: after it, the init's /proc entries are out of reach.
const NAMESPACES: &[&str] = &["ipc", "uts", "pid", "mnt"];

/// Entry point of `vmlet-agent __exec-init`. Never returns.
pub fn run() -> ! {
    for fd in [SPEC_FD, START_FD, STATUS_FD] {
        let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
    // SAFETY: launch.rs hands these descriptors over open and owned by nobody else.
    let mut status = unsafe { File::from_raw_fd(STATUS_FD) };
    let spec = match read_spec().and_then(|spec| join(&spec).map(|()| spec)) {
        Ok(spec) => spec,
        Err(message) => fail(&mut status, &message, 1),
    };
    if status.write_all(b"R").is_err() {
        std::process::exit(1);
    }
    // SAFETY: as above.
    let mut start = unsafe { File::from_raw_fd(START_FD) };
    let mut byte = [0u8; 1];
    match start.read(&mut byte) {
        Ok(1) => {}
        _ => std::process::exit(0),
    }
    drop(start);
    // The child waits for this pipe's EOF, so that its PID is on the status pipe before
    // any error message of its own.
    let (go_r, go_w) = match pipe2(OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => fail(&mut status, &format!("pipe: {e}"), 1),
    };
    // SAFETY: this process is single-threaded, so the child (fork semantics: no CLONE_VM,
    // null stack) may run ordinary code before it replaces its image.
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
        let message = become_process(&spec.process);
        fail(&mut status, &message, 127);
    }
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        fail(&mut status, &format!("clone: {e}"), 1);
    }
    let _ = status.write_all(format!("P{pid}\n").as_bytes());
    std::process::exit(0)
}

fn fail(status: &mut File, message: &str, code: i32) -> ! {
    let _ = status.write_all(format!("E{message}").as_bytes());
    std::process::exit(code)
}

fn read_spec() -> Result<ExecSpec, String> {
    // SAFETY: launch.rs hands this descriptor over open and owned by nobody else.
    let mut file = unsafe { File::from_raw_fd(SPEC_FD) };
    let mut json = Vec::new();
    file.read_to_end(&mut json)
        .map_err(|e| format!("read exec spec: {e}"))?;
    serde_json::from_slice(&json).map_err(|e| format!("parse exec spec: {e}"))
}

/// Enters the init's namespaces and root directory.
fn join(spec: &ExecSpec) -> Result<(), String> {
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
    fchdir(root.as_raw_fd()).map_err(|e| format!("enter the container's root: {e}"))?;
    chroot(".").map_err(|e| format!("chroot: {e}"))?;
    chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}
