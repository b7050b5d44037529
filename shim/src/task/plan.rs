//! A task's create as a plan: the create request, its bundle's spec, the node config and
//! what the shim knows of its running pods ([`RunningPods`]) in, everything the create
//! will do out, checked before anything is made ([`CreatePlan::new`] makes nothing and
//! starts nothing). Where the container goes is a new VM ([`Target::Boot`] with its
//! [`BootRequest`]: a sandbox, a plain task, or a VM-mode pod's container with what its
//! sandbox holds), a VM-mode pod's hold ([`Target::Hold`]) or a running pod's VM
//! ([`Target::Join`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use containerd_shim::api;
use oci_spec::runtime::Spec;
use vmlet_config::{ImageType, NodeConfig, PodAnnotations, ShapeSource, VmOptions, VmShape};
use vmlet_protocol::agent::{CreateContainerRequest, Stdio};

use crate::devices::block_devices::BlockDevice;
use crate::devices::memory::PodMemory;
use crate::guest::stdio::StdioPaths;
use crate::host::share::RootfsSource;
use crate::spec::hooks::{HookState, HostHooks};
use crate::spec::{HostBind, PodRole, PodSoFar};
use crate::vm::pod_vm::{BootRequest, HostProcess, PodHold, PodVm};
use crate::Error;

use super::plan_vm_image::{check_virtlet_image, image_request, in_image_pod, pod_hold};

/// What the shim knows of its running pods: the facts a container's plan takes in.
pub(super) trait RunningPods {
    /// What a container's namespaces need of the running sandbox `sandbox_id`.
    fn so_far(&self, sandbox_id: &str) -> Option<PodSoFar>;
    /// The running sandbox `sandbox_id`'s VM (or, for a VM-mode pod, its hold).
    fn vm(&self, sandbox_id: &str) -> Result<Arc<dyn PodVm>, Error>;
    /// containerd's namespace of the shim's tasks.
    fn namespace(&self) -> &str;
}

/// Where the container goes.
pub(super) enum Target {
    /// A new VM, for the pod `pod_id`: a sandbox's or a plain task's (its own id), or a
    /// VM-mode CRI pod's container's, booted with what the running sandbox `pod` holds
    /// ([`ImagePod`]: the pod's network namespace and identity).
    Boot {
        boot: Box<BootRequest>,
        pod_id: String,
        pod: Option<Arc<dyn PodVm>>,
    },
    /// A VM-mode CRI pod's sandbox: no VM, the pod held for its one container.
    Hold(Box<PodHold>),
    /// The running VM of pod `sandbox_id`.
    Join {
        vm: Arc<dyn PodVm>,
        sandbox_id: String,
        rootfs: RootfsSource,
        binds: Vec<HostBind>,
    },
}

/// Everything a task's create does, decided before anything is made.
pub(super) struct CreatePlan {
    pub paths: StdioPaths,
    pub hooks: HostHooks,
    /// The state the hooks get. Its PID is the pod's host process: a joined pod's; a VM the
    /// create boots or holds starts its own, whose PID the create gives the later hooks.
    pub hook_state: HookState,
    /// The container as the agent creates it (its block devices are filled in when they
    /// are attached).
    pub agent_request: CreateContainerRequest,
    /// The container's memory limit (MiB), which the VM must hold.
    pub memory_limit: Option<u64>,
    pub block_devices: Vec<BlockDevice>,
    pub target: Target,
}

impl CreatePlan {
    /// Whether the container gets a PID namespace of its own (it joins no other's).
    pub fn own_pid_namespace(&self) -> bool {
        !self
            .agent_request
            .join_namespaces
            .iter()
            .any(|n| n == "pid")
    }

