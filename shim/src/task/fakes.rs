//! Fakes behind the task service's seams, for its lifecycle tests: a guest whose processes
//! end when the test says, a pod VM whose end the test controls, a booter that hands it out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{watch, Notify};
use vmlet_config::NodeConfig;
use vmlet_protocol::agent::{CreateContainerRequest, CreateExecRequest, Resources, StatsResponse};

use crate::devices::block_devices::BlockDevice;
use crate::guest::stdio::{Copies, ProcessName, StdioPaths};
use crate::guest::{AgentCalls, Guest, GuestExit, NoAgent, ProcessId};
use crate::host::share::RootfsSource;
use crate::spec::HostBind;
use crate::task::phases::Phases;
use crate::vm::pod_vm::{BootRequest, ImagePod, NotShared, PodHold, PodVm, SharedVm, VmBooter};
use crate::Error;

/// The PID the fake agent gives every process.
pub const GUEST_PID: u32 = 42;
/// The fake VM's QEMU PID.
pub const HOST_PID: u32 = 4242;
/// The memory.current the fake agent reports for every container.
pub const GUEST_STATS_MEMORY: u64 = 7 << 20;

/// A request in protobuf's text format, as the fakes record it.
fn text(request: &dyn protobuf::MessageDyn) -> String {
    protobuf::text_format::print_to_string(request)
}

/// The calls a fake received, in order.
#[derive(Default)]
pub struct Calls(Mutex<Vec<String>>);

impl Calls {
    /// How many calls start with `prefix`.
    fn count(&self, prefix: &str) -> usize {
        self.starting(prefix).len()
    }

    /// The calls that start with `prefix`, in order.
    fn starting(&self, prefix: &str) -> Vec<String> {
        let calls = self.0.lock().unwrap();
        calls
            .iter()
            .filter(|c| c.starts_with(prefix))
            .cloned()
            .collect()
    }
}

/// How a fake process ends: its exit, or the agent's connection breaking under its wait.
type ExitSender = watch::Sender<Option<Result<GuestExit, String>>>;

/// A guest that records each call; a process ends when [`FakeGuest::exit`] says so.
#[derive(Default)]
pub struct FakeGuest {
    pub calls: Calls,
    exits: Mutex<HashMap<ProcessId, ExitSender>>,
    /// While set, start_process waits for [`FakeGuest::release_start`].
    pub hold_start: AtomicBool,
    start_released: Notify,
    /// The next start_process fails with this (FAILED_PRECONDITION: the agent refused;
    /// AGENT_LOST: it did not answer).
    pub fail_start: Mutex<Option<Error>>,
    /// The next create_container fails with this.
    pub refuse_create: Mutex<Option<String>>,
    /// Whether a SIGKILL ends the process (a compromised or stuck guest ignores it).
    pub obeys_sigkill: AtomicBool,
    /// What stands in for an agent where a pod has none (a VM image, a hold): the agent's
    /// own calls are refused, as the real kinds refuse them.
    pub no_agent: bool,
}

impl FakeGuest {
    fn record(&self, call: String) {
        self.calls.0.lock().unwrap().push(call);
    }

    fn exit_sender(&self, process: &ProcessId) -> watch::Sender<Option<Result<GuestExit, String>>> {
        self.exits
            .lock()
            .unwrap()
            .entry(process.clone())
            .or_insert_with(|| watch::channel(None).0)
            .clone()
    }

    /// Ends `process` in the guest with `status`.
    pub fn exit(&self, process: &ProcessId, status: u32, oom_killed: bool) {
        let exit = GuestExit { status, oom_killed };
        self.exit_sender(process).send_replace(Some(Ok(exit)));
    }

    /// Breaks the agent's connection under a waiting `process`.
    pub fn lose(&self, process: &ProcessId) {
        self.exit_sender(process)
            .send_replace(Some(Err("connection reset".into())));
    }

    pub fn release_start(&self) {
        self.start_released.notify_one();
    }

    pub fn called(&self, prefix: &str) -> usize {
        self.calls.count(prefix)
    }

    /// The calls that start with `prefix`, each with its request in text format.
    pub fn requests(&self, prefix: &str) -> Vec<String> {
        self.calls.starting(prefix)
    }
}

#[async_trait]
impl Guest for FakeGuest {
    fn agent(&self) -> Result<&dyn AgentCalls, NoAgent> {
        match self.no_agent {
            true => Err(NoAgent("a fake pod without an agent".into())),
            false => Ok(self),
        }
    }

    async fn create_container(&self, request: &CreateContainerRequest) -> Result<u32, Error> {
        self.record(format!("create_container {}", request.container_id));
        match self.refuse_create.lock().unwrap().take() {
            Some(why) => Err(Error::FailedPrecondition(why)),
            None => Ok(GUEST_PID),
        }
    }

