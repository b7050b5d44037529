//! A task's create: every check on the bundle first (the [`CreatePlan`]: nothing is made
//! and no hook runs before they pass), then the VM booted (a sandbox) or joined (a
//! container of a running pod), the container created in the guest and its stdio attached.
//! A failure after the checks removes what was made, then runs the poststop hooks, as runc
//! does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use containerd_shim::api;
use containerd_shim_protos::events::task::{TaskCreate, TaskIO};
use containerd_shim_protos::topics;
use oci_spec::runtime::Spec;
use vmlet_config::NodeConfig;
use vmlet_protocol::agent::CreateContainerRequest;

use super::plan::{CreatePlan, RunningPods, Target};
use super::process::Process;
use super::{TaskEntry, TaskService};
use crate::guest::stdio::ProcessName;
use crate::guest::ProcessId;
use crate::spec::hooks::{HookState, HostHooks};
use crate::task::node_counters;
use crate::task::phases::Phases;
use crate::task::pod_metrics::PodMeter;
use crate::vm::pod_vm::PodVm;
use crate::Error;

/// The pod's VM a create's container goes in.
struct InVm {
    vm: Arc<dyn PodVm>,
    pod_id: String,
    /// Whether the create booted (or held) it: a failed create then tears it down.
    owns_vm: bool,
    /// How long a VM the create booted took, and its agent within that.
    booted: Option<(Duration, Option<Duration>)>,
}

