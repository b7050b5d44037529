//! The shim process: containerd's `start` and `delete` actions and the task service.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::{spawn, ExitSignal, Shim};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{api, Config, Error as ShimError, Flags, StartOpts};
use vmlet_config::NodeConfig;

use crate::host::reclaim::cleanup_after_shim;
use crate::task::events::EventSink;
use crate::task::{TaskApi, TaskService};
use crate::vm::LibvirtBooter;
use crate::vmm::libvirt_helper::LibvirtHelper;

/// containerd's runtime name for vmlet.
pub const RUNTIME_ID: &str = "io.containerd.vmlet.v2";

pub struct VmletShim {
    id: String,
    namespace: String,
    exit: Arc<ExitSignal>,
}

#[async_trait]
impl Shim for VmletShim {
    type T = TaskApi;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        VmletShim {
            id: args.id.clone(),
            namespace: args.namespace.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> Result<String, ShimError> {
        // One shim (and one VM) per pod: tasks group by io.kubernetes.cri.sandbox-id, read
        // from the bundle (containerd starts the shim in the bundle directory).
        let annotations = crate::spec::bundle::annotations_in(std::path::Path::new("config.json"));
        let grouping = crate::spec::grouping(&annotations, &opts.id);
        let address = spawn(opts, &grouping, Vec::new()).await?;
        // The bundle's `address` is how containerd finds the shim again after a restart
        // (without it a restarted containerd takes a live pod for a dead shim).
        std::fs::write("address", &address)
            .map_err(|e| ShimError::Other(format!("write the bundle's address file: {e}")))?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> Result<api::DeleteResponse, ShimError> {
        let (namespace, id) = (self.namespace.clone(), self.id.clone());
        let result = tokio::task::spawn_blocking(move || {
            let config = NodeConfig::load().map_err(|e| e.to_string())?;
            let vmm = LibvirtHelper::new(&config.helpers.libvirt, &config.libvirt_uri);
            cleanup_after_shim(&config, &vmm, &namespace, &id).map_err(|e| e.message())
        })
        .await
        .map_err(|e| ShimError::Other(e.to_string()))?;
        result.map_err(ShimError::Other)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Ok(api::DeleteResponse {
            exit_status: 137,
            exited_at: Some(
                containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp {
                    seconds: now.as_secs() as i64,
                    nanos: now.subsec_nanos() as i32,
                    ..Default::default()
                },
            )
            .into(),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        TaskApi(Arc::new(TaskService::new(
            &self.namespace,
            EventSink::forward_to(publisher, &self.namespace),
            Arc::new(|| NodeConfig::load().map(crate::vmm::launcher_choice::resolved)),
            self.exit.clone(),
            Arc::new(LibvirtBooter),
        )))
    }
}
