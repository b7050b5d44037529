//! The pod's agent as the task service sees it: one method per call, each with its
//! deadline, every answer mapped to [`Error`] (the agent's refusal keeps its code and a
//! bounded message; a broken connection is [`Error::AgentLost`]). [`AgentGuest`] speaks
//! ttrpc over vsock; unit tests put a fake behind the same trait.

pub mod console;
pub mod guest_agent;
pub mod guest_text;
pub(crate) mod log_uri;
pub(crate) mod port_forward;
pub(crate) mod stdio;
pub mod vsock;

use std::time::Duration;

use async_trait::async_trait;
use vmlet_protocol::agent::{
    ContainerRequest, CreateContainerRequest, CreateExecRequest, ListProcessesRequest, ProcessRef,
    RemoveContainerRequest, ResizeTerminalRequest, Resources, ShutdownRequest,
    SignalProcessRequest, StartProcessRequest, StatsResponse, UpdateResourcesRequest,
    WaitProcessRequest,
};
use vmlet_protocol::agent_ttrpc::AgentClient;

use crate::Error;

/// How long any call but a wait may take: the agent answers at once or not at all.
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// How long the agent has to take a power-off request.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(1);

/// A process of a container: its init (empty exec id) or an exec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub container_id: String,
    pub exec_id: String,
}

impl ProcessId {
    pub fn init(container_id: &str) -> Self {
        Self {
            container_id: container_id.into(),
            exec_id: String::new(),
        }
    }

    pub fn exec(container_id: &str, exec_id: &str) -> Self {
        Self {
            container_id: container_id.into(),
            exec_id: exec_id.into(),
        }
    }

    fn to_ref(&self) -> ProcessRef {
        ProcessRef {
            container_id: self.container_id.clone(),
            exec_id: self.exec_id.clone(),
            ..Default::default()
        }
    }
}

/// How a process ended, as the agent saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestExit {
    /// As a shell reports it: the exit code, or 128 + signal number.
    pub status: u32,
    /// The OOM killer killed a process of the container's cgroup.
    pub oom_killed: bool,
}

/// What runs a pod's processes once the VM runs: vmlet's agent, or for the other kinds of
/// pod what stands in for it (a VM image's VM, a VM-mode pod's host process).
#[async_trait]
pub trait Guest: Send + Sync {
    /// Creates the container and its init process (not started); its guest PID.
    async fn create_container(&self, request: &CreateContainerRequest) -> Result<u32, Error>;
    /// Starts a created process; its guest PID.
    async fn start_process(&self, process: &ProcessId) -> Result<u32, Error>;
    /// Waits for a started process's end, without a deadline: it may run for ever.
    async fn wait_process(&self, process: &ProcessId) -> Result<GuestExit, Error>;
    async fn signal_process(
        &self,
        process: &ProcessId,
        signal: u32,
        all: bool,
    ) -> Result<(), Error>;
    async fn remove_container(&self, container_id: &str) -> Result<(), Error>;
    /// Asks the guest to power itself off.
    async fn shutdown(&self) -> Result<(), Error>;
    /// The calls only vmlet's agent answers; else why this pod has no agent.
    fn agent(&self) -> Result<&dyn AgentCalls, NoAgent>;
    /// Creates an exec (not started): vmlet's agent's, unless the pod runs execs another
    /// way (a VM image's QEMU guest agent).
    async fn create_exec(&self, request: &CreateExecRequest) -> Result<(), Error> {
        self.agent()
            .map_err(|n| n.refuse("an exec"))?
            .create_exec(request)
            .await
    }
    /// Forgets an exec [`Guest::create_exec`] made (where none was, nothing to do).
    async fn remove_exec(&self, process: &ProcessId) -> Result<(), Error> {
        match self.agent() {
            Ok(agent) => agent.remove_exec(process).await,
            Err(_) => Ok(()),
        }
    }
}

/// Why a pod has no vmlet agent ([`Guest::agent`]): the end of a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoAgent(pub String);

impl NoAgent {
    /// UNIMPLEMENTED: `what` needs an agent, and this pod has none.
    pub fn refuse(&self, what: &str) -> Error {
        Error::Unimplemented(format!("{what}: {}", self.0))
    }
}

