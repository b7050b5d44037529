//! PID 1 reaps every child. Exit statuses of tracked processes go to their watchers; the
//! rest (orphans re-parented to PID 1) are collected and dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// How many exits of not-yet-tracked PIDs are remembered.
const MAX_UNCLAIMED: usize = 1024;

/// Exit status as a shell reports it: the code, or 128 + the signal number.
pub type ExitStatus = u32;

#[derive(Default)]
struct State {
    watchers: HashMap<i32, watch::Sender<Option<ExitStatus>>>,
    unclaimed: HashMap<i32, ExitStatus>,
}

#[derive(Default)]
pub struct Reaper {
    state: Mutex<State>,
}

impl Reaper {
    /// Starts a process with `spawn` (which returns its PID) and tracks it. The lock is held
    /// across the spawn, so an exit reaped in between is still delivered.
    pub fn track<T, E>(
        &self,
        spawn: impl FnOnce() -> Result<(i32, T), E>,
    ) -> Result<(i32, T, watch::Receiver<Option<ExitStatus>>), E> {
        let mut state = self.state.lock().unwrap();
        let (pid, value) = spawn()?;
        let initial = state.unclaimed.remove(&pid);
        let (tx, rx) = watch::channel(initial);
        state.watchers.insert(pid, tx);
        Ok((pid, value, rx))
    }

    /// Tracks a PID that became the agent's child without being spawned by it (an exec
    /// process, cloned with CLONE_PARENT by its helper). An exit already reaped is delivered.
    pub fn adopt(&self, pid: i32) -> watch::Receiver<Option<ExitStatus>> {
        let mut state = self.state.lock().unwrap();
        let initial = state.unclaimed.remove(&pid);
        let (tx, rx) = watch::channel(initial);
        if initial.is_none() {
            state.watchers.insert(pid, tx);
        }
        rx
    }

    fn record(&self, pid: i32, status: ExitStatus) {
        let mut state = self.state.lock().unwrap();
        match state.watchers.remove(&pid) {
            Some(tx) => {
                tx.send_replace(Some(status));
            }
            None => {
                if state.unclaimed.len() >= MAX_UNCLAIMED {
                    state.unclaimed.clear();
                }
                state.unclaimed.insert(pid, status);
            }
        }
    }

    /// Reaps children for as long as the agent runs.
    pub async fn run(self: Arc<Self>) {
        let mut sigchld = match signal(SignalKind::child()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot watch SIGCHLD: {e}");
                return;
            }
        };
        loop {
            self.reap_all();
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    }

    fn reap_all(&self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.record(pid.as_raw(), code as u32),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.record(pid.as_raw(), 128 + sig as u32)
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) => {}
                Err(Errno::EINTR) => {}
                Err(e) => {
                    log::warn!("waitpid: {e}");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_before_tracking_is_delivered() {
        let reaper = Reaper::default();
        reaper.record(42, 7);
        let (_, (), rx) = reaper.track(|| Ok::<_, ()>((42, ()))).unwrap();
        assert_eq!(*rx.borrow(), Some(7));
    }

    #[test]
    fn adopted_pid_gets_its_exit_before_or_after() {
        let reaper = Reaper::default();
        reaper.record(50, 3);
        assert_eq!(*reaper.adopt(50).borrow(), Some(3));
        let rx = reaper.adopt(51);
        assert_eq!(*rx.borrow(), None);
        reaper.record(51, 0);
        assert_eq!(*rx.borrow(), Some(0));
    }

    #[test]
    fn exit_after_tracking_is_delivered() {
        let reaper = Reaper::default();
        let (_, (), rx) = reaper.track(|| Ok::<_, ()>((43, ()))).unwrap();
        assert_eq!(*rx.borrow(), None);
        reaper.record(43, 137);
        assert_eq!(*rx.borrow(), Some(137));
    }
}
