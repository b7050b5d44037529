//! The ttrpc face: each RPC looks up, makes one call on [`TaskService`], and maps errors
//! through [`Error`].

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::{api, TtrpcContext, TtrpcResult};
use containerd_shim_protos::shim_async::Task;

use super::TaskService;
use crate::Error;

#[derive(Clone)]
pub struct TaskApi(pub Arc<TaskService>);

/// Logs a failed call that changes something (containerd's own log is terse), then maps it.
fn logged<T>(what: &str, result: Result<T, Error>) -> TtrpcResult<T> {
    result.map_err(|e| {
        log::error!("{what}: {}", e.message());
        e.into()
    })
}

#[async_trait]
impl Task for TaskApi {
    async fn create(
        &self,
        _: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        log::info!("create {}", req.id);
        logged("create", self.0.create_task(req).await)
    }

    async fn start(
        &self,
        _: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        Ok(self.0.start_task(req).await?)
    }

    async fn state(
        &self,
        _: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        Ok(self.0.state(&req.id, &req.exec_id)?)
    }

    async fn wait(
        &self,
        _: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let exit = self.0.wait(&req.id, &req.exec_id).await?;
        Ok(api::WaitResponse {
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    async fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        self.0.kill(req).await?;
        Ok(api::Empty::default())
    }

    async fn exec(
        &self,
        _: &TtrpcContext,
        req: api::ExecProcessRequest,
    ) -> TtrpcResult<api::Empty> {
        log::info!("exec {} in {}", req.exec_id, req.id);
        logged("exec", self.0.create_exec(req).await)?;
        Ok(api::Empty::default())
    }

    async fn resize_pty(
        &self,
        _: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        self.0.resize_pty(req).await?;
        Ok(api::Empty::default())
    }

    async fn pause(&self, _: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        self.0.set_paused(&req.id, true).await?;
        Ok(api::Empty::default())
    }

    async fn resume(&self, _: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        self.0.set_paused(&req.id, false).await?;
        Ok(api::Empty::default())
    }

    async fn update(
        &self,
        _: &TtrpcContext,
        req: api::UpdateTaskRequest,
    ) -> TtrpcResult<api::Empty> {
        self.0.update(req).await?;
        Ok(api::Empty::default())
    }

    async fn stats(
        &self,
        _: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        Ok(self.0.metrics(&req.id).await?)
    }

    async fn checkpoint(
        &self,
        _: &TtrpcContext,
        req: api::CheckpointTaskRequest,
    ) -> TtrpcResult<api::Empty> {
        Err(Error::Unimplemented(format!(
            "checkpoint of task {} (vmlet cannot checkpoint a VM's containers)",
            req.id
        ))
        .into())
    }

    async fn delete(
        &self,
        _: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        log::info!("delete {} {}", req.id, req.exec_id);
        logged("delete", self.0.delete_task(req).await)
    }

    async fn pids(
        &self,
        _: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        Ok(self.0.pids(&req.id).await?)
    }

    async fn close_io(
        &self,
        _: &TtrpcContext,
        req: api::CloseIORequest,
    ) -> TtrpcResult<api::Empty> {
        let (_, process) = self.0.get(&req.id, &req.exec_id)?;
        if let Some(copies) = process.copies.lock().await.as_ref() {
            copies.close_stdin();
        }
        Ok(api::Empty::default())
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = self.0.task(&req.id).map(|t| t.init.pid).unwrap_or(0);
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _: &TtrpcContext, _: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        if self.0.tasks.lock().unwrap().is_empty() {
            // What was published so far reaches containerd before the shim exits.
            self.0.events.flush().await;
            self.0.exit.signal();
        }
        Ok(api::Empty::default())
    }
}
