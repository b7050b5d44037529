//! containerd's task API (shim v2) for vmlet. Requests are translated here; the VM and the
//! agent do the work. Tasks of one pod share its VM: the sandbox task boots it, container
//! tasks join it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{api, Context, TtrpcContext, TtrpcResult};
use containerd_shim_protos::events::task::{TaskCreate, TaskDelete, TaskExit, TaskIO, TaskStart};
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::MessageDyn;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::topics;
use oci_spec::runtime::Spec;
use tokio::sync::watch;
use vmlet_config::{NodeConfig, PodAnnotations, VmShape};
use vmlet_protocol::agent::{
    ListProcessesRequest, ProcessRef, RemoveContainerRequest, SignalProcessRequest,
    StartProcessRequest, Stdio, WaitProcessRequest,
};

use crate::stdio::{self, Copies, StdioPaths};
use crate::vm::{BootRequest, RootfsSource, Vm};
use crate::vmm::VmManager;
use crate::Error;

/// How long the shim waits for a process's output to drain after it exited.
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// Builds the VM manager for a config (libvirt in production).
pub type VmmFactory = Arc<dyn Fn(&NodeConfig) -> Arc<dyn VmManager> + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Created,
    Running,
    Stopped,
}

#[derive(Debug, Clone)]
struct Exit {
    status: u32,
    at: Timestamp,
}

struct TaskEntry {
    id: String,
    bundle: String,
    pid: u32,
    stdio: StdioPaths,
    vm: Arc<Vm>,
    /// The pod (sandbox) this task belongs to; a sandbox's is its own id.
    pod_id: String,
    phase: Mutex<Phase>,
    exit: watch::Sender<Option<Exit>>,
    copies: tokio::sync::Mutex<Option<Copies>>,
}

impl TaskEntry {
    fn exited(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }
}

pub struct TaskService {
    namespace: String,
    publisher: Arc<RemotePublisher>,
    exit: Arc<ExitSignal>,
    vmm_factory: VmmFactory,
    tasks: Mutex<HashMap<String, Arc<TaskEntry>>>,
    /// The pods' VMs, by sandbox id.
    vms: Mutex<HashMap<String, Arc<Vm>>>,
}

fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

fn agent_ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(30_000_000_000)
}