/// The calls only vmlet's agent answers: execs, pause and resume, resources, stats, the
/// container's processes and terminals.
#[async_trait]
pub trait AgentCalls: Send + Sync {
    async fn create_exec(&self, request: &CreateExecRequest) -> Result<(), Error>;
    async fn remove_exec(&self, process: &ProcessId) -> Result<(), Error>;
    async fn pause(&self, container_id: &str) -> Result<(), Error>;
    async fn resume(&self, container_id: &str) -> Result<(), Error>;
    async fn update_resources(&self, container_id: &str, resources: Resources)
        -> Result<(), Error>;
    async fn stats(&self, container_id: &str) -> Result<StatsResponse, Error>;
    /// Guest PIDs of the container's processes.
    async fn list_processes(&self, container_id: &str) -> Result<Vec<u32>, Error>;
    async fn resize_terminal(
        &self,
        process: &ProcessId,
        width: u32,
        height: u32,
    ) -> Result<(), Error>;
}

/// The agent over ttrpc.
pub struct AgentGuest {
    client: AgentClient,
}

impl AgentGuest {
    pub fn new(client: AgentClient) -> Self {
        Self { client }
    }
}

fn within(deadline: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(deadline.as_nanos() as i64)
}

fn call() -> ttrpc::context::Context {
    within(CALL_DEADLINE)
}

fn container(container_id: &str) -> ContainerRequest {
    ContainerRequest {
        container_id: container_id.into(),
        ..Default::default()
    }
}

#[async_trait]
impl Guest for AgentGuest {
    fn agent(&self) -> Result<&dyn AgentCalls, NoAgent> {
        Ok(self)
    }

    async fn create_container(&self, request: &CreateContainerRequest) -> Result<u32, Error> {
        Ok(self.client.create_container(call(), request).await?.pid)
    }

    async fn start_process(&self, process: &ProcessId) -> Result<u32, Error> {
        let request = StartProcessRequest {
            process: Some(process.to_ref()).into(),
            ..Default::default()
        };
        Ok(self.client.start_process(call(), &request).await?.pid)
    }

    async fn wait_process(&self, process: &ProcessId) -> Result<GuestExit, Error> {
        let request = WaitProcessRequest {
            process: Some(process.to_ref()).into(),
            ..Default::default()
        };
        let waited = self
            .client
            .wait_process(ttrpc::context::Context::default(), &request)
            .await?;
        Ok(GuestExit {
            status: waited.exit_status,
            oom_killed: waited.oom_killed,
        })
    }

    async fn signal_process(
        &self,
        process: &ProcessId,
        signal: u32,
        all: bool,
    ) -> Result<(), Error> {
        let request = SignalProcessRequest {
            process: Some(process.to_ref()).into(),
            signal,
            all,
            ..Default::default()
        };
        self.client.signal_process(call(), &request).await?;
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<(), Error> {
        let request = RemoveContainerRequest {
            container_id: container_id.into(),
            ..Default::default()
        };
        self.client.remove_container(call(), &request).await?;
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), Error> {
        self.client
            .shutdown(within(SHUTDOWN_DEADLINE), &ShutdownRequest::default())
            .await?;
        Ok(())
    }
}

#[async_trait]
impl AgentCalls for AgentGuest {
    async fn create_exec(&self, request: &CreateExecRequest) -> Result<(), Error> {
        self.client.create_exec(call(), request).await?;
        Ok(())
    }

    async fn remove_exec(&self, process: &ProcessId) -> Result<(), Error> {
        self.client.remove_exec(call(), &process.to_ref()).await?;
        Ok(())
    }

    async fn pause(&self, container_id: &str) -> Result<(), Error> {
        self.client.pause(call(), &container(container_id)).await?;
        Ok(())
    }

    async fn resume(&self, container_id: &str) -> Result<(), Error> {
        self.client.resume(call(), &container(container_id)).await?;
        Ok(())
    }

    async fn update_resources(
        &self,
        container_id: &str,
        resources: Resources,
    ) -> Result<(), Error> {
        let request = UpdateResourcesRequest {
            container_id: container_id.into(),
            resources: Some(resources).into(),
            ..Default::default()
        };
        self.client.update_resources(call(), &request).await?;
        Ok(())
    }

    async fn stats(&self, container_id: &str) -> Result<StatsResponse, Error> {
        Ok(self.client.stats(call(), &container(container_id)).await?)
    }

    async fn list_processes(&self, container_id: &str) -> Result<Vec<u32>, Error> {
        let request = ListProcessesRequest {
            container_id: container_id.into(),
            ..Default::default()
        };
        Ok(self.client.list_processes(call(), &request).await?.pids)
    }

    async fn resize_terminal(
        &self,
        process: &ProcessId,
        width: u32,
        height: u32,
    ) -> Result<(), Error> {
        let request = ResizeTerminalRequest {
            process: Some(process.to_ref()).into(),
            width,
            height,
            ..Default::default()
        };
        self.client.resize_terminal(call(), &request).await?;
        Ok(())
    }
}
