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
use std::os::fd::AsFd;

use nix::sched::{setns, CloneFlags};
use nix::unistd::{chdir, chroot, fchdir};

use crate::become_process::become_process;
use crate::helper_fds::Handshake;
use crate::init_spec::ExecSpec;

/// The namespaces an exec process shares with its container's init. The mount namespace
/// comes last: after it, the init's /proc entries are out of reach.
const NAMESPACES: &[&str] = &["ipc", "uts", "pid", "mnt"];

/// Entry point of `vmlet-agent __exec-init`. Never returns.
pub fn run() -> ! {
    let mut handshake = Handshake::take();
    let spec = match handshake
        .read_spec::<ExecSpec>("exec spec")
        .and_then(|spec| join(&spec).map(|()| spec))
    {
        Ok(spec) => spec,
        Err(message) => handshake.fail(&message, 1),
    };
    handshake.ready_then_wait_for_start();
    handshake.continue_as_agent_child();
    let message = become_process(&spec.process);
    handshake.fail(&message, 127)
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
    fchdir(&root).map_err(|e| format!("enter the container's root: {e}"))?;
    chroot(".").map_err(|e| format!("chroot: {e}"))?;
    chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}