impl TaskService {
    pub fn new(
        namespace: &str,
        publisher: RemotePublisher,
        exit: Arc<ExitSignal>,
        vmm_factory: VmmFactory,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            publisher: Arc::new(publisher),
            exit,
            vmm_factory,
            tasks: Mutex::new(HashMap::new()),
            vms: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, id: &str, exec_id: &str) -> Result<Arc<TaskEntry>, Error> {
        if !exec_id.is_empty() {
            return Err(Error::NotFound(format!("exec {exec_id} of task {id}")));
        }
        self.tasks
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("task {id}")))
    }

    async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.namespace, event)
            .await
        {
            log::warn!("publish {topic}: {e}");
        }
    }

    async fn create_task(
        &self,
        req: api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, Error> {
        if self.tasks.lock().unwrap().contains_key(&req.id) {
            return Err(Error::AlreadyExists(format!("task {}", req.id)));
        }
        if req.terminal {
            return Err(Error::Unimplemented("a terminal (ctr -t)".into()));
        }
        let config = NodeConfig::load()?;
        let bundle = PathBuf::from(&req.bundle);
        let spec = Spec::load(bundle.join("config.json"))
            .map_err(|e| Error::InvalidArgument(format!("read {}/config.json: {e}", req.bundle)))?;
        let annotations = spec.annotations().clone().unwrap_or_default();
        let pod_annotations = PodAnnotations::from_map(&annotations)?;
        let role = crate::spec::pod_role(&annotations)?;
        let paths = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
        };
        paths.check()?;
        let wanted = Stdio {
            stdin: !paths.stdin.is_empty(),
            stdout: !paths.stdout.is_empty(),
            stderr: !paths.stderr.is_empty(),
            ..Default::default()
        };
        let (agent_request, binds) = crate::spec::create_request(&req.id, &spec, wanted)?;
        let rootfs = if req.rootfs.is_empty() {
            let root = spec
                .root()
                .as_ref()
                .map(|r| r.path().clone())
                .unwrap_or_else(|| PathBuf::from("rootfs"));
            RootfsSource::Dir(if root.is_absolute() {
                root
            } else {
                bundle.join(root)
            })
        } else {
            RootfsSource::Mounts(req.rootfs.to_vec())
        };
        let (vm, pod_id) = match role {
            crate::spec::PodRole::Sandbox => {
                let shape = VmShape::resolve(&config.guest, &pod_annotations)?;
                let netns = crate::spec::network_namespace(&spec)?;
                let vmm = (self.vmm_factory)(&config);
                let boot = BootRequest {
                    pod_id: req.id.clone(),
                    container_id: req.id.clone(),
                    shape,
                    rootfs,
                    binds,
                    netns,
                };
                (
                    Arc::new(Vm::boot(&config, vmm, boot).await?),
                    req.id.clone(),
                )
            }
            crate::spec::PodRole::Container { sandbox_id } => {
                let vm = self
                    .vms
                    .lock()
                    .unwrap()
                    .get(&sandbox_id)
                    .cloned()
                    .ok_or_else(|| {
                        Error::NotFound(format!(
                            "pod sandbox {sandbox_id} (its VM is not in this shim)"
                        ))
                    })?;
                vm.add_container(&req.id, &rootfs, &binds)?;
                (vm, sandbox_id)
            }
        };
        let owns_vm = pod_id == req.id;
        let created = async {
            let response = vm
                .agent
                .create_container(agent_ctx(), &agent_request)
                .await?;
            let copies = stdio::attach(&vm.endpoint, &req.id, &self.namespace, &paths).await?;
            Ok::<_, Error>((response.pid, copies))
        }
        .await;
        let (pid, copies) = match created {
            Ok(v) => v,
            Err(e) => {
                let cleanup = if owns_vm {
                    vm.teardown().await
                } else {
                    let _ = vm
                        .agent
                        .remove_container(
                            agent_ctx(),
                            &RemoveContainerRequest {
                                container_id: req.id.clone(),
                                ..Default::default()
                            },
                        )
                        .await;
                    vm.remove_container(&req.id)
                };
                if let Err(cleanup) = cleanup {
                    log::error!(
                        "cleanup after failed create of {}: {}",
                        req.id,
                        cleanup.message()
                    );
                }
                return Err(e);
            }
        };
        if owns_vm {
            self.vms.lock().unwrap().insert(pod_id.clone(), vm.clone());
        }
        let (exit, _) = watch::channel(None);
        let entry = Arc::new(TaskEntry {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            pid,
            stdio: paths,
            vm,
            pod_id,
            phase: Mutex::new(Phase::Created),
            exit,
            copies: tokio::sync::Mutex::new(Some(copies)),
        });
        self.tasks.lock().unwrap().insert(req.id.clone(), entry);
        self.publish(
            topics::TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: Some(TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                })
                .into(),
                checkpoint: req.checkpoint.clone(),
                pid,
                ..Default::default()
            }),
        )
        .await;
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start_task(
        self: &Arc<Self>,
        req: api::StartRequest,
    ) -> Result<api::StartResponse, Error> {
        let task = self.get(&req.id, &req.exec_id)?;
        {
            let phase = *task.phase.lock().unwrap();
            if phase != Phase::Created {
                return Err(Error::FailedPrecondition(format!(
                    "task {} is {phase:?}, not Created",
                    req.id
                )));
            }
        }
        let process = ProcessRef {
            container_id: task.id.clone(),
            ..Default::default()
        };
        task.vm
            .agent
            .start_process(
                agent_ctx(),
                &StartProcessRequest {
                    process: Some(process.clone()).into(),
                    ..Default::default()
                },
            )
            .await?;
        *task.phase.lock().unwrap() = Phase::Running;
        self.publish(
            topics::TASK_START_EVENT_TOPIC,
            Box::new(TaskStart {
                container_id: task.id.clone(),
                pid: task.pid,
                ..Default::default()
            }),
        )
        .await;
        let service = self.clone();
        tokio::spawn(async move { service.watch_exit(task, process).await });
        Ok(api::StartResponse {
            pid: 0,
            ..Default::default()
        })
    }

    /// Waits for the process's exit in the guest, lets its output drain, then records the
    /// exit and publishes TaskExit.
    async fn watch_exit(&self, task: Arc<TaskEntry>, process: ProcessRef) {
        let request = WaitProcessRequest {
            process: Some(process).into(),
            ..Default::default()
        };
        let status = match task
            .vm
            .agent
            .wait_process(ttrpc::context::Context::default(), &request)
            .await
        {
            Ok(r) => r.exit_status,
            Err(e) => {
                log::error!("wait for task {}: {e}", task.id);
                255
            }
        };
        if let Some(copies) = task.copies.lock().await.as_mut() {
            copies.close_stdin();
            if tokio::time::timeout(OUTPUT_DRAIN, copies.drain())
                .await
                .is_err()
            {
                log::warn!(
                    "task {}: output did not drain within {OUTPUT_DRAIN:?}",
                    task.id
                );
            }
        }
        let exit = Exit { status, at: now() };
        *task.phase.lock().unwrap() = Phase::Stopped;
        task.exit.send_replace(Some(exit.clone()));
        self.publish(
            topics::TASK_EXIT_EVENT_TOPIC,
            Box::new(TaskExit {
                container_id: task.id.clone(),
                id: task.id.clone(),
                pid: task.pid,
                exit_status: exit.status,
                exited_at: Some(exit.at).into(),
                ..Default::default()
            }),
        )
        .await;
    }

    async fn delete_task(&self, req: api::DeleteRequest) -> Result<api::DeleteResponse, Error> {
        let task = self.get(&req.id, &req.exec_id)?;
        if *task.phase.lock().unwrap() == Phase::Running {
            return Err(Error::FailedPrecondition(format!(
                "task {} is running; kill it first",
                req.id
            )));
        }
        let exit = task.exited().unwrap_or(Exit {
            status: 0,
            at: now(),
        });
        if task.pod_id == task.id {
            let others: Vec<String> = self
                .tasks
                .lock()
                .unwrap()
                .values()
                .filter(|t| t.pod_id == task.pod_id && t.id != task.id)
                .map(|t| t.id.clone())
                .collect();
            if !others.is_empty() {
                return Err(Error::FailedPrecondition(format!(
                    "pod {} still has containers {}; delete them first",
                    task.id,
                    others.join(", ")
                )));
            }
            task.vm.teardown().await?;
            self.vms.lock().unwrap().remove(&task.pod_id);
        } else {
            task.vm
                .agent
                .remove_container(
                    agent_ctx(),
                    &RemoveContainerRequest {
                        container_id: task.id.clone(),
                        ..Default::default()
                    },
                )
                .await?;
            task.vm.remove_container(&task.id)?;
        }
        self.tasks.lock().unwrap().remove(&req.id);
        self.publish(
            topics::TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: task.id.clone(),
                id: task.id.clone(),
                pid: task.pid,
                exit_status: exit.status,
                exited_at: Some(exit.at.clone()).into(),
                ..Default::default()
            }),
        )
        .await;
        Ok(api::DeleteResponse {
            pid: task.pid,
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }
}

