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
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::MessageDyn;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::topics;
use oci_spec::runtime::Spec;
use tokio::sync::watch;
use vmlet_config::{NodeConfig, PodAnnotations, VmOptions, VmShape};
use vmlet_protocol::agent::{
    ContainerRequest, CreateExecRequest, ListProcessesRequest, ProcessRef, RemoveContainerRequest,
    ResizeTerminalRequest, SignalProcessRequest, StartProcessRequest, Stdio,
    UpdateResourcesRequest, WaitProcessRequest,
};

use crate::stdio::{self, Copies, ProcessName, StdioPaths};
use crate::vm::{BootRequest, RootfsSource, Vm};
use crate::vmm::VmManager;
use crate::Error;

/// How long the shim waits for a process's output to drain after it exited.
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);
/// Exit status of every process of a pod whose VM ended under it (QEMU killed or crashed,
/// the guest kernel panicked): 128 + SIGKILL, as if the process had been killed.
pub const VM_ENDED_STATUS: u32 = 137;
/// Exit status of a process whose pod's agent connection broke while the VM still ran:
/// its real end cannot be known.
pub const AGENT_LOST_STATUS: u32 = 255;
/// How long a broken agent connection waits for QEMU's end to be seen.
const VM_END_GRACE: Duration = Duration::from_secs(1);
/// How long the agent may take to report the exit of a process whose start it refused.
const REFUSED_START_EXIT: Duration = Duration::from_secs(5);
/// How long the guest has to report the end of a pod's sandbox after SIGKILL before the
/// shim ends the VM itself (the guest may not be trusted to obey).
pub const KILL_GRACE: Duration = Duration::from_secs(5);

/// Where a created task's container goes: a new VM (sandbox or plain task) or a running
/// pod's VM.
enum PodTarget {
    Boot(Box<BootRequest>),
    Join {
        vm: Arc<Vm>,
        sandbox_id: String,
        rootfs: RootfsSource,
        binds: Vec<crate::spec::HostBind>,
    },
}

/// Builds the VM manager for a config (libvirt in production).
pub type VmmFactory = Arc<dyn Fn(&NodeConfig) -> Arc<dyn VmManager> + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Created,
    /// Claimed by a start whose agent call has not answered yet; reported as CREATED, so
    /// RUNNING means the process really started.
    Starting,
    Running,
    Paused,
    Stopped,
}

#[derive(Debug, Clone)]
struct Exit {
    status: u32,
    at: Timestamp,
}

/// One process of a task: its init (empty exec id) or an exec.
struct ProcessEntry {
    exec_id: String,
    /// The PID containerd is given: the pod's QEMU (see `Vm::host_pid`).
    pid: u32,
    stdio: StdioPaths,
    terminal: bool,
    phase: Mutex<Phase>,
    exit: watch::Sender<Option<Exit>>,
    copies: tokio::sync::Mutex<Option<Copies>>,
}

impl ProcessEntry {
    fn new(exec_id: &str, pid: u32, stdio: StdioPaths, terminal: bool, copies: Copies) -> Self {
        Self {
            exec_id: exec_id.into(),
            pid,
            stdio,
            terminal,
            phase: Mutex::new(Phase::Created),
            exit: watch::channel(None).0,
            copies: tokio::sync::Mutex::new(Some(copies)),
        }
    }

    fn pid(&self) -> u32 {
        self.pid
    }

    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap()
    }

    fn exited(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }

    /// Whether a start is in flight or the process runs (it cannot be deleted then).
    fn is_live(&self) -> bool {
        matches!(self.phase(), Phase::Starting | Phase::Running)
    }

    /// Records the exit once: Stopped with `status`. None when an exit was already
    /// recorded (the VM's end and the process's own exit can race).
    fn record_exit(&self, status: u32) -> Option<Exit> {
        let mut phase = self.phase.lock().unwrap();
        if self.exit.borrow().is_some() {
            return None;
        }
        let exit = Exit { status, at: now() };
        *phase = Phase::Stopped;
        self.exit.send_replace(Some(exit.clone()));
        Some(exit)
    }
}

