//! One process of a task, its init or an exec, and the rules of its life:
//!
//! ```text
//! Created --start--> Starting --agent started it--> Running <--pause/resume--> Paused
//!    ^                  |                              |
//!    +--agent silent----+--agent refused / VM ended--> Stopped <--exit--------+
//! ```
//!
//! Starting is reported as CREATED, so RUNNING means the process really started. The exit
//! is recorded once (the VM's end and the process's own exit can race); a process that is
//! starting or running cannot be deleted. An exec reports PAUSED while its task is paused
//! (the guest freezes the container's whole cgroup), as runc's shim does.

use std::sync::Mutex;

use containerd_shim::api;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::sync::watch;

use crate::guest::stdio::{Copies, StdioPaths};
use crate::guest::ProcessId;
use crate::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Created,
    /// Claimed by a start whose agent call has not answered yet.
    Starting,
    Running,
    Paused,
    Stopped,
}

/// A recorded exit.
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    pub status: u32,
    pub at: Timestamp,
}

pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

pub struct Process {
    pub id: ProcessId,
    /// The PID containerd is given: the pod's QEMU (see `Vm::host_pid`).
    pub pid: u32,
    pub stdio: StdioPaths,
    pub terminal: bool,
    phase: Mutex<Phase>,
    exit: watch::Sender<Option<Exit>>,
    /// The copies between containerd's FIFOs and the guest's streams.
    pub copies: tokio::sync::Mutex<Option<Copies>>,
}

impl Process {
    pub fn new(id: ProcessId, pid: u32, stdio: StdioPaths, terminal: bool, copies: Copies) -> Self {
        Self {
            id,
            pid,
            stdio,
            terminal,
            phase: Mutex::new(Phase::Created),
            exit: watch::channel(None).0,
            copies: tokio::sync::Mutex::new(Some(copies)),
        }
    }

    pub fn is_init(&self) -> bool {
        self.id.exec_id.is_empty()
    }

    /// `task ID` or `exec E of task ID`, for messages.
    pub fn name(&self) -> String {
        if self.is_init() {
            format!("task {}", self.id.container_id)
        } else {
            format!("exec {} of task {}", self.id.exec_id, self.id.container_id)
        }
    }

    /// The id containerd's events and state give the process: the task's or the exec's.
    pub fn event_id(&self) -> &str {
        if self.is_init() {
            &self.id.container_id
        } else {
            &self.id.exec_id
        }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap()
    }

    pub fn exited(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }

    /// Follows the recorded exit (None until there is one).
    pub fn exit_watch(&self) -> watch::Receiver<Option<Exit>> {
        self.exit.subscribe()
    }

    /// Claims a start: Created -> Starting. Any other phase is FAILED_PRECONDITION, so a
    /// second start fails instead of racing the first.
    pub fn claim_start(&self) -> Result<(), Error> {
        let mut phase = self.phase.lock().unwrap();
        if *phase != Phase::Created {
            return Err(Error::FailedPrecondition(format!(
                "{} is {:?}, not Created",
                self.name(),
                *phase
            )));
        }
        *phase = Phase::Starting;
        Ok(())
    }

    /// The agent started it: Starting -> Running (an exit recorded meanwhile stays).
    pub fn started(&self) {
        self.settle(Phase::Starting, Phase::Running);
    }

    /// The agent did not answer the start: Starting -> Created, to be started again.
    pub fn start_abandoned(&self) {
        self.settle(Phase::Starting, Phase::Created);
    }

    /// FAILED_PRECONDITION unless the process is in `expected`.
    pub fn expect(&self, expected: Phase) -> Result<(), Error> {
        let now = self.phase();
        if now != expected {
            return Err(Error::FailedPrecondition(format!(
                "{} is {now:?}, not {expected:?}",
                self.name()
            )));
        }
        Ok(())
    }

    /// Moves `from` -> `to` if the process is still in `from` (it may have exited meanwhile:
    /// a frozen process cannot, a thawed one can). Whether it moved.
    pub fn settle(&self, from: Phase, to: Phase) -> bool {
        let mut phase = self.phase.lock().unwrap();
        if *phase != from {
            return false;
        }
        *phase = to;
        true
    }

    /// Whether a start is in flight or the process runs (it cannot be deleted then).
    pub fn is_live(&self) -> bool {
        matches!(
            self.phase(),
            Phase::Starting | Phase::Running | Phase::Paused
        )
    }

    /// FAILED_PRECONDITION while the process is live.
    pub fn check_deletable(&self) -> Result<(), Error> {
        if self.is_live() {
            return Err(Error::FailedPrecondition(format!(
                "{} is running; kill it first",
                self.name()
            )));
        }
        Ok(())
    }

