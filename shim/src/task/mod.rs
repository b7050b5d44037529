//! containerd's task API (shim v2) for vmlet. Tasks of one pod share its VM: the sandbox
//! task boots it, container tasks join it. A create is planned first ([`plan`]), then
//! carried out ([`create`]); each RPC is one call of the task service ([`api`]). The
//! files are catalogued once, in docs/design.md ("Crates").

mod api;
pub(crate) mod container_metrics;
mod control;
mod create;
mod delete;
pub(crate) mod events;
mod exec;
pub(crate) mod exit;
pub(crate) mod features;
pub mod metrics_dir;
pub mod node_counters;
pub mod phases;
mod plan;
mod plan_vm_image;
pub mod pod_metrics;
pub(crate) mod process;
pub(crate) mod shim;
mod start;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use containerd_shim::asynchronous::ExitSignal;
use containerd_shim_protos::events::task::TaskExit;
use containerd_shim_protos::protobuf::MessageDyn;
use containerd_shim_protos::topics;

pub use self::api::TaskApi;
pub use self::exit::{AGENT_LOST_STATUS, KILL_GRACE, VM_ENDED_STATUS};
use self::process::Process;
use crate::task::events::EventSink;
use crate::task::pod_metrics::PodMeter;
use crate::vm::pod_vm::{PodVm, VmBooter};
use crate::Error;

/// One task: a container (or the pod's sandbox) with its init and execs.
struct TaskEntry {
    id: String,
    bundle: String,
    /// OCI hooks that run on the host, and the state they read (with the pod's host
    /// process as PID); poststart and poststop run from here.
    hooks: crate::spec::hooks::HostHooks,
    hook_state: crate::spec::hooks::HookState,
    vm: Arc<dyn PodVm>,
    /// The pod (sandbox) this task belongs to; a sandbox's is its own id.
    pod_id: String,
    /// Whether `vm` is this task's own (a sandbox's, a plain task's, a VM-mode pod's
    /// container's), which its delete tears down; else it joined its pod's.
    owns_vm: bool,
    /// Whether the task's init runs in a PID namespace of its own, not its pod's (what
    /// tells CRI's TARGET mode from a shared process namespace).
    own_pid_namespace: bool,
    init: Arc<Process>,
    execs: Mutex<HashMap<String, Arc<Process>>>,
}

impl TaskEntry {
    /// Whether this task is its pod's sandbox (it owns the pod's VM or hold, and goes last).
    fn is_sandbox(&self) -> bool {
        self.pod_id == self.id
    }

    /// The status of the VM's end for `process`, logged unless the shim stopped the VM
    /// itself.
    fn vm_ended_under(&self, process: &Process) -> u32 {
        let status = self.vm.end_status();
        if status == VM_ENDED_STATUS && !self.vm.is_stopping() {
            log::error!(
                "{}: the pod's VM stopped (QEMU exited) while it ran: exit status {VM_ENDED_STATUS}",
                process.name()
            );
        }
        status
    }

    /// Whether the pod's VM has ended or does within [`exit::VM_END_GRACE`] (the agent's
    /// connection can break a moment before QEMU's end is seen).
    async fn vm_ends_within_grace(&self) -> bool {
        tokio::time::timeout(exit::VM_END_GRACE, self.vm.ended())
            .await
            .is_ok()
    }
}

/// Reads the node config (`NodeConfig::load` in production, its `launcher = "auto"` resolved
/// on the node: `crate::vmm::launcher_choice::resolved`).
pub type ConfigSource =
    Arc<dyn Fn() -> Result<vmlet_config::NodeConfig, vmlet_config::Error> + Send + Sync>;

pub struct TaskService {
    namespace: String,
    events: EventSink,
    /// The node config, read for each create (a pod's later containers see its changes).
    config: ConfigSource,
    exit: Arc<ExitSignal>,
    booter: Arc<dyn VmBooter>,
    tasks: Mutex<HashMap<String, Arc<TaskEntry>>>,
    /// The pods' VMs, by sandbox id.
    vms: Mutex<HashMap<String, Arc<dyn PodVm>>>,
    /// The figures of each VM this shim booted, by the id of the task that owns it.
    meters: Mutex<HashMap<String, Arc<PodMeter>>>,
}

impl TaskService {
    pub fn new(
        namespace: &str,
        events: EventSink,
        config: ConfigSource,
        exit: Arc<ExitSignal>,
        booter: Arc<dyn VmBooter>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            events,
            config,
            exit,
            booter,
            tasks: Mutex::new(HashMap::new()),
            vms: Mutex::new(HashMap::new()),
            meters: Mutex::new(HashMap::new()),
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
    fn get(&self, id: &str, exec_id: &str) -> Result<(Arc<TaskEntry>, Arc<Process>), Error> {
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

    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        self.events.publish(topic, event);
    }

    /// Records a process's exit (once) and publishes TaskExit.
    async fn finish(&self, task: &TaskEntry, process: &Process, status: u32) {
        let Some(exit) = process.record_exit(status) else {
            return;
        };
        self.publish(
            topics::TASK_EXIT_EVENT_TOPIC,
            Box::new(TaskExit {
                container_id: task.id.clone(),
                id: process.event_id().into(),
                pid: process.pid,
                exit_status: exit.status,
                exited_at: Some(exit.at).into(),
                ..Default::default()
            }),
        );
    }
}

#[cfg(test)]
pub(crate) mod fakes;
#[cfg(test)]
mod harness;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod reply_tests;
#[cfg(test)]
mod start_kill_tests;
#[cfg(test)]
mod vm_mode_tests;