    async fn start_process(&self, process: &ProcessId) -> Result<u32, Error> {
        self.record(format!("start_process {process:?}"));
        if self.hold_start.load(Ordering::SeqCst) {
            self.start_released.notified().await;
        }
        match self.fail_start.lock().unwrap().take() {
            Some(e) => Err(e),
            None => Ok(GUEST_PID),
        }
    }

    async fn wait_process(&self, process: &ProcessId) -> Result<GuestExit, Error> {
        let mut exit = self.exit_sender(process).subscribe();
        let ended = exit
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::AgentLost("fake guest dropped".into()))?
            .clone();
        ended.expect("waited for Some").map_err(Error::AgentLost)
    }

    async fn signal_process(
        &self,
        process: &ProcessId,
        signal: u32,
        _all: bool,
    ) -> Result<(), Error> {
        self.record(format!("signal_process {process:?} {signal}"));
        if signal == libc::SIGKILL as u32 && self.obeys_sigkill.load(Ordering::SeqCst) {
            self.exit(process, 128 + signal, false);
        }
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<(), Error> {
        self.record(format!("remove_container {container_id}"));
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), Error> {
        self.record("shutdown".into());
        Ok(())
    }
}

#[async_trait]
impl AgentCalls for FakeGuest {
    async fn create_exec(&self, request: &CreateExecRequest) -> Result<(), Error> {
        self.record(format!("create_exec {}", text(request)));
        Ok(())
    }

    async fn remove_exec(&self, process: &ProcessId) -> Result<(), Error> {
        self.record(format!("remove_exec {process:?}"));
        Ok(())
    }

    async fn pause(&self, container_id: &str) -> Result<(), Error> {
        self.record(format!("pause {container_id}"));
        Ok(())
    }

    async fn resume(&self, container_id: &str) -> Result<(), Error> {
        self.record(format!("resume {container_id}"));
        Ok(())
    }

    async fn update_resources(
        &self,
        container_id: &str,
        resources: Resources,
    ) -> Result<(), Error> {
        self.record(format!(
            "update_resources {container_id} {}",
            text(&resources)
        ));
        Ok(())
    }

    async fn stats(&self, _container_id: &str) -> Result<StatsResponse, Error> {
        Ok(StatsResponse {
            memory_current: GUEST_STATS_MEMORY,
            ..Default::default()
        })
    }

    async fn list_processes(&self, container_id: &str) -> Result<Vec<u32>, Error> {
        self.record(format!("list_processes {container_id}"));
        Ok(vec![GUEST_PID, GUEST_PID + 1])
    }

    async fn resize_terminal(
        &self,
        process: &ProcessId,
        width: u32,
        height: u32,
    ) -> Result<(), Error> {
        self.record(format!(
            "resize_terminal {}/{} {width}x{height}",
            process.container_id, process.exec_id
        ));
        Ok(())
    }
}

/// A pod VM that runs until the test (or the shim's kill/teardown) ends it.
pub struct FakeVm {
    pub guest: Arc<FakeGuest>,
    pub calls: Calls,
    ended: watch::Sender<bool>,
    stopping: AtomicBool,
    /// Given when this is a VM-mode pod's sandbox (the booter's hold).
    pub image_pod: Option<ImagePod>,
    /// A VM image's VM (a VM-mode pod's container's): its containers share nothing.
    pub image: bool,
}

impl Default for FakeVm {
    fn default() -> Self {
        Self {
            guest: Arc::new(FakeGuest {
                obeys_sigkill: AtomicBool::new(true),
                ..FakeGuest::default()
            }),
            calls: Calls::default(),
            ended: watch::channel(false).0,
            stopping: AtomicBool::new(false),
            image_pod: None,
            image: false,
        }
    }
}

impl FakeVm {
    /// A VM-mode pod's sandbox, holding `pod`: no agent, nothing shared.
    pub fn holding(pod: ImagePod) -> Self {
        Self {
            image_pod: Some(pod),
            ..Self::without_agent()
        }
    }

    /// A VM image's VM, as a VM-mode pod's container boots it: no agent, nothing shared.
    pub fn of_image() -> Self {
        Self {
            image: true,
            ..Self::without_agent()
        }
    }

    fn without_agent() -> Self {
        Self {
            guest: Arc::new(FakeGuest {
                obeys_sigkill: AtomicBool::new(true),
                no_agent: true,
                ..FakeGuest::default()
            }),
            ..Self::default()
        }
    }

    /// QEMU exits (crash, OOM on the host, a guest that powered off).
    pub fn end(&self) {
        self.ended.send_replace(true);
    }

    fn record(&self, call: String) {
        self.calls.0.lock().unwrap().push(call);
    }