impl TaskService {
    /// A task's create; a failed one is counted for the node by its error's code.
    pub(super) async fn create_task(
        &self,
        req: api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, Error> {
        let created = self.create(req).await;
        if let Err(e) = &created {
            if let Ok(config) = (self.config)() {
                node_counters::count_failure(&config.state_dir, e).await;
            }
        }
        created
    }

    async fn create(&self, req: api::CreateTaskRequest) -> Result<api::CreateTaskResponse, Error> {
        if self.tasks.lock().unwrap().contains_key(&req.id) {
            return Err(Error::AlreadyExists(format!("task {}", req.id)));
        }
        let phases = Phases::start(format!("create {}", req.id));
        let config = (self.config)()?;
        let spec = crate::spec::bundle::load(Path::new(&req.bundle))?;
        phases.mark("config");
        let plan = CreatePlan::new(&req, &spec, &config, self)?;
        phases.mark("plan");
        let own_pid_namespace = plan.own_pid_namespace();
        let CreatePlan {
            paths,
            hooks,
            mut hook_state,
            mut agent_request,
            memory_limit,
            block_devices,
            target,
        } = plan;
        let claimed = claim_pod(&target, &req.id)?;
        // From here a failure removes what was created, then runs the poststop hooks.
        let created = async {
            let in_vm = self
                .bring_up(&config, &req.id, target, &hooks, &hook_state, &phases)
                .await?;
            if in_vm.owns_vm {
                // The hooks from here on get the host process the new VM (or hold) started.
                hook_state.pid = in_vm.vm.holder_pid().unwrap_or(0);
            }
            let start = ContainerStart {
                req: &req,
                memory_limit,
                block_devices: &block_devices,
                paths: &paths,
                phases: &phases,
            };
            match self
                .start_container(&in_vm.vm, start, &mut agent_request)
                .await
            {
                Ok((guest_pid, copies)) => Ok((in_vm, guest_pid, copies)),
                Err(e) => {
                    undo_start(&in_vm.vm, &req.id, in_vm.owns_vm).await;
                    Err(e)
                }
            }
        }
        .await;
        let (in_vm, guest_pid, copies) = match created {
            Ok(created) => created,
            Err(e) => {
                if let Some(pod) = claimed.as_ref().and_then(|p| p.image_pod()) {
                    pod.release(&req.id);
                }
                crate::spec::hooks::run_logged(&hooks.poststop, &hook_state, "stopped").await;
                return Err(e);
            }
        };
        self.record_vm(&req.id, &spec, &config, &in_vm);
        if let Some((boot, _)) = in_vm.booted {
            node_counters::count_boot(&config.state_dir, boot).await;
        }
        let InVm {
            vm,
            pod_id,
            owns_vm,
            ..
        } = in_vm;
        // containerd is told the VM's host PID (QEMU's), never the guest's: a PID the
        // guest chose means nothing on the host (and could name a host process).
        let pid = vm.host_pid();
        log::info!(
            "{}: guest PID {guest_pid}; reported as QEMU's, {pid}",
            req.id
        );
        phases.log();
        let init = Process::new(ProcessId::init(&req.id), pid, paths, req.terminal, copies);
        let entry = Arc::new(TaskEntry {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            hooks,
            hook_state,
            vm,
            pod_id,
            owns_vm,
            own_pid_namespace,
            init: Arc::new(init),
            execs: Mutex::new(HashMap::new()),
        });
        self.tasks.lock().unwrap().insert(req.id.clone(), entry);
        self.publish_created(&req, pid);
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    /// The pod's VM for the container: booted, held, or joined (the create hooks run, the
    /// container's share added).
    async fn bring_up(
        &self,
        config: &NodeConfig,
        id: &str,
        target: Target,
        hooks: &HostHooks,
        hook_state: &HookState,
        phases: &Phases,
    ) -> Result<InVm, Error> {
        Ok(match target {
            Target::Boot { boot, pod_id, .. } => {
                let vm = self.booter.boot(config, *boot, phases).await?;
                InVm {
                    vm,
                    pod_id,
                    owns_vm: true,
                    booted: Some((phases.elapsed(), phases.took("guest_boot"))),
                }
            }
            Target::Hold(hold) => {
                let vm = self.booter.hold(config, *hold).await?;
                phases.mark("hold");
                InVm {
                    vm,
                    pod_id: id.to_owned(),
                    owns_vm: true,
                    booted: None,
                }
            }
            Target::Join {
                vm,
                sandbox_id,
                rootfs,
                binds,
            } => {
                vm.check_running()?;
                let shared = vm
                    .shared()
                    .map_err(|n| n.refuse(&format!("another container, {id},"), &sandbox_id))?;
                crate::spec::hooks::run(&hooks.create, hook_state, "creating").await?;
                shared.add_container(id, &rootfs, &binds)?;
                phases.mark("join");
                InVm {
                    vm,
                    pod_id: sandbox_id,
                    owns_vm: false,
                    booted: None,
                }
            }
        })
    }

    /// A sandbox's VM into the shim's table of pods, and the metrics of a VM the create
    /// booted (when the pod's state directory takes them).
    fn record_vm(&self, id: &str, spec: &Spec, config: &NodeConfig, in_vm: &InVm) {
        if in_vm.pod_id == id {
            self.vms
                .lock()
                .unwrap()
                .insert(in_vm.pod_id.clone(), in_vm.vm.clone());
        }
        let Some((boot, agent_ready)) = in_vm.booted else {
            return;
        };
        let names =
            crate::spec::pod_names(id, &crate::spec::bundle::annotations(spec), &self.namespace);
        let pod_id = in_vm.vm.pod_id();
        let dir = crate::host::pod_paths::PodPaths::new(&config.state_dir, pod_id).dir;
        use crate::task::metrics_dir;
        // Every pod's QEMU has the QEMU user's groups: the figures are not theirs to read.
        if let Ok(qemu) = crate::host::pod_user::PodUser::shared(config) {
            if qemu.gid == config.metrics_gid || qemu.groups.contains(&config.metrics_gid) {
                log::warn!(
                    "{pod_id}: no metrics: metrics_gid {} is a group of qemu_user {}, which every pod's QEMU has",
                    config.metrics_gid,
                    config.qemu_user
                );
                return;
            }
        }
        if let Err(e) = metrics_dir::prepare(&config.state_dir, config.metrics_gid) {
            log::warn!("{pod_id}: no metrics: {}", e.message());
            return;
        }
        let socket = metrics_dir::socket(&config.state_dir, pod_id);
        if let Some(meter) = PodMeter::start(&in_vm.vm, &dir, socket, names, boot, agent_ready) {
            self.meters.lock().unwrap().insert(id.to_owned(), meter);
        }
    }

    /// The container in its pod's VM: the VM grown to its memory limit, its block devices
    /// attached, the container created by the agent, its stdio connected. Returns the
    /// guest's PID of its init and the stdio copies.
    async fn start_container(
        &self,
        vm: &Arc<dyn PodVm>,
        start: ContainerStart<'_>,
        agent_request: &mut CreateContainerRequest,
    ) -> Result<(u32, crate::guest::stdio::Copies), Error> {
        let ContainerStart {
            req,
            memory_limit,
            block_devices,
            paths,
            phases,
        } = start;
        match vm.shared() {
            Ok(shared) => {
                shared.fit_memory(&req.id, memory_limit).await?;
                agent_request.block_devices =
                    shared.attach_block_devices(&req.id, block_devices).await?;
            }
            Err(not_shared) if !block_devices.is_empty() => {
                let what = format!("block devices for {}", req.id);
                return Err(not_shared.refuse(&what, vm.pod_id()));
            }
            // A VM image's size is its annotations': a memory limit does not grow it.
            Err(_) => {}
        }
        phases.mark("devices");
        let pid = vm.guest().create_container(agent_request).await?;
        phases.mark("container");
        let name = ProcessName {
            container_id: &req.id,
            exec_id: "",
        };
        let copies = vm
            .attach_stdio(name, &self.namespace, paths, req.terminal)
            .await?;
        phases.mark("stdio");
        Ok((pid, copies))
    }

    /// containerd's TaskCreate event for the created task `req`, whose PID is `pid`.
    fn publish_created(&self, req: &api::CreateTaskRequest, pid: u32) {
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
        );
    }
}

/// The facts a plan takes in: the sandboxes of this shim's table.
impl RunningPods for TaskService {
    fn so_far(&self, sandbox_id: &str) -> Option<crate::spec::PodSoFar> {
        let tasks = self.tasks.lock().unwrap();
        let sandbox = tasks.get(sandbox_id)?;
        Some(crate::spec::PodSoFar {
            sandbox_pid: sandbox.init.pid,
            own_pid_namespaces: tasks
                .values()
                .any(|t| t.pod_id == sandbox_id && !t.is_sandbox() && t.own_pid_namespace),
        })
    }