struct TaskEntry {
    id: String,
    bundle: String,
    /// OCI hooks that run on the host, and the state they read (with the pod's host
    /// process as PID); poststart and poststop run from here.
    hooks: crate::hooks::HostHooks,
    hook_state: crate::hooks::HookState,
    vm: Arc<Vm>,
    /// The pod (sandbox) this task belongs to; a sandbox's is its own id.
    pod_id: String,
    init: Arc<ProcessEntry>,
    execs: Mutex<HashMap<String, Arc<ProcessEntry>>>,
}

impl TaskEntry {
    fn process_ref(&self, process: &ProcessEntry) -> ProcessRef {
        ProcessRef {
            container_id: self.id.clone(),
            exec_id: process.exec_id.clone(),
            ..Default::default()
        }
    }

    /// The agent's wait for `process`'s exit.
    fn wait_request(&self, process: &ProcessEntry) -> WaitProcessRequest {
        WaitProcessRequest {
            process: Some(self.process_ref(process)).into(),
            ..Default::default()
        }
    }

    /// `id` or `id/exec` for messages.
    fn name(&self, process: &ProcessEntry) -> String {
        if process.exec_id.is_empty() {
            format!("task {}", self.id)
        } else {
            format!("exec {} of task {}", process.exec_id, self.id)
        }
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

/// The exit status of a process whose VM ended under it, logged unless the shim stopped
/// the VM itself.
fn vm_ended_under(task: &TaskEntry, process: &ProcessEntry) -> u32 {
    if !task.vm.is_stopping() {
        log::error!(
            "{}: the pod's VM stopped (QEMU exited) while it ran: exit status {VM_ENDED_STATUS}",
            task.name(process)
        );
    }
    VM_ENDED_STATUS
}

/// The exit a delete reports for a process: the recorded one; for one never started, 137
/// when its VM ended, else 0 (as runc's shim reports a created task's). A process that
/// runs or is starting cannot be deleted.
fn exit_for_delete(task: &TaskEntry, process: &ProcessEntry) -> Result<Exit, Error> {
    if process.is_live() {
        return Err(Error::FailedPrecondition(format!(
            "{} is running; kill it first",
            task.name(process)
        )));
    }
    Ok(process.exited().unwrap_or_else(|| Exit {
        status: if task.vm.has_ended() {
            VM_ENDED_STATUS
        } else {
            0
        },
        at: now(),
    }))
}

/// Whether the pod's VM has ended or does within [`VM_END_GRACE`] (the agent's connection
/// can break a moment before QEMU's end is seen).
async fn vm_ends_within_grace(task: &TaskEntry) -> bool {
    tokio::time::timeout(VM_END_GRACE, task.vm.ended())
        .await
        .is_ok()
}

/// The exit the agent recorded for a process whose start it refused; none when it has not
/// (in [`REFUSED_START_EXIT`]): the process may still be there.
async fn exit_after_refused_start(task: &TaskEntry, process: &ProcessEntry) -> Option<u32> {
    let request = task.wait_request(process);
    let wait = task.vm.agent.wait_process(agent_ctx(), &request);
    match tokio::time::timeout(REFUSED_START_EXIT, wait).await {
        Ok(Ok(r)) => Some(r.exit_status),
        _ => None,
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

    fn task(&self, id: &str) -> Result<Arc<TaskEntry>, Error> {
        self.tasks
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("task {id}")))
    }

    /// A task and one of its processes (the init for an empty exec id).
    fn get(&self, id: &str, exec_id: &str) -> Result<(Arc<TaskEntry>, Arc<ProcessEntry>), Error> {
        let task = self.task(id)?;
        let process = if exec_id.is_empty() {
            task.init.clone()
        } else {
            task.execs
                .lock()
                .unwrap()
                .get(exec_id)
                .cloned()
                .ok_or_else(|| Error::NotFound(format!("exec {exec_id} of task {id}")))?
        };
        Ok((task, process))
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
        let config = NodeConfig::load()?;
        let bundle = PathBuf::from(&req.bundle);
        let spec = Spec::load(bundle.join("config.json"))
            .map_err(|e| Error::InvalidArgument(format!("read {}/config.json: {e}", req.bundle)))?;
        let annotations = spec.annotations().clone().unwrap_or_default();
        let pod_annotations = PodAnnotations::from_map(&annotations, &config.annotations.allowed)?;
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
        let hooks = crate::hooks::HostHooks::from_spec(&spec)?;
        let mut hook_state = crate::hooks::HookState {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            annotations: annotations.clone(),
            pid: 0,
        };
        let (mut agent_request, binds) = crate::spec::create_request(&req.id, &spec, wanted)?;
        let memory_limit = crate::memory::limit_mib(
            spec.linux()
                .as_ref()
                .and_then(|l| l.resources().as_ref())
                .and_then(|r| r.memory().as_ref())
                .and_then(|m| m.limit()),
        );
        let block_devices = crate::block_devices::from_spec(&spec)?;
        let sandbox_pid = match &role {
            crate::spec::PodRole::Container { sandbox_id } => self
                .tasks
                .lock()
                .unwrap()
                .get(sandbox_id)
                .map(|t| t.init.pid()),
            crate::spec::PodRole::Sandbox => None,
        };
        agent_request.join_namespaces = crate::spec::shared_namespaces(&spec, &role, sandbox_pid)?;
        if let crate::spec::PodRole::Container { sandbox_id } = &role {
            agent_request.join_namespaces_of = sandbox_id.clone();
        }
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
        // Checks first: nothing is created and no hook runs before they pass.
        let target = match role {
            crate::spec::PodRole::Sandbox => {
                let limits = crate::spec::pod_limits(&spec, &annotations)?;
                let (shape, sources) = VmShape::resolve(
                    &config.guest,
                    &pod_annotations,
                    &limits,
                    config.annotations.beyond_limits,
                )?;
                log::info!(
                    "pod {}: {} vCPU ({:?}), {} MiB ({:?}); limits {:?}",
                    req.id,
                    shape.vcpus,
                    sources[0],
                    shape.memory_mib,
                    sources[1],
                    limits
                );
                let options = VmOptions::resolve(&config.guest, &pod_annotations);
                let netns = crate::spec::network_namespace(&spec)?;
                // A VM sized by annotation keeps its size; any other can grow to the
                // node's maximum.
                let fixed = sources[1] == vmlet_config::ShapeSource::Annotation;
                let memory = crate::memory::PodMemory::new(
                    shape.memory_mib,
                    if fixed {
                        0
                    } else {
                        crate::memory::region_mib(shape.memory_mib, config.guest.max_memory_mib)
                    },
                    config.guest.overhead_memory_mib,
                    fixed,
                );
                PodTarget::Boot(Box::new(BootRequest {
                    pod_id: req.id.clone(),
                    container_id: req.id.clone(),
                    shape,
                    memory,
                    options,
                    rootfs,
                    binds,
                    netns,
                    host_process: (!hooks.is_empty()).then(|| crate::vm::HostProcess {
                        create_hooks: hooks.create.clone(),
                        state: hook_state.clone(),
                    }),
                    cgroup: spec
                        .linux()
                        .as_ref()
                        .and_then(|l| l.cgroups_path().as_ref())
                        .map(|p| crate::pod_cgroup::PodCgroup::from_spec_path(&p.to_string_lossy()))
                        .transpose()?,
                }))
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
                if !hooks.is_empty() {
                    hook_state.pid = vm.holder_pid.ok_or_else(|| {
                        Error::Unimplemented(format!(
                            "OCI hooks on a container of pod {sandbox_id}, whose sandbox has none (no host process to give them)"
                        ))
                    })?;
                }
                PodTarget::Join {
                    vm,
                    sandbox_id,
                    rootfs,
                    binds,
                }
            }
        };
        // From here a failure removes what was created, then runs the poststop hooks, as
        // runc does after a failed create (they undo what the create hooks did).
        let created = async {
            let (vm, pod_id) = match target {
                PodTarget::Boot(boot) => {
                    let vmm = (self.vmm_factory)(&config);
                    let vm = Arc::new(Vm::boot(&config, vmm, *boot).await?);
                    hook_state.pid = vm.holder_pid.unwrap_or(0);
                    (vm, req.id.clone())
                }
                PodTarget::Join {
                    vm,
                    sandbox_id,
                    rootfs,
                    binds,
                } => {
                    vm.check_running()?;
                    crate::hooks::run(&hooks.create, &hook_state, "creating").await?;
                    vm.add_container(&req.id, &rootfs, &binds)?;
                    (vm, sandbox_id)
                }
            };
            let owns_vm = pod_id == req.id;
            let started = async {
                vm.fit_memory(&req.id, memory_limit).await?;
                agent_request.block_devices =
                    vm.attach_block_devices(&req.id, &block_devices).await?;
                let response = vm
                    .agent
                    .create_container(agent_ctx(), &agent_request)
                    .await?;
                let name = ProcessName {
                    container_id: &req.id,
                    exec_id: "",
                };
                let copies =
                    stdio::attach(&vm.endpoint, name, &self.namespace, &paths, req.terminal)
                        .await?;
                Ok::<_, Error>((response.pid, copies))
            }
            .await;
            match started {
                Ok((pid, copies)) => Ok((vm, pod_id, owns_vm, pid, copies)),
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
                        if let Err(e) = vm.detach_block_devices(&req.id).await {
                            log::error!("{}: {}", req.id, e.message());
                        }
                        vm.remove_container(&req.id)
                    };
                    if let Err(cleanup) = cleanup {
                        log::error!(
                            "cleanup after failed create of {}: {}",
                            req.id,
                            cleanup.message()
                        );
                    }
                    Err(e)
                }
            }
        }
        .await;
        let (vm, pod_id, owns_vm, pid, copies) = match created {
            Ok(v) => v,
            Err(e) => {
                crate::hooks::run_logged(&hooks.poststop, &hook_state, "stopped").await;
                return Err(e);
            }
        };
        if owns_vm {
            self.vms.lock().unwrap().insert(pod_id.clone(), vm.clone());
        }
        // containerd is told the VM's host PID (QEMU's), never the guest's: a PID the
        // guest chose means nothing on the host (and could name a host process).
        let guest_pid = pid;
        let pid = vm.host_pid;
        log::info!(
            "{}: guest PID {guest_pid}; reported as QEMU's, {pid}",
            req.id
        );
        let entry = Arc::new(TaskEntry {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            hooks,
            hook_state,
            vm,
            pod_id,
            init: Arc::new(ProcessEntry::new("", pid, paths, req.terminal, copies)),
            execs: Mutex::new(HashMap::new()),
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
        let (task, process) = self.get(&req.id, &req.exec_id)?;
        {
            let mut phase = process.phase.lock().unwrap();
            if *phase != Phase::Created {
                return Err(Error::FailedPrecondition(format!(
                    "{} is {:?}, not Created",
                    task.name(&process),
                    *phase
                )));
            }
            // Claimed: a second start fails above instead of racing this one.
            *phase = Phase::Starting;
        }
        let started = task
            .vm
            .agent
            .start_process(
                agent_ctx(),
                &StartProcessRequest {
                    process: Some(task.process_ref(&process)).into(),
                    ..Default::default()
                },
            )
            .await;
        let started = match started {
            Ok(r) => r,
            Err(e) => return Err(self.start_failed(&task, &process, e).await),
        };
        *process.phase.lock().unwrap() = Phase::Running;
        log::info!(
            "{}: started, guest PID {}",
            task.name(&process),
            started.pid
        );
        if process.exec_id.is_empty() {
            crate::hooks::run_logged(&task.hooks.poststart, &task.hook_state, "running").await;
            self.publish(
                topics::TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: task.id.clone(),
                    pid: process.pid(),
                    ..Default::default()
                }),
            )
            .await;
        } else {
            self.publish(
                topics::TASK_EXEC_STARTED_EVENT_TOPIC,
                Box::new(TaskExecStarted {
                    container_id: task.id.clone(),
                    exec_id: process.exec_id.clone(),
                    pid: process.pid(),
                    ..Default::default()
                }),
            )
            .await;
        }
        let pid = process.pid();
        let service = self.clone();
        tokio::spawn(async move { service.watch_exit(task, process).await });
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    /// Waits for the process's exit in the guest, lets its output drain, then records the
    /// exit and publishes TaskExit.
    async fn watch_exit(&self, task: Arc<TaskEntry>, process: Arc<ProcessEntry>) {
        let request = task.wait_request(&process);
        let waited = tokio::select! {
            r = task
                .vm
                .agent
                .wait_process(ttrpc::context::Context::default(), &request) => Some(r),
            () = task.vm.ended() => None,
        };
        let (status, oom_killed) = match waited {
            Some(Ok(r)) => (r.exit_status, r.oom_killed),
            Some(Err(e)) => {
                if vm_ends_within_grace(&task).await {
                    (vm_ended_under(&task, &process), false)
                } else {
                    log::error!(
                        "{}: the pod's agent cannot be reached any more ({e}) while its VM \
                         runs: exit status {AGENT_LOST_STATUS}",
                        task.name(&process)
                    );
                    (AGENT_LOST_STATUS, false)
                }
            }
            None => (vm_ended_under(&task, &process), false),
        };
        if oom_killed {
            // Before the exit, as runc's shim does: CRI then reports reason OOMKilled.
            self.publish(
                topics::TASK_OOM_EVENT_TOPIC,
                Box::new(TaskOOM {
                    container_id: task.id.clone(),
                    ..Default::default()
                }),
            )
            .await;
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
                    task.name(&process)
                );
                copies.abort();
            }
        }
        self.finish(&task, &process, status).await;
    }

    /// A start the agent did not carry out. When the agent refused it (an exec that failed,
    /// a setup step that failed) the process has ended in the guest, as runc's init does:
    /// its exit is recorded and published (the task is Stopped, kill and delete work). When
    /// the pod's VM ended under it, finished with [`VM_ENDED_STATUS`]. Otherwise (the agent
    /// did not answer) back to Created.
    async fn start_failed(
        &self,
        task: &TaskEntry,
        process: &ProcessEntry,
        e: ttrpc::Error,
    ) -> Error {
        // The agent's own refusal is not a broken connection: no need to wait for QEMU.
        let transport = !matches!(e, ttrpc::Error::RpcStatus(_));
        let ended = task.vm.has_ended() || (transport && vm_ends_within_grace(task).await);
        if !ended {
            if !transport {
                if let Some(status) = exit_after_refused_start(task, process).await {
                    self.finish(task, process, status).await;
                    return e.into();
                }
            }
            *process.phase.lock().unwrap() = Phase::Created;
            return e.into();
        }
        self.finish(task, process, vm_ended_under(task, process))
            .await;
        Error::FailedPrecondition(format!(
            "start {}: the pod's VM stopped (QEMU exited)",
            task.name(process)
        ))
    }

    /// Records a process's exit (once) and publishes TaskExit.
    async fn finish(&self, task: &TaskEntry, process: &ProcessEntry, status: u32) {
        let Some(exit) = process.record_exit(status) else {
            return;
        };
        let id = if process.exec_id.is_empty() {
            task.id.clone()
        } else {
            process.exec_id.clone()
        };
        self.publish(
            topics::TASK_EXIT_EVENT_TOPIC,
            Box::new(TaskExit {
                container_id: task.id.clone(),
                id,
                pid: process.pid(),
                exit_status: exit.status,
                exited_at: Some(exit.at).into(),
                ..Default::default()
            }),
        )
        .await;
    }

    /// Freezes (`pause`) or thaws the task's processes, moving its init between Running and
    /// Paused and publishing TaskPaused / TaskResumed.
    async fn set_paused(&self, id: &str, paused: bool) -> Result<(), Error> {
        let task = self.task(id)?;
        let (from, to) = if paused {
            (Phase::Running, Phase::Paused)
        } else {
            (Phase::Paused, Phase::Running)
        };
        let now = task.init.phase();
        if now != from {
            return Err(Error::FailedPrecondition(format!(
                "task {id} is {now:?}, not {from:?}"
            )));
        }
        let request = ContainerRequest {
            container_id: task.id.clone(),
            ..Default::default()
        };
        if paused {
            task.vm.agent.pause(agent_ctx(), &request).await?;
        } else {
            task.vm.agent.resume(agent_ctx(), &request).await?;
        }
        {
            // The task may have exited meanwhile (a frozen task cannot, a thawed one can).
            let mut phase = task.init.phase.lock().unwrap();
            if *phase == from {
                *phase = to;
            }
        }
        let id = task.id.clone();
        if paused {
            let event = TaskPaused {
                container_id: id,
                ..Default::default()
            };
            self.publish(topics::TASK_PAUSED_EVENT_TOPIC, Box::new(event))
                .await;
        } else {
            let event = TaskResumed {
                container_id: id,
                ..Default::default()
            };
            self.publish(topics::TASK_RESUMED_EVENT_TOPIC, Box::new(event))
                .await;
        }
        Ok(())
    }

    async fn update(&self, req: api::UpdateTaskRequest) -> Result<(), Error> {
        let task = self.task(&req.id)?;
        let json = req
            .resources
            .as_ref()
            .map(|a| a.value.as_slice())
            .unwrap_or(b"{}");
        let resources = crate::spec::update_resources(json, &req.id)?;
        // An update that leaves memory alone keeps the container's limit as it was.
        if let Some(limit) = crate::memory::limit_mib(Some(resources.memory_limit)) {
            task.vm.fit_memory(&task.id, Some(limit)).await?;
        }
        let request = UpdateResourcesRequest {
            container_id: task.id.clone(),
            resources: Some(resources).into(),
            ..Default::default()
        };
        task.vm
            .agent
            .update_resources(agent_ctx(), &request)
            .await?;
        Ok(())
    }

    async fn metrics(&self, id: &str) -> Result<api::StatsResponse, Error> {
        let task = self.task(id)?;
        let request = ContainerRequest {
            container_id: task.id.clone(),
            ..Default::default()
        };
        let stats = task.vm.agent.stats(agent_ctx(), &request).await?;
        let metrics = crate::metrics::from_agent(&stats);
        let value = protobuf::Message::write_to_bytes(&metrics)
            .map_err(|e| Error::Internal(format!("encode metrics: {e}")))?;
        Ok(api::StatsResponse {
            stats: Some(protobuf::well_known_types::any::Any {
                type_url: crate::metrics::TYPE_URL.into(),
                value,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        })
    }

    async fn create_exec(&self, req: api::ExecProcessRequest) -> Result<(), Error> {
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
        if task.init.phase() != Phase::Running {
            return Err(Error::FailedPrecondition(format!(
                "task {} is {:?}, not Running: cannot exec in it",
                req.id,
                task.init.phase()
            )));
        }
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
        task.vm.agent.create_exec(agent_ctx(), &request).await?;
        let name = ProcessName {
            container_id: &req.id,
            exec_id: &req.exec_id,
        };
        let copies =
            match stdio::attach(&task.vm.endpoint, name, &self.namespace, &paths, terminal).await {
                Ok(c) => c,
                Err(e) => {
                    self.forget_exec(&task, &req.exec_id).await;
                    return Err(e);
                }
            };
        let entry = Arc::new(ProcessEntry::new(
            &req.exec_id,
            task.vm.host_pid,
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
        )
        .await;
        Ok(())
    }

    /// Drops the agent's record of an exec (best effort: the container may be gone).
    async fn forget_exec(&self, task: &TaskEntry, exec_id: &str) {
        let process = ProcessRef {
            container_id: task.id.clone(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        if let Err(e) = task.vm.agent.remove_exec(agent_ctx(), &process).await {
            log::warn!("remove exec {exec_id} of task {}: {e}", task.id);
        }
    }

    async fn delete_exec(
        &self,
        task: &TaskEntry,
        process: &ProcessEntry,
    ) -> Result<api::DeleteResponse, Error> {
        let exit = exit_for_delete(task, process)?;
        self.forget_exec(task, &process.exec_id).await;
        task.execs.lock().unwrap().remove(&process.exec_id);
        Ok(api::DeleteResponse {
            pid: process.pid(),
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    async fn delete_task(&self, req: api::DeleteRequest) -> Result<api::DeleteResponse, Error> {
        let (task, process) = self.get(&req.id, &req.exec_id)?;
        if !req.exec_id.is_empty() {
            return self.delete_exec(&task, &process).await;
        }
        let exit = exit_for_delete(&task, &process)?;
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
        } else if task.vm.has_ended() {
            // Nothing of the container is left in the guest; the sandbox's delete tears
            // the rest down.
            task.vm.remove_container(&task.id)?;
        } else {
            let removed = task
                .vm
                .agent
                .remove_container(
                    agent_ctx(),
                    &RemoveContainerRequest {
                        container_id: task.id.clone(),
                        ..Default::default()
                    },
                )
                .await;
            // The host's part is removed whatever the guest answers: an agent that fails
            // (or will not) must not keep the container's mounts on the host.
            if let Err(e) = removed {
                log::error!(
                    "{}: the agent did not remove the container ({e}); removing the host's part",
                    task.id
                );
            }
            task.vm.remove_container(&task.id)?;
            // The guest has let go of the devices with the container; the VM's end would
            // release one that fails to unplug.
            if let Err(e) = task.vm.detach_block_devices(&task.id).await {
                log::error!("{}: {}", task.id, e.message());
            }
        }
        crate::hooks::run_logged(&task.hooks.poststop, &task.hook_state, "stopped").await;
        self.tasks.lock().unwrap().remove(&req.id);
        self.publish(
            topics::TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: task.id.clone(),
                id: task.id.clone(),
                pid: process.pid(),
                exit_status: exit.status,
                exited_at: Some(exit.at.clone()).into(),
                ..Default::default()
            }),
        )
        .await;
        Ok(api::DeleteResponse {
            pid: process.pid(),
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
        Ok(self.0.start_task(req).await?)
    }

    async fn state(
        &self,
        _: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        let (task, process) = self.0.get(&req.id, &req.exec_id)?;
        let exit = process.exited();
        Ok(api::StateResponse {
            id: if process.exec_id.is_empty() {
                task.id.clone()
            } else {
                process.exec_id.clone()
            },
            bundle: task.bundle.clone(),
            pid: process.pid(),
            status: match process.phase() {
                Phase::Created | Phase::Starting => api::Status::CREATED,
                Phase::Running => api::Status::RUNNING,
                Phase::Paused => api::Status::PAUSED,
                Phase::Stopped => api::Status::STOPPED,
            }
            .into(),
            stdin: process.stdio.stdin.clone(),
            stdout: process.stdio.stdout.clone(),
            stderr: process.stdio.stderr.clone(),
            terminal: process.terminal,
            exit_status: exit.as_ref().map_or(0, |e| e.status),
            exited_at: exit.map(|e| e.at).into(),
            exec_id: process.exec_id.clone(),
            ..Default::default()
        })
    }

    async fn wait(
        &self,
        _: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let (task, process) = self.0.get(&req.id, &req.exec_id)?;
        let mut rx = process.exit.subscribe();
        let exit = loop {
            if let Some(exit) = rx.borrow_and_update().clone() {
                break exit;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    return Err(Error::Internal("task dropped while waiting".into()).into());
                },
                // A started process's watcher records its end; one never started has none.
                () = task.vm.ended(), if process.phase() == Phase::Created => {
                    self.0.finish(&task, &process, vm_ended_under(&task, &process)).await;
                }
            }
        };
        Ok(api::WaitResponse {
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    async fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let (task, process) = self.0.get(&req.id, &req.exec_id)?;
        if process.exited().is_some() {
            return Err(Error::NotFound(format!(
                "process of {} already finished",
                task.name(&process)
            ))
            .into());
        }
        let request = SignalProcessRequest {
            process: Some(task.process_ref(&process)).into(),
            signal: req.signal,
            all: req.all,
            ..Default::default()
        };
        let signalled = task
            .vm
            .agent
            .signal_process(agent_ctx(), &request)
            .await
            .map_err(Error::from);
        let kills_the_pod =
            req.signal == libc::SIGKILL as u32 && req.exec_id.is_empty() && task.pod_id == task.id;
        if !kills_the_pod {
            signalled?;
            return Ok(api::Empty::default());
        }
        // Killing the pod's sandbox must work whatever the guest does: the VM ends when
        // the guest did not report the sandbox's end in time (or refused the signal).
        if let Err(e) = &signalled {
            log::warn!(
                "{}: the agent did not take SIGKILL: {}",
                task.id,
                e.message()
            );
        }
        tokio::spawn(async move {
            let mut exit = process.exit.subscribe();
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
        Ok(api::Empty::default())
    }

    async fn exec(
        &self,
        _: &TtrpcContext,
        req: api::ExecProcessRequest,
    ) -> TtrpcResult<api::Empty> {
        log::info!("exec {} in {}", req.exec_id, req.id);
        self.0.create_exec(req).await.map_err(|e| {
            log::error!("exec: {}", e.message());
            ttrpc::Error::from(e)
        })?;
        Ok(api::Empty::default())
    }

    async fn resize_pty(
        &self,
        _: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        let (task, process) = self.0.get(&req.id, &req.exec_id)?;
        if !process.terminal {
            return Err(Error::FailedPrecondition(format!(
                "{} has no terminal to resize",
                task.name(&process)
            ))
            .into());
        }
        let request = ResizeTerminalRequest {
            process: Some(task.process_ref(&process)).into(),
            width: req.width,
            height: req.height,
            ..Default::default()
        };
        task.vm
            .agent
            .resize_terminal(agent_ctx(), &request)
            .await
            .map_err(Error::from)?;
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
        let task = self.0.task(&req.id)?;
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
        let task_pid = self.0.task(&req.id).map(|t| t.init.pid()).unwrap_or(0);
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
    if let Some(pid) = state.shim_pid.filter(|p| *p != std::process::id()) {
        // A shim containerd gave up on while it still ran: nothing will talk to it again.
        if crate::ctl::live_shim(pid, pod_id) {
            log::warn!("pod {pod_id}: stopping its shim {pid}, which containerd gave up on");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    crate::vm::teardown(vmm, &state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process() -> ProcessEntry {
        ProcessEntry::new("", 1, StdioPaths::default(), false, Copies::default())
    }

    #[test]
    fn an_exit_is_recorded_once_and_stops_the_process() {
        let p = process();
        *p.phase.lock().unwrap() = Phase::Running;
        assert!(p.is_live());
        let first = p.record_exit(VM_ENDED_STATUS).expect("first exit recorded");
        assert_eq!(first.status, VM_ENDED_STATUS);
        assert_eq!(p.phase(), Phase::Stopped);
        assert!(!p.is_live());
        // The process's own exit arriving after the VM's end changes nothing.
        assert!(p.record_exit(0).is_none());
        assert_eq!(p.exited().unwrap().status, VM_ENDED_STATUS);
    }

    #[test]
    fn a_start_in_flight_is_live_but_not_running() {
        let p = process();
        assert!(!p.is_live());
        *p.phase.lock().unwrap() = Phase::Starting;
        assert!(p.is_live());
        assert!(p.exited().is_none());
    }
}
