//! A task's create: every check on the bundle first (the [`CreatePlan`]: nothing is made
//! and no hook runs before they pass), then the VM booted (a sandbox) or joined (a
//! container of a running pod), the container created in the guest and its stdio attached.
//! A failure after the checks removes what was made, then runs the poststop hooks, as runc
//! does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use containerd_shim::api;
use containerd_shim_protos::events::task::{TaskCreate, TaskIO};
use containerd_shim_protos::topics;
use oci_spec::runtime::Spec;

use super::plan::{CreatePlan, Target};
use super::process::Process;
use super::{TaskEntry, TaskService};
use crate::guest::ProcessId;
use crate::phases::Phases;
use crate::pod_metrics::PodMeter;
use crate::pod_vm::{BootRequest, PodHold, PodVm};
use crate::share::RootfsSource;
use crate::spec::HostBind;
use crate::stdio::ProcessName;
use crate::Error;

/// Where the container goes, its pod's VM found.
enum PodTarget {
    /// A new VM, for the pod `pod_id` (the task's own, or a VM-mode pod's whose sandbox
    /// `pod` holds).
    Boot {
        boot: Box<BootRequest>,
        pod_id: String,
        pod: Option<Arc<dyn PodVm>>,
    },
    Hold(Box<PodHold>),
    Join {
        vm: Arc<dyn PodVm>,
        sandbox_id: String,
        rootfs: RootfsSource,
        binds: Vec<HostBind>,
    },
}

impl TaskService {
    pub(super) async fn create_task(
        &self,
        req: api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, Error> {
        if self.tasks.lock().unwrap().contains_key(&req.id) {
            return Err(Error::AlreadyExists(format!("task {}", req.id)));
        }
        let phases = Phases::start(format!("create {}", req.id));
        let config = (self.config)()?;
        let spec = Spec::load(Path::new(&req.bundle).join("config.json"))
            .map_err(|e| Error::InvalidArgument(format!("read {}/config.json: {e}", req.bundle)))?;
        phases.mark("config");
        let plan = CreatePlan::new(&req, &spec, &config, |sandbox_id| {
            let tasks = self.tasks.lock().unwrap();
            let sandbox = tasks.get(sandbox_id)?;
            Some(crate::spec::PodSoFar {
                sandbox_pid: sandbox.init.pid,
                own_pid_namespaces: tasks
                    .values()
                    .any(|t| t.pod_id == sandbox_id && !t.is_sandbox() && t.own_pid_namespace),
            })
        })?;
        phases.mark("plan");
        let own_pid_namespace = !plan
            .agent_request
            .join_namespaces
            .iter()
            .any(|n| n == "pid");
        let CreatePlan {
            paths,
            hooks,
            mut hook_state,
            mut agent_request,
            memory_limit,
            block_devices,
            target,
        } = plan;
        let target = match target {
            Target::Boot(boot) => PodTarget::Boot {
                boot,
                pod_id: req.id.clone(),
                pod: None,
            },
            Target::Hold(hold) => PodTarget::Hold(hold),
            Target::BootInPod {
                sandbox_id,
                mut boot,
            } => {
                let sandbox = self.sandbox_vm(&sandbox_id)?;
                let pod = sandbox.image_pod().ok_or_else(|| {
                    Error::FailedPrecondition(format!(
                        "container {} is a VM image (vmlet.io/image-type: vm) but its pod {sandbox_id} is not a VM-mode pod: the annotation is the pod's",
                        req.id
                    ))
                })?;
                sandbox.check_running()?;
                pod.claim(&sandbox_id, &req.id)?;
                boot.netns = pod.netns.clone();
                if let Some(image) = boot.image.as_mut() {
                    image.instance_id = pod.instance_id.clone();
                    image.hostname = pod.hostname.clone();
                }
                PodTarget::Boot {
                    boot,
                    pod_id: sandbox_id,
                    pod: Some(sandbox),
                }
            }
            Target::Join {
                sandbox_id,
                rootfs,
                binds,
            } => {
                let vm = self.sandbox_vm(&sandbox_id)?;
                if !hooks.is_empty() {
                    hook_state.pid = vm.holder_pid().ok_or_else(|| {
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
        // A VM-mode pod's claim on its one container goes with a failed create.
        let claimed = match &target {
            PodTarget::Boot { pod: Some(pod), .. } => Some(pod.clone()),
            _ => None,
        };
        // How long a VM this task boots took, and its agent within that.
        let mut booted = None;
        // From here a failure removes what was created, then runs the poststop hooks.
        let created = async {
            let (vm, pod_id, owns_vm) = match target {
                PodTarget::Boot { boot, pod_id, .. } => {
                    let vm = self.booter.boot(&config, *boot, &phases).await?;
                    booted = Some((phases.elapsed(), phases.took("guest_boot")));
                    hook_state.pid = vm.holder_pid().unwrap_or(0);
                    (vm, pod_id, true)
                }
                PodTarget::Hold(hold) => {
                    let vm = self.booter.hold(&config, *hold).await?;
                    phases.mark("hold");
                    hook_state.pid = vm.holder_pid().unwrap_or(0);
                    (vm, req.id.clone(), true)
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
                    phases.mark("join");
                    (vm, sandbox_id, false)
                }
            };
            let started = async {
                vm.fit_memory(&req.id, memory_limit).await?;
                agent_request.block_devices =
                    vm.attach_block_devices(&req.id, &block_devices).await?;
                phases.mark("devices");
                let pid = vm.guest().create_container(&agent_request).await?;
                phases.mark("container");
                let name = ProcessName {
                    container_id: &req.id,
                    exec_id: "",
                };
                let copies = vm
                    .attach_stdio(name, &self.namespace, &paths, req.terminal)
                    .await?;
                phases.mark("stdio");
                Ok::<_, Error>((pid, copies))
            }
            .await;
            match started {
                Ok((pid, copies)) => Ok((vm, pod_id, owns_vm, pid, copies)),
                Err(e) => {
                    let cleanup = if owns_vm {
                        vm.teardown().await
                    } else {
                        let _ = vm.guest().remove_container(&req.id).await;
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
        let (vm, pod_id, owns_vm, guest_pid, copies) = match created {
            Ok(v) => v,
            Err(e) => {
                if let Some(pod) = claimed.as_ref().and_then(|p| p.image_pod()) {
                    pod.release(&req.id);
                }
                crate::hooks::run_logged(&hooks.poststop, &hook_state, "stopped").await;
                return Err(e);
            }
        };
        if pod_id == req.id {
            self.vms.lock().unwrap().insert(pod_id.clone(), vm.clone());
        }
        if let Some((boot, agent_ready)) = booted {
            let annotations = spec.annotations().clone().unwrap_or_default();
            let names = crate::spec::kube_names(&annotations)
                .unwrap_or_else(|| (req.id.clone(), self.namespace.clone()));
            let dir = crate::pod_paths::PodPaths::new(&config.state_dir, vm.pod_id()).dir;
            if let Some(meter) = PodMeter::start(&vm, &dir, names, boot, agent_ready) {
                self.meters.lock().unwrap().insert(req.id.clone(), meter);
            }
        }
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
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    /// The running sandbox `sandbox_id`'s VM (or, for a VM-mode pod, its hold).
    fn sandbox_vm(&self, sandbox_id: &str) -> Result<Arc<dyn PodVm>, Error> {
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
}