/// The ttrpc face: every method translates and maps errors through [`Error`].
#[derive(Clone)]
pub struct TaskApi(pub Arc<TaskService>);

#[async_trait]
impl Task for TaskApi {
    async fn create(
        &self,
        _: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        log::info!("create {}", req.id);
        self.0.create_task(req).await.map_err(|e| {
            log::error!("create: {}", e.message());
            e.into()
        })
    }

    async fn start(
        &self,
        _: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        let task = self.0.get(&req.id, &req.exec_id)?;
        let mut response = self.0.start_task(req).await?;
        response.pid = task.pid;
        Ok(response)
    }

    async fn state(
        &self,
        _: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        let task = self.0.get(&req.id, &req.exec_id)?;
        let phase = *task.phase.lock().unwrap();
        let exit = task.exited();
        Ok(api::StateResponse {
            id: task.id.clone(),
            bundle: task.bundle.clone(),
            pid: task.pid,
            status: match phase {
                Phase::Created => api::Status::CREATED,
                Phase::Running => api::Status::RUNNING,
                Phase::Stopped => api::Status::STOPPED,
            }
            .into(),
            stdin: task.stdio.stdin.clone(),
            stdout: task.stdio.stdout.clone(),
            stderr: task.stdio.stderr.clone(),
            terminal: false,
            exit_status: exit.as_ref().map_or(0, |e| e.status),
            exited_at: exit.map(|e| e.at).into(),
            ..Default::default()
        })
    }