    /// Plans the create of `req` from its bundle's `spec` under `config`. `pods` tells
    /// what the shim knows of its running sandboxes (a container joins one's namespaces and
    /// VM). Bad input (annotations, stdio, hooks, devices, the spec, a pod that is not
    /// there) is an error that names it.
    pub fn new(
        req: &api::CreateTaskRequest,
        spec: &Spec,
        config: &NodeConfig,
        pods: &dyn RunningPods,
    ) -> Result<Self, Error> {
        let annotations = crate::spec::bundle::annotations(spec);
        let pod_annotations = PodAnnotations::from_map(&annotations, &config.annotations.allowed)?;
        let vm_image = pod_annotations.image_type == Some(ImageType::Vm);
        check_virtlet_image(&req.id, &annotations, vm_image)?;
        // A CRI sandbox (not a plain task, which has no role annotation).
        let cri_sandbox = annotations.contains_key(crate::spec::CONTAINER_TYPE_ANNOTATION);
        let role = crate::spec::pod_role(&annotations)?;
        let (paths, wanted) = stdio(req)?;
        let hooks = HostHooks::from_spec(spec)?;
        let mut hook_state = HookState {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            annotations: annotations.clone(),
            pid: 0,
        };
        let (mut agent_request, binds) = crate::spec::create_request(&req.id, spec, wanted)?;
        let memory_limit = crate::spec::bundle::memory_limit_mib(spec);
        let block_devices = crate::spec::devices::block_devices(spec)?;
        let pod = match &role {
            PodRole::Container { sandbox_id } => pods.so_far(sandbox_id),
            PodRole::Sandbox => None,
        };
        agent_request.join_namespaces = crate::spec::shared_namespaces(spec, &role, pod)?;
        if let PodRole::Container { sandbox_id } = &role {
            agent_request.join_namespaces_of = sandbox_id.clone();
        }
        let rootfs = rootfs_source(req, spec, Path::new(&req.bundle));
        // A new VM: its image's, when the task carries a VM image.
        let new_vm = |rootfs: RootfsSource, binds: Vec<HostBind>| -> Result<BootRequest, Error> {
            let mut boot = boot_request(
                &req.id,
                spec,
                &annotations,
                &pod_annotations,
                config,
                rootfs,
                binds,
                crate::spec::pod_names(&req.id, &annotations, pods.namespace()),
                (!hooks.is_empty()).then(|| HostProcess {
                    create_hooks: hooks.create.clone(),
                    state: hook_state.clone(),
                }),
            )?;
            if vm_image {
                // A cloud image's disks are virtio's unless the pod says: its volumes go
                // on the root disk's bus.
                boot.options.disk_driver = pod_annotations
                    .disk_driver
                    .unwrap_or(vmlet_config::DiskDriver::Virtio);
                let mut image = image_request(&req.id, spec, &pod_annotations, &block_devices)?;
                // The runtime's own files (hosts, resolv.conf, termination-log) are not put
                // in the share: the guest has its own.
                boot.binds = crate::vm_mode::volumes::guest_binds(
                    &agent_request.mounts,
                    std::mem::take(&mut boot.binds),
                );
                image.volumes = crate::vm_mode::volumes::from_mounts(
                    &req.id,
                    &agent_request.mounts,
                    &boot.binds,
                );
                boot.image = Some(image);
            }
            Ok(boot)
        };
        let target = match role {
            PodRole::Sandbox if vm_image && cri_sandbox => {
                Target::Hold(Box::new(pod_hold(&req.id, spec, &hooks, &hook_state)?))
            }
            PodRole::Sandbox => Target::Boot {
                boot: Box::new(new_vm(rootfs, binds)?),
                pod_id: req.id.clone(),
                pod: None,
            },
            PodRole::Container { sandbox_id } if vm_image => {
                let mut boot = new_vm(rootfs, binds)?;
                let pod = pods.vm(&sandbox_id)?;
                in_image_pod(&req.id, &sandbox_id, &*pod, &mut boot)?;
                Target::Boot {
                    boot: Box::new(boot),
                    pod_id: sandbox_id,
                    pod: Some(pod),
                }
            }
            PodRole::Container { sandbox_id } => {
                let vm = joinable(&req.id, &sandbox_id, pods)?;
                if !hooks.is_empty() {
                    hook_state.pid = host_process_of(&*vm, &sandbox_id)?;
                }
                Target::Join {
                    vm,
                    sandbox_id,
                    rootfs,
                    binds,
                }
            }
        };
        Ok(CreatePlan {
            paths,
            hooks,
            hook_state,
            agent_request,
            memory_limit,
            // A VM image's are its own disks, plugged in by its boot (`ImageRequest`).
            block_devices: if vm_image { Vec::new() } else { block_devices },
            target,
        })
    }
}

