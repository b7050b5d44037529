//! A task's create: every check on the bundle first (nothing is made and no hook runs
//! before they pass), then the VM booted (a sandbox) or joined (a container of a running
//! pod), the container created in the guest and its stdio attached. A failure after the
//! checks removes what was made, then runs the poststop hooks, as runc does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use containerd_shim::api;
use containerd_shim_protos::events::task::{TaskCreate, TaskIO};
use containerd_shim_protos::topics;
use oci_spec::runtime::Spec;
use vmlet_config::{NodeConfig, PodAnnotations, ShapeSource, VmOptions, VmShape};
use vmlet_protocol::agent::Stdio;

use super::process::Process;
use super::{TaskEntry, TaskService};
use crate::guest::ProcessId;
use crate::hooks::{HookState, HostHooks};
use crate::memory::PodMemory;
use crate::pod_vm::PodVm;
use crate::spec::{HostBind, PodRole};
use crate::stdio::{ProcessName, StdioPaths};
use crate::vm::{BootRequest, RootfsSource};
use crate::Error;

/// Where a created task's container goes: a new VM (sandbox or plain task) or a running
/// pod's VM.
enum PodTarget {
    Boot(Box<BootRequest>),
    Join {
        vm: Arc<dyn PodVm>,
        sandbox_id: String,
        rootfs: RootfsSource,
        binds: Vec<HostBind>,
    },
}

/// The container's root: the bundle's rootfs directory, or the mounts containerd passed.
fn rootfs_source(req: &api::CreateTaskRequest, spec: &Spec, bundle: &Path) -> RootfsSource {
    if !req.rootfs.is_empty() {
        return RootfsSource::Mounts(req.rootfs.to_vec());
    }
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
}

/// A sandbox's VM: its shape from the annotations, the pod's limits and the node's
/// defaults, how its memory may grow, its options, network and cgroup.
#[allow(clippy::too_many_arguments)]
fn boot_request(
    id: &str,
    spec: &Spec,
    annotations: &HashMap<String, String>,
    pod_annotations: &PodAnnotations,
    config: &NodeConfig,
    rootfs: RootfsSource,
    binds: Vec<HostBind>,
    host_process: Option<crate::vm::HostProcess>,
) -> Result<BootRequest, Error> {
    let limits = crate::spec::pod_limits(spec, annotations)?;
    let (shape, sources) = VmShape::resolve(
        &config.guest,
        pod_annotations,
        &limits,
        config.annotations.beyond_limits,
    )?;
    log::info!(
        "pod {id}: {} vCPU ({:?}), {} MiB ({:?}); limits {limits:?}",
        shape.vcpus,
        sources[0],
        shape.memory_mib,
        sources[1],
    );
    // A VM sized by annotation keeps its size; any other can grow to the node's maximum.
    let fixed = sources[1] == ShapeSource::Annotation;
    let region = if fixed {
        0
    } else {
        crate::memory::region_mib(shape.memory_mib, config.guest.max_memory_mib)
    };
    let memory = PodMemory::new(
        shape.memory_mib,
        region,
        config.guest.overhead_memory_mib,
        fixed,
    );
    Ok(BootRequest {
        pod_id: id.into(),
        container_id: id.into(),
        shape,
        memory,
        options: VmOptions::resolve(&config.guest, pod_annotations),
        rootfs,
        binds,
        netns: crate::spec::network_namespace(spec)?,
        host_process,
        cgroup: spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().as_ref())
            .map(|p| crate::pod_cgroup::PodCgroup::from_spec_path(&p.to_string_lossy()))
            .transpose()?,
    })
}

/// The memory limit of a container's spec, in MiB.
fn memory_limit(spec: &Spec) -> Option<u64> {
    crate::memory::limit_mib(
        spec.linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.memory().as_ref())
            .and_then(|m| m.limit()),
    )
}

impl TaskService {
    pub(super) async fn create_task(
        &self,
        req: api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, Error> {
        if self.tasks.lock().unwrap().contains_key(&req.id) {
            return Err(Error::AlreadyExists(format!("task {}", req.id)));
        }
        let config = (self.config)()?;
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
        let hooks = HostHooks::from_spec(&spec)?;
        let mut hook_state = HookState {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            annotations: annotations.clone(),
            pid: 0,
        };
        let (mut agent_request, binds) = crate::spec::create_request(&req.id, &spec, wanted)?;
        let memory_limit = memory_limit(&spec);
        let block_devices = crate::block_devices::from_spec(&spec)?;
        let sandbox_pid = match &role {
            PodRole::Container { sandbox_id } => self
                .tasks
                .lock()
                .unwrap()
                .get(sandbox_id)
                .map(|t| t.init.pid),
            PodRole::Sandbox => None,
        };
        agent_request.join_namespaces = crate::spec::shared_namespaces(&spec, &role, sandbox_pid)?;
        if let PodRole::Container { sandbox_id } = &role {
            agent_request.join_namespaces_of = sandbox_id.clone();
        }
        let rootfs = rootfs_source(&req, &spec, &bundle);
        let target = match role {
            PodRole::Sandbox => PodTarget::Boot(Box::new(boot_request(
                &req.id,
                &spec,
                &annotations,
                &pod_annotations,
                &config,
                rootfs,
                binds,
                (!hooks.is_empty()).then(|| crate::vm::HostProcess {
                    create_hooks: hooks.create.clone(),
                    state: hook_state.clone(),
                }),
            )?)),
            PodRole::Container { sandbox_id } => {
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
        // From here a failure removes what was created, then runs the poststop hooks.
        let created = async {
            let (vm, pod_id) = match target {
                PodTarget::Boot(boot) => {
                    let vm = self.booter.boot(&config, *boot).await?;
                    hook_state.pid = vm.holder_pid().unwrap_or(0);
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
                let pid = vm.guest().create_container(&agent_request).await?;
                let name = ProcessName {
                    container_id: &req.id,
                    exec_id: "",
                };
                let copies = vm
                    .attach_stdio(name, &self.namespace, &paths, req.terminal)
                    .await?;
                Ok::<_, Error>((pid, copies))
            }
            .await;
            match started {
                Ok((pid, copies)) => Ok((vm, pod_id, pid, copies)),
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
        let (vm, pod_id, guest_pid, copies) = match created {
            Ok(v) => v,
            Err(e) => {
                crate::hooks::run_logged(&hooks.poststop, &hook_state, "stopped").await;
                return Err(e);
            }
        };
        if pod_id == req.id {
            self.vms.lock().unwrap().insert(pod_id.clone(), vm.clone());
        }
        // containerd is told the VM's host PID (QEMU's), never the guest's: a PID the
        // guest chose means nothing on the host (and could name a host process).
        let pid = vm.host_pid();
        log::info!(
            "{}: guest PID {guest_pid}; reported as QEMU's, {pid}",
            req.id
        );
        let init = Process::new(ProcessId::init(&req.id), pid, paths, req.terminal, copies);
        let entry = Arc::new(TaskEntry {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            hooks,
            hook_state,
            vm,
            pod_id,
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
}
