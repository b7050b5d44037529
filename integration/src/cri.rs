//! A small client of containerd's CRI API (v1), as kubelet drives it.

use std::collections::HashMap;

use anyhow::Context;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStats, ContainerStatsRequest, ContainerStatus,
    ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ExecSyncResponse, ImageSpec,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest, UpdateContainerResourcesRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// The namespace modes kubelet asks for by default: the pod's network and IPC, a PID
/// namespace per container (no shareProcessNamespace).
fn kubelet_namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Pod as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// `crictl` pointed at containerd's CRI socket `socket` (`scripts/install-deps` builds it),
/// for what the tests do outside an async context.
pub fn crictl(socket: &str) -> std::process::Command {
    let mut command = std::process::Command::new("crictl");
    command.args(["--runtime-endpoint", &format!("unix://{socket}")]);
    command
}

pub struct Cri {
    client: RuntimeServiceClient<Channel>,
}

impl Cri {
    /// Connects to the CRI socket (containerd's gRPC socket).
    pub async fn connect(socket: &str) -> anyhow::Result<Self> {
        let socket = socket.to_owned();
        let channel = Endpoint::try_from("http://[::]")?
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .context("connect to the CRI socket")?;
        Ok(Self {
            client: RuntimeServiceClient::new(channel),
        })
    }

    /// Makes the pod's containers share one PID namespace (`shareProcessNamespace: true`).
    pub fn share_process_namespace(config: &mut PodSandboxConfig) {
        if let Some(options) = config
            .linux
            .as_mut()
            .and_then(|l| l.security_context.as_mut())
            .and_then(|c| c.namespace_options.as_mut())
        {
            options.pid = NamespaceMode::Pod as i32;
        }
    }