    /// Records the exit once: Stopped with `status`. None when an exit was already
    /// recorded (the VM's end and the process's own exit can race).
    pub fn record_exit(&self, status: u32) -> Option<Exit> {
        let mut phase = self.phase.lock().unwrap();
        if self.exit.borrow().is_some() {
            return None;
        }
        let exit = Exit { status, at: now() };
        *phase = Phase::Stopped;
        self.exit.send_replace(Some(exit.clone()));
        Some(exit)
    }

    /// The status containerd is told, given whether the process's task is paused.
    pub fn status(&self, task_paused: bool) -> api::Status {
        match self.phase() {
            Phase::Created | Phase::Starting => api::Status::CREATED,
            Phase::Running if task_paused => api::Status::PAUSED,
            Phase::Running => api::Status::RUNNING,
            Phase::Paused => api::Status::PAUSED,
            Phase::Stopped => api::Status::STOPPED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init() -> Process {
        Process::new(
            ProcessId::init("t"),
            1,
            StdioPaths::default(),
            false,
            Copies::default(),
        )
    }

    fn exec() -> Process {
        Process::new(
            ProcessId::exec("t", "e"),
            1,
            StdioPaths::default(),
            false,
            Copies::default(),
        )
    }

    #[test]
    fn an_exit_is_recorded_once_and_stops_the_process() {
        let p = init();
        p.claim_start().unwrap();
        p.started();
        assert!(p.is_live());
        let first = p.record_exit(137).expect("first exit recorded");
        assert_eq!(first.status, 137);
        assert_eq!(p.phase(), Phase::Stopped);
        assert!(!p.is_live());
        // The process's own exit arriving after the VM's end changes nothing.
        assert!(p.record_exit(0).is_none());
        assert_eq!(p.exited().unwrap().status, 137);
    }

    #[test]
    fn a_process_starts_once() {
        let p = init();
        p.claim_start().unwrap();
        let second = p.claim_start().unwrap_err();
        assert_eq!(second.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(
            second.message().contains("Starting"),
            "{}",
            second.message()
        );
        p.started();
        assert!(p.claim_start().is_err());
        p.record_exit(0);
        assert!(p.claim_start().is_err(), "a stopped process started again");
    }

    #[test]
    fn a_start_in_flight_is_live_but_reported_created() {
        let p = init();
        assert!(!p.is_live());
        p.claim_start().unwrap();
        assert!(p.is_live());
        assert!(p.check_deletable().is_err());
        assert_eq!(p.status(false), api::Status::CREATED);
        assert!(p.exited().is_none());
    }

    #[test]
    fn an_unanswered_start_can_be_tried_again() {
        let p = init();
        p.claim_start().unwrap();
        p.start_abandoned();
        assert_eq!(p.phase(), Phase::Created);
        p.claim_start().unwrap();
    }

    #[test]
    fn an_exit_during_the_start_wins() {
        let p = init();
        p.claim_start().unwrap();
        p.record_exit(1);
        p.started();
        assert_eq!(p.phase(), Phase::Stopped);
        p.start_abandoned();
        assert_eq!(p.phase(), Phase::Stopped);
    }

    #[test]
    fn only_a_stopped_or_never_started_process_can_be_deleted() {
        let p = init();
        p.check_deletable().unwrap();
        p.claim_start().unwrap();
        p.started();
        let e = p.check_deletable().unwrap_err();
        assert_eq!(e.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(e.message().contains("task t"), "{}", e.message());
        assert!(p.settle(Phase::Running, Phase::Paused));
        assert!(p.check_deletable().is_err(), "a paused process deleted");
        p.record_exit(0);
        p.check_deletable().unwrap();
    }

    #[test]
    fn pause_moves_only_from_the_expected_phase() {
        let p = init();
        assert!(p.expect(Phase::Running).is_err());
        p.claim_start().unwrap();
        p.started();
        p.expect(Phase::Running).unwrap();
        assert!(p.settle(Phase::Running, Phase::Paused));
        assert_eq!(p.status(false), api::Status::PAUSED);
        assert!(!p.settle(Phase::Running, Phase::Paused));
        assert!(p.settle(Phase::Paused, Phase::Running));
        p.record_exit(0);
        assert!(
            !p.settle(Phase::Running, Phase::Paused),
            "a stopped process paused"
        );
    }

    #[test]
    fn an_exec_of_a_paused_task_is_paused() {
        let e = exec();
        assert_eq!(e.status(true), api::Status::CREATED);
        e.claim_start().unwrap();
        e.started();
        assert_eq!(e.status(false), api::Status::RUNNING);
        assert_eq!(e.status(true), api::Status::PAUSED);
        e.record_exit(0);
        assert_eq!(e.status(true), api::Status::STOPPED);
        assert_eq!(e.event_id(), "e");
        assert_eq!(e.name(), "exec e of task t");
    }
}
