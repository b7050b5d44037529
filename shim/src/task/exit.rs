//! The exit statuses containerd is told, and when: the process's own, or a status that
//! says what the shim knows when the guest cannot tell.

use std::time::Duration;

use crate::guest::GuestExit;
pub use crate::vm::pod_vm::VM_ENDED_STATUS;
use crate::Error;

use super::process::{now, Exit, Process};

/// Exit status of a process whose pod's agent connection broke while the VM still ran:
/// its real end cannot be known.
pub const AGENT_LOST_STATUS: u32 = 255;
/// How long a broken agent connection waits for QEMU's end to be seen.
pub const VM_END_GRACE: Duration = Duration::from_secs(1);
/// How long the agent may take to report the exit of a process whose start it refused.
pub const REFUSED_START_EXIT: Duration = Duration::from_secs(5);
/// How long the guest has to report the end of a pod's sandbox after SIGKILL before the
/// shim ends the VM itself (the guest may not be trusted to obey).
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long the shim waits for a process's output to drain after it exited.
pub const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// How the wait for a started process ended.
#[derive(Debug)]
pub enum Waited {
    /// The agent reported the exit.
    Exited(GuestExit),
    /// The VM ended first.
    VmEnded,
    /// The agent's connection failed; whether the VM ended within [`VM_END_GRACE`].
    AgentFailed { error: Error, vm_ended: bool },
}

/// What a finished wait means: the status to record, and whether the OOM killer had a
/// hand in it (TaskOOM goes out before TaskExit then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub status: u32,
    pub oom_killed: bool,
    /// The VM ended under the process (logged unless the shim stopped it).
    pub vm_ended: bool,
}

pub fn outcome(waited: &Waited) -> Outcome {
    let (status, oom_killed, vm_ended) = match waited {
        Waited::Exited(exit) => (exit.status, exit.oom_killed, false),
        Waited::VmEnded | Waited::AgentFailed { vm_ended: true, .. } => {
            (VM_ENDED_STATUS, false, true)
        }
        Waited::AgentFailed {
            vm_ended: false, ..
        } => (AGENT_LOST_STATUS, false, false),
    };
    Outcome {
        status,
        oom_killed,
        vm_ended,
    }
}

/// How a start the agent did not carry out ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStart {
    /// The VM ended: the process is finished with [`VM_ENDED_STATUS`].
    VmEnded,
    /// The agent refused it and reported the process's end: finished with that status.
    Refused { status: u32 },
    /// Nothing is known (the agent did not answer, or did not report an exit): back to
    /// Created.
    Unknown,
}

/// `vm_ended`: the VM has ended (or did within [`VM_END_GRACE`] of a broken connection);
/// `refused_exit`: the status the agent reported after refusing the start.
pub fn failed_start(vm_ended: bool, refused_exit: Option<u32>) -> FailedStart {
    match (vm_ended, refused_exit) {
        (true, _) => FailedStart::VmEnded,
        (false, Some(status)) => FailedStart::Refused { status },
        (false, None) => FailedStart::Unknown,
    }
}

/// The exit a delete reports for a process: the recorded one; for one never started, 137
/// when its VM ended, else 0 (as runc's shim reports a created task's). A live process
/// cannot be deleted.
pub fn for_delete(process: &Process, vm_ended: bool) -> Result<Exit, Error> {
    process.check_deletable()?;
    Ok(process.exited().unwrap_or_else(|| Exit {
        status: if vm_ended { VM_ENDED_STATUS } else { 0 },
        at: now(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::stdio::{Copies, StdioPaths};
    use crate::guest::ProcessId;

    fn process() -> Process {
        Process::new(
            ProcessId::init("t"),
            1,
            StdioPaths::default(),
            false,
            Copies::default(),
        )
    }

    fn lost(vm_ended: bool) -> Waited {
        Waited::AgentFailed {
            error: Error::AgentLost("reset".into()),
            vm_ended,
        }
    }

    #[test]
    fn the_guests_status_is_passed_on() {
        let o = outcome(&Waited::Exited(GuestExit {
            status: 3,
            oom_killed: true,
        }));
        assert_eq!(
            o,
            Outcome {
                status: 3,
                oom_killed: true,
                vm_ended: false
            }
        );
    }

    #[test]
    fn a_vm_that_ended_under_the_process_is_137() {
        assert_eq!(outcome(&Waited::VmEnded).status, 137);
        assert!(outcome(&Waited::VmEnded).vm_ended);
        assert_eq!(outcome(&lost(true)).status, 137);
    }

    #[test]
    fn an_agent_lost_while_the_vm_runs_is_255() {
        let o = outcome(&lost(false));
        assert_eq!(o.status, 255);
        assert!(!o.vm_ended && !o.oom_killed);
    }

    #[test]
    fn a_failed_start_ends_the_process_only_when_something_says_so() {
        assert_eq!(failed_start(true, None), FailedStart::VmEnded);
        assert_eq!(failed_start(true, Some(1)), FailedStart::VmEnded);
        assert_eq!(
            failed_start(false, Some(127)),
            FailedStart::Refused { status: 127 }
        );
        assert_eq!(failed_start(false, None), FailedStart::Unknown);
    }

    #[test]
    fn a_never_started_process_is_deleted_with_0_or_137() {
        let p = process();
        assert_eq!(for_delete(&p, false).unwrap().status, 0);
        assert_eq!(for_delete(&p, true).unwrap().status, 137);
        p.record_exit(42);
        assert_eq!(for_delete(&p, true).unwrap().status, 42);
    }

    #[test]
    fn a_live_process_is_not_deleted() {
        let p = process();
        p.claim_start().unwrap();
        let e = for_delete(&p, false).unwrap_err();
        assert_eq!(e.code(), ttrpc::Code::FAILED_PRECONDITION);
    }
}