    fn vm(&self, sandbox_id: &str) -> Result<Arc<dyn PodVm>, Error> {
        self.vms
            .lock()
            .unwrap()
            .get(sandbox_id)
            .cloned()
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "pod sandbox {sandbox_id} (its VM is not in this shim)"
                ))
            })
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// A VM-mode pod's container `id` claims its pod (which has room for one) and returns the
/// pod's sandbox, whose claim a failed create gives back.
fn claim_pod(target: &Target, id: &str) -> Result<Option<Arc<dyn PodVm>>, Error> {
    let Target::Boot {
        pod: Some(pod),
        pod_id,
        ..
    } = target
    else {
        return Ok(None);
    };
    if let Some(image_pod) = pod.image_pod() {
        image_pod.claim(pod_id, id)?;
    }
    Ok(Some(pod.clone()))
}

/// What [`TaskService::start_container`] needs of the create besides the VM.
struct ContainerStart<'a> {
    req: &'a api::CreateTaskRequest,
    memory_limit: Option<u64>,
    block_devices: &'a [crate::devices::block_devices::BlockDevice],
    paths: &'a crate::guest::stdio::StdioPaths,
    phases: &'a Phases,
}

/// Undoes a container start that failed: the whole VM when the create booted it, else
/// the container's part of its pod's VM (errors logged: the start's error is the one told).
async fn undo_start(vm: &Arc<dyn PodVm>, id: &str, owns_vm: bool) {
    let cleanup = if owns_vm {
        vm.teardown().await
    } else {
        let _ = vm.guest().remove_container(id).await;
        match vm.shared() {
            Ok(shared) => {
                if let Err(e) = shared.detach_block_devices(id).await {
                    log::error!("{id}: {}", e.message());
                }
                shared.remove_container(id)
            }
            // Nothing of the container was put in a VM that is not shared.
            Err(_) => Ok(()),
        }
    };
    if let Err(cleanup) = cleanup {
        log::error!("cleanup after failed create of {id}: {}", cleanup.message());
    }
}