/// The task's stdio paths (checked) and which streams the agent makes for them.
fn stdio(req: &api::CreateTaskRequest) -> Result<(StdioPaths, Stdio), Error> {
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
    Ok((paths, wanted))
}

/// The running VM of pod `sandbox_id`, which container `id` (not a VM image) joins: a
/// VM-mode pod's container is a VM image.
fn joinable(id: &str, sandbox_id: &str, pods: &dyn RunningPods) -> Result<Arc<dyn PodVm>, Error> {
    let vm = pods.vm(sandbox_id)?;
    if vm.image_pod().is_some() {
        return Err(Error::FailedPrecondition(format!(
            "container {id} of pod {sandbox_id}: a VM-mode pod's (vmlet.io/image-type: vm) container is a VM image, and this one is not"
        )));
    }
    Ok(vm)
}

/// The host process of the running pod `sandbox_id` (its `vm`), which a joining
/// container's hooks get.
fn host_process_of(vm: &dyn PodVm, sandbox_id: &str) -> Result<u32, Error> {
    vm.holder_pid().ok_or_else(|| {
        Error::Unimplemented(format!(
            "OCI hooks on a container of pod {sandbox_id}, whose sandbox has none (no host process to give them)"
        ))
    })
}

/// The container's root: the bundle's rootfs directory, or the mounts containerd passed.
fn rootfs_source(req: &api::CreateTaskRequest, spec: &Spec, bundle: &Path) -> RootfsSource {
    if !req.rootfs.is_empty() {
        return RootfsSource::Mounts(req.rootfs.to_vec());
    }
    RootfsSource::Dir(crate::spec::bundle::root(spec, bundle))
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
    names: crate::host::pod_record::PodNames,
    host_process: Option<HostProcess>,
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
        crate::devices::memory::region_mib(shape.memory_mib, config.guest.max_memory_mib)
    };
    let memory = PodMemory::new(
        shape.memory_mib,
        region,
        config.guest.overhead_memory_mib,
        fixed,
    );
    let cgroup = crate::spec::bundle::cgroup(spec)?;
    if let Some(limit) = cgroup.as_ref().and_then(|c| c.memory_limit_mib()) {
        crate::host::pod_cgroup::vm_fits(id, shape.memory_mib, limit)?;
    }
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
        cgroup,
        image: None,
        sandbox_id: None,
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use crate::vm::pod_vm::ImagePod;
    use crate::vmm::vm_spec::RootBus;

    use crate::spec::{
        CONTAINER_TYPE_ANNOTATION, SANDBOX_ID_ANNOTATION, SANDBOX_NAME_ANNOTATION,
        SANDBOX_UID_ANNOTATION,
    };
    use serde_json::json;

    const NETNS: &str = "/run/netns/cni-1";

    /// A bundle's spec with `annotations` and a memory limit (bytes), in the pod namespace.
    fn spec(annotations: serde_json::Value, memory_limit: Option<i64>) -> Spec {
        let mut linux = json!({
            "namespaces": [
                {"type": "network", "path": NETNS},
                {"type": "mount"}, {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}
            ],
            "cgroupsPath": "kubepods-pod1.slice:cri-containerd:p1"
        });
        if let Some(limit) = memory_limit {
            linux["resources"] = json!({"memory": {"limit": limit}});
        }
        serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"},
            "annotations": annotations,
            "linux": linux
        }))
        .unwrap()
    }

    fn request(id: &str) -> api::CreateTaskRequest {
        api::CreateTaskRequest {
            id: id.into(),
            bundle: format!("/run/bundles/{id}"),
            stdout: "/run/fifo/out".into(),
            ..Default::default()
        }
    }

    /// A shim that runs no sandbox.
    struct NoPods;

    impl RunningPods for NoPods {
        fn so_far(&self, _: &str) -> Option<PodSoFar> {
            None
        }

        fn vm(&self, sandbox_id: &str) -> Result<Arc<dyn PodVm>, Error> {
            Err(Error::NotFound(format!("pod sandbox {sandbox_id}")))
        }

        fn namespace(&self) -> &str {
            "default"
        }
    }

    /// A shim running sandbox `p1`, which reported PID 42, its containers sharing its PID
    /// namespace, with its `vm`.
    struct Pod42 {
        vm: Arc<crate::task::fakes::FakeVm>,
    }

    impl RunningPods for Pod42 {
        fn so_far(&self, sandbox_id: &str) -> Option<PodSoFar> {
            (sandbox_id == "p1").then_some(PodSoFar {
                sandbox_pid: 42,
                own_pid_namespaces: false,
            })
        }

        fn vm(&self, sandbox_id: &str) -> Result<Arc<dyn PodVm>, Error> {
            match sandbox_id {
                "p1" => Ok(self.vm.clone()),
                _ => NoPods.vm(sandbox_id),
            }
        }

        fn namespace(&self) -> &str {
            "default"
        }
    }

    /// The boot a plan's target is (which must be one).
    fn boot_of(target: Target) -> (Box<BootRequest>, String, bool) {
        match target {
            Target::Boot { boot, pod_id, pod } => (boot, pod_id, pod.is_some()),
            _ => panic!("the plan boots no VM"),
        }
    }

    #[test]
    fn a_sandbox_boots_a_vm_sized_by_its_annotations() {
        let config = NodeConfig::default();
        let spec = spec(
            json!({"vmlet.io/memory": "1.5Gi", "vmlet.io/vcpus": "2"}),
            None,
        );
        let plan = CreatePlan::new(&request("p1"), &spec, &config, &NoPods).unwrap();
        let (boot, pod_id, in_pod) = boot_of(plan.target);
        assert_eq!((pod_id.as_str(), in_pod), ("p1", false));
        assert_eq!(
            (boot.pod_id.as_str(), boot.container_id.as_str()),
            ("p1", "p1")
        );
        assert_eq!((boot.shape.vcpus, boot.shape.memory_mib), (2, 1536));
        // Sized by annotation: it keeps that size.
        assert_eq!(boot.memory.region_mib, 0);
        assert_eq!(boot.netns.as_deref(), Some(Path::new(NETNS)));
        let RootfsSource::Dir(rootfs) = &boot.rootfs else {
            panic!("no mounts were passed: the bundle's rootfs");
        };
        assert_eq!(rootfs, Path::new("/run/bundles/p1/rootfs"));
        assert!(boot.cgroup.is_some());
        assert!(boot.host_process.is_none(), "no hooks, no host process");
        assert!(plan.agent_request.join_namespaces.is_empty());
        assert!(plan.paths.stdin.is_empty());
    }

    #[test]
    fn a_vm_mode_task_boots_its_image_with_the_seed_inputs() {
        let config = NodeConfig::default();
        let mut vm = spec(
            json!({"vmlet.io/image-type": "vm", "vmlet.io/ssh-keys": "ssh-ed25519 AAAA",
                   "vmlet.io/root-volume-size": "4Gi",
                   "vmlet.io/cloud-init-user-data": "runcmd: [true]"}),
            None,
        );
        vm.set_hostname(Some("web-0".into()));
        let mut process = vm.process().clone().unwrap();
        process.set_env(Some(vec!["A=1".into()]));
        vm.set_process(Some(process));
        let plan = CreatePlan::new(&request("v1"), &vm, &config, &NoPods).unwrap();
        let (boot, _, _) = boot_of(plan.target);
        let image = boot.image.expect("a VM image");
        assert_eq!(image.instance_id, "v1");
        assert_eq!(image.hostname, "web-0");
        assert_eq!(image.root_volume_mib, Some(4096));
        assert_eq!(image.user_data.as_deref(), Some("runcmd: [true]"));
        assert_eq!(image.ssh_keys, vec!["ssh-ed25519 AAAA".to_string()]);
        assert_eq!(image.env, vec!["A=1".to_string()]);
        assert!(image.network_config);
        assert_eq!(
            image.root_bus,
            RootBus::Virtio,
            "a cloud image's root is vda"
        );
        assert!(boot.sandbox_id.is_none());
        assert!(image.disks.is_empty());
        let container = spec(json!({"vmlet.io/image-type": "container"}), None);
        let plan = CreatePlan::new(&request("c1"), &container, &config, &NoPods).unwrap();
        let (boot, _, _) = boot_of(plan.target);
        assert!(boot.image.is_none());
    }

    #[test]
    fn a_virtlet_image_name_needs_a_vm_mode_pod_which_virtlets_annotation_makes() {
        let config = NodeConfig::default();
        let image = json!({"io.kubernetes.cri.image-name": "virtlet.cloud/cirros"});
        let err = CreatePlan::new(&request("c1"), &spec(image.clone(), None), &config, &NoPods)
            .err()
            .unwrap();
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(
            err.to_string()
                .contains("kubernetes.io/target-runtime: virtlet.cloud"),
            "{err}"
        );
        let mut virtlet = image;
        virtlet["kubernetes.io/target-runtime"] = json!("virtlet.cloud");
        let plan = CreatePlan::new(&request("v1"), &spec(virtlet, None), &config, &NoPods).unwrap();
        let (boot, _, _) = boot_of(plan.target);
        assert!(boot.image.is_some(), "booted as a VM image");
    }

    #[test]
    fn a_vm_images_block_devices_are_its_disks_named_by_their_paths() {
        let config = NodeConfig::default();
        let mut vm = spec(json!({"vmlet.io/image-type": "vm"}), None);
        let device = |path: &str| {
            serde_json::from_value::<oci_spec::runtime::LinuxDevice>(
                json!({"path": path, "type": "b", "major": 7, "minor": 3}),
            )
            .unwrap()
        };
        let mut linux = vm.linux().clone().unwrap();
        linux.set_devices(Some(vec![device("/dev/data")]));
        vm.set_linux(Some(linux.clone()));
        let plan = CreatePlan::new(&request("v1"), &vm, &config, &NoPods).unwrap();
        assert!(plan.block_devices.is_empty(), "no agent takes them");
        let (boot, _, _) = boot_of(plan.target);
        let disks = boot.image.expect("a VM image").disks;
        assert_eq!(disks.len(), 1);
        assert_eq!(disks[0].serial.as_deref(), Some("data"));
        assert_eq!(
            boot.options.disk_driver,
            vmlet_config::DiskDriver::Virtio,
            "on the root disk's bus"
        );
        linux.set_devices(Some(vec![device("/dev/a/data"), device("/dev/b/data")]));
        vm.set_linux(Some(linux.clone()));
        let err = CreatePlan::new(&request("v1"), &vm, &config, &NoPods)
            .err()
            .unwrap();
        assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
        let five: Vec<_> = (0..5).map(|n| device(&format!("/dev/d{n}"))).collect();
        linux.set_devices(Some(five));
        vm.set_linux(Some(linux));
        let err = CreatePlan::new(&request("v1"), &vm, &config, &NoPods)
            .err()
            .unwrap();
        assert!(err.to_string().contains("at most 4 on virtio"), "{err}");
    }

    #[test]
    fn a_root_volume_is_taken_out_of_the_disks_or_refused_naming_why() {
        let config = NodeConfig::default();
        // Each path its own loop device (the data volume 7:1, the root 7:2).
        let device = |path: &str, access: &str| {
            let minor = if path.ends_with("data") { 1 } else { 2 };
            serde_json::from_value::<oci_spec::runtime::LinuxDevice>(
                json!({"path": path, "type": "b", "major": 7, "minor": minor}),
            )
            .map(|d| (d, access.to_owned()))
            .unwrap()
        };
        let plan_of =
            |annotations: serde_json::Value,
             devices: Vec<(oci_spec::runtime::LinuxDevice, String)>| {
                let mut vm = spec(annotations, None);
                let mut linux = vm.linux().clone().unwrap();
                let rules = devices
                .iter()
                .map(|(d, access)| {
                    serde_json::from_value(json!({"allow": access != "rm", "type": "b", "major": d.major(), "minor": d.minor(), "access": if access == "rm" { "w" } else { access }}))
                        .unwrap()
                })
                .collect::<Vec<oci_spec::runtime::LinuxDeviceCgroup>>();
                linux.set_devices(Some(devices.into_iter().map(|(d, _)| d).collect()));
                let mut resources = linux.resources().clone().unwrap_or_default();
                resources.set_devices(Some(rules));
                linux.set_resources(Some(resources));
                vm.set_linux(Some(linux));
                CreatePlan::new(&request("v1"), &vm, &config, &NoPods)
            };
        let root = json!({"vmlet.io/image-type": "vm", "vmlet.io/root-volume": "root"});
        let plan = plan_of(
            root.clone(),
            vec![device("/dev/root", "rwm"), device("/dev/data", "rwm")],
        )
        .unwrap();
        let (boot, _, _) = boot_of(plan.target);
        let image = boot.image.expect("a VM image");
        assert_eq!(image.root_volume.unwrap().path, "/dev/root");
        assert_eq!(image.disks.len(), 1, "the other volume is a disk");
        let refused = |annotations: serde_json::Value, devices| {
            let err = plan_of(annotations, devices).err().unwrap();
            assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT, "{err}");
            err.to_string()
        };
        let err = refused(root.clone(), vec![device("/dev/data", "rwm")]);
        assert!(
            err.contains("no block device whose path ends in \"root\"")
                && err.contains("/dev/data"),
            "{err}"
        );
        let err = refused(root.clone(), vec![device("/dev/root", "rm")]);
        assert!(err.contains("read-only"), "{err}");
        let nvme = json!({"vmlet.io/image-type": "vm", "vmlet.io/root-volume": "root", "vmlet.io/disk-driver": "nvme"});
        let err = refused(nvme, vec![device("/dev/root", "rwm")]);
        assert!(err.contains("not nvme"), "{err}");
        // Virtlet's spelling: the block device at /.
        let virtlet = json!({"vmlet.io/image-type": "vm"});
        let plan = plan_of(
            virtlet,
            vec![device("/", "rwm"), device("/dev/data", "rwm")],
        )
        .unwrap();
        let (boot, _, _) = boot_of(plan.target);
        let image = boot.image.expect("a VM image");
        assert_eq!(image.root_volume.unwrap().path, "/");
        assert_eq!(image.disks.len(), 1);
        let err = refused(
            root.clone(),
            vec![device("/", "rwm"), device("/dev/root", "rwm")],
        );
        assert!(err.contains("both name the root volume"), "{err}");
        let twice = json!({"vmlet.io/image-type": "vm", "vmlet.io/root-volume": "root"});
        let err = refused(
            twice,
            vec![device("/dev/root", "rwm"), device("/dev/vm/root2", "rwm")],
        );
        assert!(err.contains("one host device (7:2)"), "{err}");
        let sized = json!({"vmlet.io/image-type": "vm", "VirtletRootVolumeSize": "4Gi"});
        let err = refused(sized, vec![device("/", "rwm")]);
        assert!(err.contains("that volume's size"), "{err}");
    }

    #[test]
    fn a_vm_mode_cri_sandbox_holds_the_pod_with_its_identity() {
        let config = NodeConfig::default();
        let mut vm = spec(
            json!({"vmlet.io/image-type": "vm", CONTAINER_TYPE_ANNOTATION: "sandbox",
                   SANDBOX_UID_ANNOTATION: "uid-1", SANDBOX_NAME_ANNOTATION: "web"}),
            None,
        );
        let plan = CreatePlan::new(&request("p1"), &vm, &config, &NoPods).unwrap();
        let Target::Hold(hold) = plan.target else {
            panic!("a VM-mode CRI sandbox boots nothing");
        };
        assert_eq!(hold.pod_id, "p1");
        assert_eq!(hold.netns.as_deref(), Some(Path::new(NETNS)));
        assert_eq!(hold.pod.netns.as_deref(), Some(Path::new(NETNS)));
        assert!(hold.cgroup.is_some());
        assert_eq!(
            (hold.pod.instance_id.as_str(), hold.pod.hostname.as_str()),
            ("uid-1", "web"),
            "the pod's UID and, without a host name, its name"
        );
        vm.set_hostname(Some("web-0".into()));
        let plan = CreatePlan::new(&request("p1"), &vm, &config, &NoPods).unwrap();
        let Target::Hold(hold) = plan.target else {
            panic!("a VM-mode CRI sandbox boots nothing");
        };
        assert_eq!(hold.pod.hostname, "web-0", "the spec's host name first");
    }

    #[test]
    fn a_vm_mode_cri_container_boots_its_own_vm_in_its_pod() {
        let config = NodeConfig::default();
        let mut container = spec(
            json!({"vmlet.io/image-type": "vm", CONTAINER_TYPE_ANNOTATION: "container",
                   SANDBOX_ID_ANNOTATION: "p1",
                   "vmlet.io/cloud-init-network-config": "none"}),
            None,
        );
        // The CRI plugin's resolv.conf for the pod (a bind's source must exist).
        let resolv_conf =
            std::env::temp_dir().join(format!("vmlet-plan-resolv-{}.conf", std::process::id()));
        std::fs::write(&resolv_conf, "nameserver 10.0.0.10\n").unwrap();
        let mut mounts = container.mounts().clone().unwrap_or_default();
        mounts.push(
            serde_json::from_value(json!({"destination": "/etc/resolv.conf",
                "source": resolv_conf, "type": "bind", "options": ["rbind", "ro"]}))
            .unwrap(),
        );
        container.set_mounts(Some(mounts));
        // A running sandbox that is not a VM-mode pod's has no room for a VM image.
        let plain = Pod42 {
            vm: Arc::new(crate::task::fakes::FakeVm::default()),
        };
        let err = CreatePlan::new(&request("c1"), &container, &config, &plain)
            .err()
            .expect("refused");
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(
            err.message().contains("not a VM-mode pod"),
            "{}",
            err.message()
        );
        // The VM-mode pod's sandbox holds its namespace and identity.
        let held = Pod42 {
            vm: Arc::new(crate::task::fakes::FakeVm::holding(ImagePod::new(
                Some(PathBuf::from("/run/netns/pod")),
                "uid-1".into(),
                "web-0".into(),
            ))),
        };
        let plain_container = spec(
            json!({CONTAINER_TYPE_ANNOTATION: "container", SANDBOX_ID_ANNOTATION: "p1"}),
            None,
        );
        let err = CreatePlan::new(&request("c2"), &plain_container, &config, &held)
            .err()
            .expect("refused");
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(
            err.message().contains("this one is not"),
            "{}",
            err.message()
        );
        let plan = CreatePlan::new(&request("c1"), &container, &config, &held).unwrap();
        let (boot, pod_id, in_pod) = boot_of(plan.target);
        assert_eq!((pod_id.as_str(), in_pod), ("p1", true));
        assert_eq!(boot.sandbox_id.as_deref(), Some("p1"));
        assert_eq!(
            (boot.pod_id.as_str(), boot.container_id.as_str()),
            ("c1", "c1")
        );
        assert_eq!(boot.netns.as_deref(), Some(Path::new("/run/netns/pod")));
        let image = boot.image.expect("a VM image");
        assert_eq!(
            (image.instance_id.as_str(), image.hostname.as_str()),
            ("uid-1", "web-0")
        );
        assert_eq!(image.resolv_conf.as_deref(), Some(resolv_conf.as_path()));
        std::fs::remove_file(&resolv_conf).unwrap();
        assert!(!image.network_config, "network-config: none");
    }

    #[test]
    fn a_vm_sized_without_annotations_may_grow_to_the_node_maximum() {
        let config = NodeConfig::default();
        let spec = spec(json!({}), Some(64 << 20));
        let plan = CreatePlan::new(&request("t1"), &spec, &config, &NoPods).unwrap();
        assert_eq!(plan.memory_limit, Some(64));
        let (boot, _, _) = boot_of(plan.target);
        assert!(boot.memory.region_mib > 0);
    }

    #[test]
    fn a_container_of_a_pod_joins_its_vm_and_namespaces() {
        let config = NodeConfig::default();
        let mut spec = spec(
            json!({CONTAINER_TYPE_ANNOTATION: "container", SANDBOX_ID_ANNOTATION: "p1"}),
            None,
        );
        // The sandbox's namespaces, as the CRI plugin gives them.
        let linux = spec.linux().clone().unwrap();
        let namespaces: Vec<_> = linux
            .namespaces()
            .clone()
            .unwrap()
            .into_iter()
            .map(|mut n| {
                let name = match n.typ() {
                    oci_spec::runtime::LinuxNamespaceType::Ipc => "ipc",
                    oci_spec::runtime::LinuxNamespaceType::Uts => "uts",
                    _ => return n,
                };
                n.set_path(Some(PathBuf::from(format!("/proc/42/ns/{name}"))));
                n
            })
            .collect();
        let mut linux = linux;
        linux.set_namespaces(Some(namespaces));
        spec.set_linux(Some(linux));
        let pods = Pod42 {
            vm: Arc::new(crate::task::fakes::FakeVm::default()),
        };
        let plan = CreatePlan::new(&request("c1"), &spec, &config, &pods).unwrap();
        let Target::Join { sandbox_id, .. } = &plan.target else {
            panic!("a container joins its pod's VM");
        };
        assert_eq!(sandbox_id, "p1");
        assert_eq!(plan.agent_request.join_namespaces_of, "p1");
        let mut joined = plan.agent_request.join_namespaces.clone();
        joined.sort();
        assert_eq!(joined, ["ipc", "uts"]);
        assert_eq!(plan.hook_state.id, "c1");
    }

    #[test]
    fn bad_input_is_refused_by_name_before_anything_is_made() {
        let config = NodeConfig::default();
        let refused = |spec: &Spec, req: &api::CreateTaskRequest| {
            CreatePlan::new(req, spec, &config, &NoPods)
                .err()
                .expect("refused")
        };
        let err = refused(
            &spec(json!({"vmlet.io/kernel-params": "x"}), None),
            &request("p"),
        );
        assert_eq!(err.code(), ttrpc::Code::PERMISSION_DENIED);
        assert!(
            err.message().contains("vmlet.io/kernel-params"),
            "{}",
            err.message()
        );
        let err = refused(
            &spec(json!({"vmlet.io/memory": "lots"}), None),
            &request("p"),
        );
        assert!(
            err.message().contains("vmlet.io/memory"),
            "{}",
            err.message()
        );
        let err = refused(
            &spec(json!({CONTAINER_TYPE_ANNOTATION: "container"}), None),
            &request("c"),
        );
        assert!(
            err.message().contains(SANDBOX_ID_ANNOTATION),
            "{}",
            err.message()
        );
        let mut bad_stdout = request("p");
        bad_stdout.stdout = "ftp:///x".into();
        let err = refused(&spec(json!({}), None), &bad_stdout);
        assert!(err.message().contains("ftp"), "{}", err.message());
        let mut host_net = spec(json!({}), None);
        let mut linux = host_net.linux().clone().unwrap();
        linux.set_namespaces(Some(Vec::new()));
        host_net.set_linux(Some(linux));
        let err = refused(&host_net, &request("p"));
        assert_eq!(err.code(), ttrpc::Code::UNIMPLEMENTED);
    }
}