    /// The sandbox config kubelet would send for a pod.
    pub fn pod_config(name: &str, uid: &str, log_directory: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: log_directory.into(),
            labels: HashMap::new(),
            annotations: HashMap::new(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(kubelet_namespaces()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub async fn run_pod(
        &mut self,
        config: &PodSandboxConfig,
        handler: &str,
    ) -> anyhow::Result<String> {
        let response = self
            .client
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .context("RunPodSandbox")?;
        Ok(response.into_inner().pod_sandbox_id)
    }

    /// The pod's IP as the CRI plugin reports it (from CNI).
    pub async fn pod_ip(&mut self, pod: &str) -> anyhow::Result<String> {
        let status = self
            .client
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: false,
            })
            .await
            .context("PodSandboxStatus")?
            .into_inner();
        status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
            .context("the pod has no IP")
    }

    /// The path of the pod's network namespace, from PodSandboxStatus's verbose info (the
    /// sandbox's runtime spec).
    pub async fn pod_netns(&mut self, pod: &str) -> anyhow::Result<String> {
        let status = self
            .client
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: true,
            })
            .await
            .context("PodSandboxStatus")?
            .into_inner();
        let info: serde_json::Value =
            serde_json::from_str(status.info.get("info").context("no verbose info")?)?;
        info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["type"] == "network")
            .and_then(|n| n["path"].as_str())
            .map(str::to_owned)
            .context("the pod's spec has no network namespace path")
    }

    pub async fn create_and_start(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> anyhow::Result<String> {
        self.create_and_start_limited(pod, pod_config, name, image, command, 0)
            .await
    }

    /// As [`Cri::create_and_start`], with a memory limit in bytes (0: none).
    pub async fn create_and_start_limited(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        name: &str,
        image: &str,
        command: &[&str],
        memory_limit: i64,
    ) -> anyhow::Result<String> {
        let config = Self::container_config(pod_config, name, image, command, memory_limit);
        self.create_and_start_config(pod, pod_config, config).await
    }

    /// The container config kubelet would send, with a memory limit in bytes (0: none).
    pub fn container_config(
        pod_config: &PodSandboxConfig,
        name: &str,
        image: &str,
        command: &[&str],
        memory_limit: i64,
    ) -> ContainerConfig {
        // As kubelet does: the container's namespace modes are the pod's.
        let namespaces = pod_config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|c| c.namespace_options.clone())
            .unwrap_or_else(kubelet_namespaces);
        let linux = LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(namespaces),
                ..Default::default()
            }),
            resources: (memory_limit > 0).then(|| LinuxContainerResources {
                memory_limit_in_bytes: memory_limit,
                ..Default::default()
            }),
        };
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(linux),
            ..Default::default()
        }
    }

    /// CreateContainer with `config`, then StartContainer.
    pub async fn create_and_start_config(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> anyhow::Result<String> {
        let id = self.create_container(pod, pod_config, config).await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    /// CreateContainer with `config` (the CRI plugin makes the task at the start).
    pub async fn create_container(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> anyhow::Result<String> {
        Ok(self
            .client
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .context("CreateContainer")?
            .into_inner()
            .container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> anyhow::Result<()> {
        self.client
            .start_container(StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .context("StartContainer")?;
        Ok(())
    }

    pub async fn exec_sync(
        &mut self,
        id: &str,
        command: &[&str],
        timeout: i64,
    ) -> anyhow::Result<ExecSyncResponse> {
        Ok(self
            .client
            .exec_sync(ExecSyncRequest {
                container_id: id.into(),
                cmd: command.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .context("ExecSync")?
            .into_inner())
    }

    /// UpdateContainerResources with a new memory limit (bytes).
    pub async fn update_memory(&mut self, id: &str, limit: i64) -> anyhow::Result<()> {
        self.client
            .update_container_resources(UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(LinuxContainerResources {
                    memory_limit_in_bytes: limit,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .context("UpdateContainerResources")?;
        Ok(())
    }

    pub async fn container_stats(&mut self, id: &str) -> anyhow::Result<ContainerStats> {
        self.client
            .container_stats(ContainerStatsRequest {
                container_id: id.into(),
            })
            .await
            .context("ContainerStats")?
            .into_inner()
            .stats
            .context("ContainerStats returned no stats")
    }

    /// ContainerStats' CPU time (ns) and memory working set (bytes), 0 where missing.
    pub async fn cpu_and_working_set(&mut self, id: &str) -> anyhow::Result<(u64, u64)> {
        let stats = self.container_stats(id).await?;
        let cpu = stats
            .cpu
            .and_then(|c| c.usage_core_nano_seconds)
            .map_or(0, |v| v.value);
        let memory = stats
            .memory
            .and_then(|m| m.working_set_bytes)
            .map_or(0, |v| v.value);
        Ok((cpu, memory))
    }

    pub async fn container_status(&mut self, id: &str) -> anyhow::Result<ContainerStatus> {
        self.client
            .container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .context("ContainerStatus")?
            .into_inner()
            .status
            .context("ContainerStatus returned no status")
    }

    /// StopContainer: SIGTERM, then SIGKILL after `timeout` s (what kubelet gives as the
    /// pod's grace period).
    pub async fn stop_container(&mut self, id: &str, timeout: i64) -> anyhow::Result<()> {
        self.client
            .stop_container(StopContainerRequest {
                container_id: id.into(),
                timeout,
            })
            .await
            .context("StopContainer")?;
        Ok(())
    }

    /// StopContainer (SIGTERM, then SIGKILL after `timeout` s) and RemoveContainer.
    pub async fn remove_container(&mut self, id: &str, timeout: i64) -> anyhow::Result<()> {
        self.stop_container(id, timeout).await?;
        self.client
            .remove_container(RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
            .context("RemoveContainer")?;
        Ok(())
    }

    /// StopPodSandbox and RemovePodSandbox.
    pub async fn remove_pod(&mut self, pod: &str) -> anyhow::Result<()> {
        self.client
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.into(),
            })
            .await
            .context("StopPodSandbox")?;
        self.client
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod.into(),
            })
            .await
            .context("RemovePodSandbox")?;
        Ok(())
    }
}