    async fn wait(
        &self,
        _: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let task = self.0.get(&req.id, &req.exec_id)?;
        let mut rx = task.exit.subscribe();
        let exit = loop {
            if let Some(exit) = rx.borrow_and_update().clone() {
                break exit;
            }
            if rx.changed().await.is_err() {
                return Err(Error::Internal("task dropped while waiting".into()).into());
            }
        };
        Ok(api::WaitResponse {
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    async fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let task = self.0.get(&req.id, &req.exec_id)?;
        if task.exited().is_some() {
            return Err(
                Error::NotFound(format!("process of task {} already finished", req.id)).into(),
            );
        }
        let request = SignalProcessRequest {
            process: Some(ProcessRef {
                container_id: task.id.clone(),
                ..Default::default()
            })
            .into(),
            signal: req.signal,
            all: req.all,
            ..Default::default()
        };
        task.vm
            .agent
            .signal_process(agent_ctx(), &request)
            .await
            .map_err(Error::from)?;
        Ok(api::Empty::default())
    }

    async fn delete(
        &self,
        _: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        log::info!("delete {}", req.id);
        self.0.delete_task(req).await.map_err(|e| {
            log::error!("delete: {}", e.message());
            e.into()
        })
    }

    async fn pids(
        &self,
        _: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        let task = self.0.get(&req.id, "")?;
        let list = task
            .vm
            .agent
            .list_processes(
                agent_ctx(),
                &ListProcessesRequest {
                    container_id: task.id.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(Error::from)?;
        Ok(api::PidsResponse {
            processes: list
                .pids
                .into_iter()
                .map(|pid| containerd_shim_protos::api::ProcessInfo {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    async fn close_io(
        &self,
        _: &TtrpcContext,
        req: api::CloseIORequest,
    ) -> TtrpcResult<api::Empty> {
        let task = self.0.get(&req.id, &req.exec_id)?;
        if let Some(copies) = task.copies.lock().await.as_ref() {
            copies.close_stdin();
        }
        Ok(api::Empty::default())
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = self.0.get(&req.id, "").map(|t| t.pid).unwrap_or(0);
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _: &TtrpcContext, _: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        if self.0.tasks.lock().unwrap().is_empty() {
            self.0.exit.signal();
        }
        Ok(api::Empty::default())
    }
}

/// `shim delete`: containerd's cleanup after the shim is gone. Removes whatever the pod's
/// state file lists.
pub fn cleanup_after_shim(
    config: &NodeConfig,
    vmm: &dyn VmManager,
    pod_id: &str,
) -> Result<(), Error> {
    let dir = crate::vm::PodPaths::new(&config.state_dir, pod_id).dir;
    if !dir.exists() {
        return Ok(());
    }
    let state = crate::state::PodState::load(&dir).unwrap_or(crate::state::PodState {
        dir: dir.clone(),
        domain: Some(crate::vm::domain_name(pod_id)),
        ..Default::default()
    });
    crate::vm::teardown(vmm, &state)
}
