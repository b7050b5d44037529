//! Exec processes: added to a running task, started and watched like its init (see
//! [`super::start`]), deleted on their own.

use std::sync::Arc;

use containerd_shim::api;
use containerd_shim_protos::events::task::TaskExecAdded;
use containerd_shim_protos::topics;
use vmlet_protocol::agent::{CreateExecRequest, Stdio};

use super::process::{Phase, Process};
use super::{exit, TaskEntry, TaskService};
use crate::guest::stdio::{ProcessName, StdioPaths};
use crate::guest::ProcessId;
use crate::Error;

impl TaskService {
    pub(super) async fn create_exec(&self, req: api::ExecProcessRequest) -> Result<(), Error> {
        let task = self.task(&req.id)?;
        if req.exec_id.is_empty() {
            return Err(Error::InvalidArgument("exec id is empty".into()));
        }
        if task.execs.lock().unwrap().contains_key(&req.exec_id) {
            return Err(Error::AlreadyExists(format!(
                "exec {} of task {}",
                req.exec_id, req.id
            )));
        }
        task.init.expect(Phase::Running).map_err(|e| {
            Error::FailedPrecondition(format!("{}: cannot exec in it", e.message()))
        })?;
        task.vm.check_running()?;
        let json = req.spec.as_ref().map(|a| a.value.as_slice()).unwrap_or(&[]);
        let process = crate::spec::exec_process(json, &req.exec_id)?;
        let paths = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
        };
        paths.check()?;
        let terminal = req.terminal || process.terminal;
        let request = CreateExecRequest {
            container_id: req.id.clone(),
            exec_id: req.exec_id.clone(),
            process: Some(vmlet_protocol::agent::Process {
                terminal,
                ..process
            })
            .into(),
            stdio: Some(Stdio {
                stdin: !paths.stdin.is_empty(),
                stdout: !paths.stdout.is_empty(),
                stderr: !paths.stderr.is_empty() && !terminal,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        };
        task.vm.guest().create_exec(&request).await?;
        if let Some(meter) = self.meters.lock().unwrap().get(&task.pod_id) {
            meter.count_exec();
        }
        let id = ProcessId::exec(&req.id, &req.exec_id);
        let name = ProcessName {
            container_id: &req.id,
            exec_id: &req.exec_id,
        };
        let copies = match task
            .vm
            .attach_stdio(name, &self.namespace, &paths, terminal)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                forget_exec(&task, &id).await;
                return Err(e);
            }
        };
        let entry = Arc::new(Process::new(
            id,
            task.vm.host_pid(),
            paths,
            terminal,
            copies,
        ));
        task.execs
            .lock()
            .unwrap()
            .insert(req.exec_id.clone(), entry);
        self.publish(
            topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    pub(super) async fn delete_exec(
        &self,
        task: &TaskEntry,
        process: &Process,
    ) -> Result<api::DeleteResponse, Error> {
        let exit = exit::for_delete(process, task.vm.has_ended())?;
        forget_exec(task, &process.id).await;
        task.execs.lock().unwrap().remove(&process.id.exec_id);
        Ok(api::DeleteResponse {
            pid: process.pid,
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }
}

/// Drops the guest's record of an exec (best effort: the container may be gone).
async fn forget_exec(task: &TaskEntry, id: &ProcessId) {
    if let Err(e) = task.vm.guest().remove_exec(id).await {
        log::warn!(
            "remove exec {} of task {}: {}",
            id.exec_id,
            id.container_id,
            e.message()
        );
    }
}
