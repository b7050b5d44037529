//! What reads or changes a running task without starting or ending a process: state, pause
//! and resume, resource updates (the VM grows first when a memory limit needs it), stats.

use containerd_shim::api;
use containerd_shim_protos::events::task::{TaskPaused, TaskResumed};
use containerd_shim_protos::topics;

use super::process::Phase;
use super::TaskService;
use crate::Error;

impl TaskService {
    /// A process's state as containerd sees it (an exec of a paused task is PAUSED).
    pub(super) fn state(&self, id: &str, exec_id: &str) -> Result<api::StateResponse, Error> {
        let (task, process) = self.get(id, exec_id)?;
        let exit = process.exited();
        let task_paused = task.init.phase() == Phase::Paused;
        Ok(api::StateResponse {
            id: process.event_id().into(),
            bundle: task.bundle.clone(),
            pid: process.pid,
            status: process.status(task_paused).into(),
            stdin: process.stdio.stdin.clone(),
            stdout: process.stdio.stdout.clone(),
            stderr: process.stdio.stderr.clone(),
            terminal: process.terminal,
            exit_status: exit.as_ref().map_or(0, |e| e.status),
            exited_at: exit.map(|e| e.at).into(),
            exec_id: process.id.exec_id.clone(),
            ..Default::default()
        })
    }

    /// Freezes (`pause`) or thaws the task's processes, moving its init between Running and
    /// Paused and publishing TaskPaused / TaskResumed.
    pub(super) async fn set_paused(&self, id: &str, paused: bool) -> Result<(), Error> {
        let task = self.task(id)?;
        let (from, to) = if paused {
            (Phase::Running, Phase::Paused)
        } else {
            (Phase::Paused, Phase::Running)
        };
        task.init.expect(from)?;
        let what = if paused { "pause" } else { "resume" };
        let agent = task.vm.guest().agent().map_err(|n| n.refuse(what))?;
        if paused {
            agent.pause(&task.id).await?;
        } else {
            agent.resume(&task.id).await?;
        }
        task.init.settle(from, to);
        let container_id = task.id.clone();
        if paused {
            let event = TaskPaused {
                container_id,
                ..Default::default()
            };
            self.publish(topics::TASK_PAUSED_EVENT_TOPIC, Box::new(event));
        } else {
            let event = TaskResumed {
                container_id,
                ..Default::default()
            };
            self.publish(topics::TASK_RESUMED_EVENT_TOPIC, Box::new(event));
        }
        Ok(())
    }

    pub(super) async fn update(&self, req: api::UpdateTaskRequest) -> Result<(), Error> {
        let task = self.task(&req.id)?;
        let json = req
            .resources
            .as_ref()
            .map(|a| a.value.as_slice())
            .unwrap_or(b"{}");
        let resources = crate::spec::update_resources(json, &req.id)?;
        // An update that leaves memory alone keeps the container's limit as it was.
        if let Some(limit) = crate::devices::memory::limit_mib(Some(resources.memory_limit)) {
            // A VM that is not shared (a VM image) is sized by its annotations alone.
            if let Ok(shared) = task.vm.shared() {
                shared.fit_memory(&task.id, Some(limit)).await?;
            }
        }
        task.vm
            .guest()
            .agent()
            .map_err(|n| n.refuse("a resources update"))?
            .update_resources(&task.id, resources)
            .await
    }

    pub(super) async fn metrics(&self, id: &str) -> Result<api::StatsResponse, Error> {
        let task = self.task(id)?;
        let stats = match task.vm.guest().agent() {
            Ok(agent) => agent.stats(&task.id).await?,
            Err(no_agent) => match task.vm.host_stats() {
                Some(stats) => stats?,
                None => return Err(no_agent.refuse("stats")),
            },
        };
        let metrics = crate::task::container_metrics::from_agent(&stats);
        let value = protobuf::Message::write_to_bytes(&metrics)
            .map_err(|e| Error::Internal(format!("encode metrics: {e}")))?;
        Ok(api::StatsResponse {
            stats: Some(protobuf::well_known_types::any::Any {
                type_url: crate::task::container_metrics::TYPE_URL.into(),
                value,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        })
    }

    /// The task's processes as the host sees them: the pod's QEMU, once (as Kata answers).
    /// A guest PID means nothing on the host, and one the guest chose could name any host
    /// process to whoever looks it up there (`nerdctl top` reads `/proc/PID`); the guest's
    /// PIDs are in the shim's log.
    pub(super) async fn pids(&self, id: &str) -> Result<api::PidsResponse, Error> {
        let task = self.task(id)?;
        // Without an agent the guest has no processes of the task to list (a VM image's
        // one process is the VM itself).
        let guest_pids = match task.vm.guest().agent() {
            Ok(agent) => agent.list_processes(&task.id).await?,
            Err(_) => Vec::new(),
        };
        // The guest chose how many: the log gets the count and the first few.
        let shown = &guest_pids[..guest_pids.len().min(16)];
        log::info!(
            "{}: {} process(es) in the guest, PIDs {shown:?}{}",
            task.id,
            guest_pids.len(),
            if guest_pids.len() > shown.len() {
                " ..."
            } else {
                ""
            }
        );
        Ok(api::PidsResponse {
            processes: vec![containerd_shim_protos::api::ProcessInfo {
                pid: task.vm.host_pid(),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    /// Resizes a process's terminal.
    pub(super) async fn resize_pty(&self, req: api::ResizePtyRequest) -> Result<(), Error> {
        let (task, process) = self.get(&req.id, &req.exec_id)?;
        if !process.terminal {
            return Err(Error::FailedPrecondition(format!(
                "{} has no terminal to resize",
                process.name()
            )));
        }
        task.vm
            .guest()
            .agent()
            .map_err(|n| n.refuse("a terminal"))?
            .resize_terminal(&process.id, req.width, req.height)
            .await
    }
}
