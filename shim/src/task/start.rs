//! Starting a process, watching for its end, and killing it.

use std::sync::Arc;

use containerd_shim::api;
use containerd_shim_protos::events::task::{TaskExecStarted, TaskOOM, TaskStart};
use containerd_shim_protos::topics;

use super::exit::{self, FailedStart, Outcome, Waited, KILL_GRACE, OUTPUT_DRAIN};
use super::process::{Exit, Phase, Process};
use super::{TaskEntry, TaskService};
use crate::task::phases::Phases;
use crate::Error;

impl TaskService {
    pub(super) async fn start_task(
        self: &Arc<Self>,
        req: api::StartRequest,
    ) -> Result<api::StartResponse, Error> {
        let (task, process) = self.get(&req.id, &req.exec_id)?;
        let phases = Phases::start(format!("start {}", process.name()));
        process.claim_start()?;
        let guest_pid = match task.vm.guest().start_process(&process.id).await {
            Ok(pid) => pid,
            Err(e) => return Err(self.start_failed(&task, &process, e).await),
        };
        phases.mark("guest_start");
        process.started();
        log::info!("{}: started, guest PID {guest_pid}", process.name());
        if process.is_init() {
            crate::spec::hooks::run_logged(&task.hooks.poststart, &task.hook_state, "running")
                .await;
            phases.mark("poststart_hooks");
            self.publish(
                topics::TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: task.id.clone(),
                    pid: process.pid,
                    ..Default::default()
                }),
            );
        } else {
            self.publish(
                topics::TASK_EXEC_STARTED_EVENT_TOPIC,
                Box::new(TaskExecStarted {
                    container_id: task.id.clone(),
                    exec_id: process.id.exec_id.clone(),
                    pid: process.pid,
                    ..Default::default()
                }),
            );
        }
        phases.log();
        let pid = process.pid;
        let service = self.clone();
        tokio::spawn(async move { service.watch_exit(task, process).await });
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    /// Waits for the process's exit in the guest, lets its output drain, then records the
    /// exit and publishes TaskExit (TaskOOM before it when the OOM killer struck).
    async fn watch_exit(&self, task: Arc<TaskEntry>, process: Arc<Process>) {
        let waited = tokio::select! {
            r = task.vm.guest().wait_process(&process.id) => match r {
                Ok(exit) => Waited::Exited(exit),
                Err(error) => Waited::AgentFailed {
                    vm_ended: task.vm_ends_within_grace().await,
                    error,
                },
            },
            () = task.vm.ended() => Waited::VmEnded,
        };
        let Outcome {
            status,
            oom_killed,
            vm_ended,
        } = exit::outcome(&waited);
        let status = if vm_ended {
            task.vm_ended_under(&process)
        } else {
            status
        };
        if let Waited::AgentFailed {
            error,
            vm_ended: false,
        } = &waited
        {
            log::error!(
                "{}: the pod's agent cannot be reached any more ({}) while its VM runs: \
                 exit status {status}",
                process.name(),
                error.message()
            );
        }
        if oom_killed {
            // Before the exit, as runc's shim does: CRI then reports reason OOMKilled.
            self.publish(
                topics::TASK_OOM_EVENT_TOPIC,
                Box::new(TaskOOM {
                    container_id: task.id.clone(),
                    ..Default::default()
                }),
            );
        }
        if let Some(copies) = process.copies.lock().await.as_mut() {
            copies.close_stdin();
            if task.vm.has_ended() {
                copies.abort();
            } else if tokio::time::timeout(OUTPUT_DRAIN, copies.drain())
                .await
                .is_err()
            {
                // Something in the guest still holds the stream (a daemon the process left):
                // the FIFOs close now, or containerd would wait on them for ever.
                log::warn!(
                    "{}: output did not drain within {OUTPUT_DRAIN:?}; closing it",
                    process.name()
                );
                copies.abort();
            }
        }
        self.finish(&task, &process, status).await;
    }

    /// A start the agent did not carry out. When the agent refused it (an exec that failed,
    /// a setup step that failed) the process has ended in the guest, as runc's init does:
    /// its exit is recorded and published (the task is Stopped, kill and delete work). When
    /// the pod's VM ended under it, finished with [`exit::VM_ENDED_STATUS`]. Otherwise (the
    /// agent did not answer) back to Created.
    async fn start_failed(&self, task: &TaskEntry, process: &Process, e: Error) -> Error {
        // The agent's own refusal is not a broken connection: no need to wait for QEMU.
        let lost = matches!(e, Error::AgentLost(_));
        let vm_ended = task.vm.has_ended() || (lost && task.vm_ends_within_grace().await);
        let refused_exit = if vm_ended || lost {
            None
        } else {
            let wait = task.vm.guest().wait_process(&process.id);
            match tokio::time::timeout(exit::REFUSED_START_EXIT, wait).await {
                Ok(Ok(exit)) => Some(exit.status),
                _ => None,
            }
        };
        match exit::failed_start(vm_ended, refused_exit) {
            FailedStart::Refused { status } => {
                self.finish(task, process, status).await;
                e
            }
            FailedStart::Unknown => {
                process.start_abandoned();
                e
            }
            FailedStart::VmEnded => {
                self.finish(task, process, task.vm_ended_under(process))
                    .await;
                Error::FailedPrecondition(format!(
                    "start {}: the pod's VM stopped (QEMU exited)",
                    process.name()
                ))
            }
        }
    }

    /// Waits for a process's exit. A started process's watcher records it; one never
    /// started has none, so its exit is recorded here when the VM ends.
    pub(super) async fn wait(&self, id: &str, exec_id: &str) -> Result<Exit, Error> {
        let (task, process) = self.get(id, exec_id)?;
        let mut exit = process.exit_watch();
        loop {
            if let Some(exit) = exit.borrow_and_update().clone() {
                return Ok(exit);
            }
            tokio::select! {
                changed = exit.changed() => if changed.is_err() {
                    return Err(Error::Internal("task dropped while waiting".into()));
                },
                () = task.vm.ended(), if process.phase() == Phase::Created => {
                    self.finish(&task, &process, task.vm_ended_under(&process)).await;
                }
            }
        }
    }

    /// Signals a process. SIGKILL to the init of a task that owns its VM (a pod's sandbox)
    /// must work whatever the guest does: the VM ends when the guest did not report the
    /// init's end within [`KILL_GRACE`] (or refused the signal).
    pub(super) async fn kill(&self, req: api::KillRequest) -> Result<(), Error> {
        let (task, process) = self.get(&req.id, &req.exec_id)?;
        if process.exited().is_some() {
            return Err(Error::NotFound(format!(
                "process of {} already finished",
                process.name()
            )));
        }
        let signalled = task
            .vm
            .guest()
            .signal_process(&process.id, req.signal, req.all)
            .await;
        let kills_the_pod = req.signal == libc::SIGKILL as u32 && process.is_init() && task.owns_vm;
        if !kills_the_pod {
            return signalled;
        }
        if let Err(e) = &signalled {
            log::warn!(
                "{}: the agent did not take SIGKILL: {}",
                task.id,
                e.message()
            );
        }
        tokio::spawn(async move {
            let mut exit = process.exit_watch();
            let reported =
                tokio::time::timeout(KILL_GRACE, exit.wait_for(|e: &Option<Exit>| e.is_some()))
                    .await
                    .is_ok_and(|r| r.is_ok());
            if reported || task.vm.has_ended() {
                return;
            }
            log::warn!(
                "{}: the guest did not report the end of the pod's sandbox within \
                 {KILL_GRACE:?} of SIGKILL: ending its VM",
                task.id
            );
            if let Err(e) = task.vm.kill().await {
                log::error!("{}: end the VM: {}", task.id, e.message());
            }
        });
        Ok(())
    }
}