    pub fn called(&self, prefix: &str) -> usize {
        self.calls.count(prefix)
    }
}

#[async_trait]
impl PodVm for FakeVm {
    fn pod_id(&self) -> &str {
        "fake-pod"
    }

    fn guest(&self) -> &dyn Guest {
        &*self.guest
    }

    fn host_pid(&self) -> u32 {
        HOST_PID
    }

    fn holder_pid(&self) -> Option<u32> {
        None
    }

    fn has_ended(&self) -> bool {
        *self.ended.borrow()
    }

    async fn ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    async fn kill(&self) -> Result<(), Error> {
        self.record("kill".into());
        self.stopping.store(true, Ordering::SeqCst);
        self.end();
        Ok(())
    }

    async fn teardown(&self) -> Result<(), Error> {
        self.record("teardown".into());
        self.stopping.store(true, Ordering::SeqCst);
        self.end();
        Ok(())
    }

    /// A hold and a VM image's VM share nothing, as the real ones; any other is shared.
    fn shared(&self) -> Result<&dyn SharedVm, NotShared> {
        match (&self.image_pod, self.image) {
            (None, false) => Ok(self),
            _ => Err(NotShared(
                "a fake pod whose VM its containers do not share".into(),
            )),
        }
    }

    async fn attach_stdio(
        &self,
        _process: ProcessName<'_>,
        _namespace: &str,
        _paths: &StdioPaths,
        _terminal: bool,
    ) -> Result<Copies, Error> {
        Ok(Copies::default())
    }

    fn image_pod(&self) -> Option<&ImagePod> {
        self.image_pod.as_ref()
    }
}

#[async_trait]
impl SharedVm for FakeVm {
    async fn fit_memory(&self, container_id: &str, limit_mib: Option<u64>) -> Result<(), Error> {
        self.record(format!("fit_memory {container_id} {limit_mib:?}"));
        Ok(())
    }

    async fn attach_block_devices(
        &self,
        _container_id: &str,
        _devices: &[BlockDevice],
    ) -> Result<Vec<vmlet_protocol::agent::BlockDevice>, Error> {
        Ok(Vec::new())
    }

    async fn detach_block_devices(&self, container_id: &str) -> Result<(), Error> {
        self.record(format!("detach_block_devices {container_id}"));
        Ok(())
    }

    fn add_container(
        &self,
        container_id: &str,
        _rootfs: &RootfsSource,
        _binds: &[HostBind],
    ) -> Result<(), Error> {
        self.record(format!("add_container {container_id}"));
        Ok(())
    }

    fn remove_container(&self, container_id: &str) -> Result<(), Error> {
        self.record(format!("remove_container {container_id}"));
        Ok(())
    }
}

/// Hands out one [`FakeVm`] (a VM-mode pod's sandbox and each VM of its containers get
/// one of their own) and remembers what it was asked to boot and hold.
pub struct FakeBooter {
    pub vm: Arc<FakeVm>,
    pub booted: Mutex<Vec<BootRequest>>,
    /// The VM-mode pods' sandboxes made, with what they were made from.
    pub held: Mutex<Vec<(PodHold, Arc<FakeVm>)>>,
    /// The VMs of VM-mode pods' containers, by container.
    pub own_vms: Mutex<HashMap<String, Arc<FakeVm>>>,
    /// The next boot fails with this.
    pub fail_boot: Mutex<Option<Error>>,
}

impl FakeBooter {
    pub fn new(vm: Arc<FakeVm>) -> Self {
        Self {
            vm,
            booted: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
            own_vms: Mutex::new(HashMap::new()),
            fail_boot: Mutex::new(None),
        }
    }
}

#[async_trait]
impl VmBooter for FakeBooter {
    async fn boot(
        &self,
        _config: &NodeConfig,
        request: BootRequest,
        _phases: &Phases,
    ) -> Result<Arc<dyn PodVm>, Error> {
        if let Some(e) = self.fail_boot.lock().unwrap().take() {
            return Err(e);
        }
        let vm = match &request.sandbox_id {
            Some(_) => {
                let vm = Arc::new(FakeVm::of_image());
                self.own_vms
                    .lock()
                    .unwrap()
                    .insert(request.container_id.clone(), vm.clone());
                vm
            }
            None => self.vm.clone(),
        };
        self.booted.lock().unwrap().push(request);
        Ok(vm)
    }

    async fn hold(&self, _config: &NodeConfig, request: PodHold) -> Result<Arc<dyn PodVm>, Error> {
        let pod = &request.pod;
        let vm = Arc::new(FakeVm::holding(ImagePod::new(
            pod.netns.clone(),
            pod.instance_id.clone(),
            pod.hostname.clone(),
        )));
        self.held.lock().unwrap().push((request, vm.clone()));
        Ok(vm)
    }
}
