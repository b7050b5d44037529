//! The task service under test: its seams filled with fakes ([`super::fakes`]), a channel
//! for the events, a fixed node config, bundles in a scratch directory; and the calls
//! containerd makes, as containerd makes them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use containerd_shim::api;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim_protos::events::task::TaskExit;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::topics;
use vmlet_config::NodeConfig;

use super::fakes::{FakeBooter, FakeVm};
use super::TaskService;
use crate::spec::{CONTAINER_TYPE_ANNOTATION, SANDBOX_ID_ANNOTATION};
use crate::task::events::{EventReceiver, EventSink};
use crate::Error;

/// How long [`Harness::wait`] waits for a process's end (on the paused clock).
const WAIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The pod's sandbox (its first task).
pub(super) const SANDBOX: &str = "pod1";

pub(super) struct Harness {
    pub(super) service: Arc<TaskService>,
    pub(super) events: EventReceiver,
    pub(super) vm: Arc<FakeVm>,
    pub(super) booter: Arc<FakeBooter>,
    dir: Scratch,
}

/// A directory for the test's bundles, removed with it.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("vmlet-lifecycle-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn harness() -> Harness {
    let vm = Arc::new(FakeVm::default());
    let booter = Arc::new(FakeBooter::new(vm.clone()));
    let (sink, events) = EventSink::channel();
    let service = Arc::new(TaskService::new(
        "testns",
        sink,
        Arc::new(|| Ok(NodeConfig::default())),
        Arc::new(ExitSignal::default()),
        booter.clone(),
    ));
    Harness {
        service,
        events,
        vm,
        booter,
        dir: Scratch::new(),
    }
}

impl Harness {
    /// The directory of `id`'s bundle.
    pub(super) fn bundle_dir(&self, id: &str) -> String {
        self.dir.0.join(id).to_string_lossy().into_owned()
    }

    /// A bundle for `id`: the pod's sandbox, or (with `sandbox`) a container of it.
    pub(super) fn bundle(&self, id: &str, sandbox: Option<&str>) -> String {
        let annotations = match sandbox {
            None => serde_json::json!({}),
            Some(s) => serde_json::json!({
                CONTAINER_TYPE_ANNOTATION: "container",
                SANDBOX_ID_ANNOTATION: s,
            }),
        };
        self.bundle_annotated(id, annotations)
    }

    /// A bundle for `id` whose spec has `annotations`.
    pub(super) fn bundle_annotated(&self, id: &str, annotations: serde_json::Value) -> String {
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sleep", "1000"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "network"},
                                     {"type": "ipc"}, {"type": "uts"}]},
            "annotations": annotations,
        });
        let dir = self.bundle_dir(id);
        std::fs::create_dir_all(format!("{dir}/rootfs")).unwrap();
        std::fs::write(format!("{dir}/config.json"), spec.to_string()).unwrap();
        dir
    }

    /// containerd's CreateTask for `id` (see [`Harness::bundle`]), with no stdio.
    pub(super) fn create_request(&self, id: &str, sandbox: Option<&str>) -> api::CreateTaskRequest {
        api::CreateTaskRequest {
            id: id.into(),
            bundle: self.bundle(id, sandbox),
            ..Default::default()
        }
    }

    pub(super) async fn create(&self, id: &str, sandbox: Option<&str>) -> Result<u32, Error> {
        let req = self.create_request(id, sandbox);
        Ok(self.service.create_task(req).await?.pid)
    }

    /// containerd's CreateTask for `id` with a bundle whose spec has `annotations`.
    pub(super) async fn create_annotated(
        &self,
        id: &str,
        annotations: serde_json::Value,
    ) -> Result<u32, Error> {
        let req = api::CreateTaskRequest {
            id: id.into(),
            bundle: self.bundle_annotated(id, annotations),
            ..Default::default()
        };
        Ok(self.service.create_task(req).await?.pid)
    }

    pub(super) async fn start(&self, id: &str, exec_id: &str) -> Result<u32, Error> {
        let req = api::StartRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        Ok(self.service.start_task(req).await?.pid)
    }

    /// containerd's Exec of `true` as `exec_id` in task `id`, with no stdio.
    pub(super) fn exec_request(id: &str, exec_id: &str) -> api::ExecProcessRequest {
        let process =
            serde_json::json!({"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        api::ExecProcessRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            spec: Some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
                value: process.to_string().into_bytes(),
                ..Default::default()
            })
            .into(),
            ..Default::default()
        }
    }

    pub(super) async fn exec(&self, id: &str, exec_id: &str) -> Result<(), Error> {
        let req = Self::exec_request(id, exec_id);
        self.service.create_exec(req).await
    }

    pub(super) async fn kill(&self, id: &str, exec_id: &str, signal: i32) -> Result<(), Error> {
        let req = api::KillRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            signal: signal as u32,
            ..Default::default()
        };
        self.service.kill(req).await
    }

    pub(super) async fn delete_reply(
        &self,
        id: &str,
        exec_id: &str,
    ) -> Result<api::DeleteResponse, Error> {
        let req = api::DeleteRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        self.service.delete_task(req).await
    }

    pub(super) async fn delete(&self, id: &str, exec_id: &str) -> Result<u32, Error> {
        Ok(self.delete_reply(id, exec_id).await?.exit_status)
    }

    pub(super) fn status(&self, id: &str, exec_id: &str) -> api::Status {
        self.service
            .state(id, exec_id)
            .unwrap()
            .status
            .enum_value()
            .unwrap()
    }

    /// The exit status of a process that ends; a test whose process never ends fails (the
    /// paused clock runs ahead to the deadline at once) instead of hanging.
    pub(super) async fn wait(&self, id: &str, exec_id: &str) -> u32 {
        let waited = tokio::time::timeout(WAIT_DEADLINE, self.service.wait(id, exec_id));
        let exit = waited
            .await
            .unwrap_or_else(|_| panic!("{id}/{exec_id} did not end within {WAIT_DEADLINE:?}"));
        exit.unwrap().status
    }

    /// The exit statuses published so far, by container and process id.
    pub(super) fn exits(&mut self) -> Vec<(String, String, u32)> {
        self.events
            .drain()
            .into_iter()
            .filter(|e| e.topic == topics::TASK_EXIT_EVENT_TOPIC)
            .map(|e| {
                let exit = e.message.downcast_box::<TaskExit>().unwrap();
                (exit.container_id, exit.id, exit.exit_status)
            })
            .collect()
    }

    /// The events published so far: each topic with its message in protobuf's text format,
    /// each field preceded by a space (` id: "e1"` is the field `id`, not `container_id`).
    pub(super) fn published(&mut self) -> Vec<(String, String)> {
        self.events
            .drain()
            .into_iter()
            .map(|e| {
                let text = protobuf::text_format::print_to_string(&*e.message);
                (e.topic, format!(" {text}"))
            })
            .collect()
    }
}

/// A harness whose pod's sandbox runs, with a running exec `e1`.
pub(super) async fn running_pod_with_exec() -> Harness {
    let h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.exec(SANDBOX, "e1").await.unwrap();
    h.start(SANDBOX, "e1").await.unwrap();
    h
}

/// Lets spawned tasks (the exit watchers) run to their next wait.
pub(super) async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
