//! The ttrpc side of [`AgentService`]: each method of the `Agent` service to the call that
//! does it, and its errors to their ttrpc codes.

use async_trait::async_trait;
use ttrpc::r#async::TtrpcContext;
use vmlet_protocol::agent::{
    ConfigureNetworkRequest, ContainerRequest, CreateContainerRequest, CreateContainerResponse,
    CreateExecRequest, Empty, ListProcessesRequest, ListProcessesResponse, PingRequest,
    PingResponse, ProcessRef, RemoveContainerRequest, ResizeTerminalRequest, ShutdownRequest,
    SignalProcessRequest, StartProcessRequest, StartProcessResponse, StatsResponse,
    UpdateResourcesRequest, WaitProcessRequest, WaitProcessResponse,
};
use vmlet_protocol::agent_ttrpc;

use super::AgentService;

#[async_trait]
impl agent_ttrpc::Agent for AgentService {
    async fn ping(&self, _: &TtrpcContext, req: PingRequest) -> ttrpc::Result<PingResponse> {
        self.clock.set_once(req.host_realtime_ns)?;
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        Ok(PingResponse {
            agent_version: env!("CARGO_PKG_VERSION").into(),
            kernel_release: release,
            boot_id,
            ..Default::default()
        })
    }

    async fn create_container(
        &self,
        _: &TtrpcContext,
        req: CreateContainerRequest,
    ) -> ttrpc::Result<CreateContainerResponse> {
        Ok(self.create(req).await?)
    }

    async fn start_process(
        &self,
        _: &TtrpcContext,
        req: StartProcessRequest,
    ) -> ttrpc::Result<StartProcessResponse> {
        Ok(self.start(req).await?)
    }

    async fn wait_process(
        &self,
        _: &TtrpcContext,
        req: WaitProcessRequest,
    ) -> ttrpc::Result<WaitProcessResponse> {
        Ok(self.wait(req).await?)
    }

    async fn signal_process(
        &self,
        _: &TtrpcContext,
        req: SignalProcessRequest,
    ) -> ttrpc::Result<Empty> {
        Ok(self.signal(req)?)
    }

    async fn remove_container(
        &self,
        _: &TtrpcContext,
        req: RemoveContainerRequest,
    ) -> ttrpc::Result<Empty> {
        Ok(self.remove(req).await?)
    }

    async fn list_processes(
        &self,
        _: &TtrpcContext,
        req: ListProcessesRequest,
    ) -> ttrpc::Result<ListProcessesResponse> {
        let container = self.containers.get(&req.container_id)?;
        let mut pids = if container.init.exit_status().is_some() {
            Vec::new()
        } else {
            container.cgroup.pids()
        };
        pids.sort_unstable();
        Ok(ListProcessesResponse {
            pids: pids.into_iter().map(|p| p as u32).collect(),
            ..Default::default()
        })
    }

    async fn create_exec(&self, _: &TtrpcContext, req: CreateExecRequest) -> ttrpc::Result<Empty> {
        Ok(self.create_exec(req).await?)
    }

    async fn resize_terminal(
        &self,
        _: &TtrpcContext,
        req: ResizeTerminalRequest,
    ) -> ttrpc::Result<Empty> {
        Ok(self.resize(req)?)
    }

    async fn remove_exec(&self, _: &TtrpcContext, req: ProcessRef) -> ttrpc::Result<Empty> {
        Ok(self.remove_exec(req)?)
    }

    async fn stats(&self, _: &TtrpcContext, req: ContainerRequest) -> ttrpc::Result<StatsResponse> {
        Ok(self.stats(req)?)
    }

    async fn pause(&self, _: &TtrpcContext, req: ContainerRequest) -> ttrpc::Result<Empty> {
        Ok(self.freeze(req, true).await?)
    }

    async fn resume(&self, _: &TtrpcContext, req: ContainerRequest) -> ttrpc::Result<Empty> {
        Ok(self.freeze(req, false).await?)
    }

    async fn update_resources(
        &self,
        _: &TtrpcContext,
        req: UpdateResourcesRequest,
    ) -> ttrpc::Result<Empty> {
        Ok(self.update(req)?)
    }

    async fn configure_network(
        &self,
        _: &TtrpcContext,
        req: ConfigureNetworkRequest,
    ) -> ttrpc::Result<Empty> {
        crate::network::configure(&req).await?;
        log::info!("network configured ({} interfaces)", req.interfaces.len());
        Ok(Empty::default())
    }

    async fn shutdown(&self, _: &TtrpcContext, _: ShutdownRequest) -> ttrpc::Result<Empty> {
        tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            crate::boot::power_off();
        });
        Ok(Empty::default())
    }
}
