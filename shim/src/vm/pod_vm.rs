//! The pod's VM as the task service uses it, behind small traits: [`PodVm`] (any kind of
//! pod: its guest, its host PIDs, its end, stdio), [`SharedVm`] (what only a VM its pod's
//! containers share does: the containers' share, memory and block devices; the other kinds
//! say why they have none, [`NotShared`]) and [`VmBooter`] (how a sandbox's create gets
//! one, from a [`BootRequest`], or a VM-mode pod's sandbox its [`PodHold`]).
//! [`crate::vm::Vm`] booted by [`crate::vm::LibvirtBooter`] is the real one; the task
//! service's unit tests put fakes behind them, so that every lifecycle rule is tested
//! without a VM.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use vmlet_config::{NodeConfig, VmOptions, VmShape};

use crate::devices::block_devices::BlockDevice;
use crate::devices::memory::PodMemory;
use crate::guest::stdio::{Copies, ProcessName, StdioPaths};
use crate::guest::Guest;
use crate::host::share::RootfsSource;
use crate::spec::HostBind;
use crate::task::phases::Phases;
use crate::Error;

/// Exit status of every process of a pod whose VM ended under it (QEMU killed or crashed,
/// the guest kernel panicked): 128 + SIGKILL, as if the process had been killed.
pub const VM_ENDED_STATUS: u32 = 137;

/// A booted pod VM with its agent connected.
#[async_trait]
pub trait PodVm: Send + Sync {
    fn pod_id(&self) -> &str;
    /// The pod's agent.
    fn guest(&self) -> &dyn Guest;
    /// QEMU's PID on the host: what containerd is told for every process of the pod.
    fn host_pid(&self) -> u32;
    /// The pod's host process, when the sandbox's spec had OCI hooks.
    fn holder_pid(&self) -> Option<u32>;
    /// Whether QEMU is gone.
    fn has_ended(&self) -> bool;
    /// Resolves when QEMU is gone.
    async fn ended(&self);
    /// Whether the shim is stopping the VM itself (its end is then expected).
    fn is_stopping(&self) -> bool;
    /// The exit status of a process whose VM ended under it: 137 (as if killed), unless
    /// the VM's end is the process's own (a VM image that powered itself off: 0).
    fn end_status(&self) -> u32 {
        VM_ENDED_STATUS
    }
    /// Ends the VM at once; every process of the pod then ends with status 137.
    async fn kill(&self) -> Result<(), Error>;
    /// Stops the VM and removes everything the pod created.
    async fn teardown(&self) -> Result<(), Error>;
    /// The side of the VM its containers share (vmlet's guest: memory, block devices,
    /// containers in the share); else why this kind of pod has none.
    fn shared(&self) -> Result<&dyn SharedVm, NotShared>;
    /// Connects a process's stdio (containerd's FIFOs or log URI) to its guest streams.
    async fn attach_stdio(
        &self,
        process: ProcessName<'_>,
        namespace: &str,
        paths: &StdioPaths,
        terminal: bool,
    ) -> Result<Copies, Error>;

    /// The VM's figures from its host cgroup, for a pod whose guest has no agent to ask
    /// (a VM image: QEMU's use is the VM's); none for the other kinds.
    fn host_stats(&self) -> Option<Result<vmlet_protocol::agent::StatsResponse, Error>> {
        None
    }

    /// The VM-mode pod this is the sandbox of, when it is one ([`PodHold`]): its one
    /// container boots the VM.
    fn image_pod(&self) -> Option<&ImagePod> {
        None
    }

    /// Refuses a call into the guest once the VM has ended (it would wait for an agent that
    /// is gone).
    fn check_running(&self) -> Result<(), Error> {
        if self.has_ended() {
            return Err(Error::FailedPrecondition(format!(
                "the VM of pod {} has stopped",
                self.pod_id()
            )));
        }
        Ok(())
    }
}

/// The side of a pod's VM its containers share: vmlet's guest, which runs every container
/// of the pod. A VM image (its one container is the VM) and a VM-mode pod's hold (it runs
/// nothing) have none ([`NotShared`]).
#[async_trait]
pub trait SharedVm: Send + Sync {
    /// Grows the VM when it must to hold `container_id`'s memory limit (MiB; none:
    /// unlimited) beside the other containers', then records the limit.
    async fn fit_memory(&self, container_id: &str, limit_mib: Option<u64>) -> Result<(), Error>;
    /// Hot-plugs a container's block devices; what the agent needs to find them.
    async fn attach_block_devices(
        &self,
        container_id: &str,
        devices: &[BlockDevice],
    ) -> Result<Vec<vmlet_protocol::agent::BlockDevice>, Error>;
    /// Unplugs what [`SharedVm::attach_block_devices`] attached for `container_id`.
    async fn detach_block_devices(&self, container_id: &str) -> Result<(), Error>;
    /// Puts another container of the pod (rootfs and binds) into the running VM's share.
    fn add_container(
        &self,
        container_id: &str,
        rootfs: &RootfsSource,
        binds: &[HostBind],
    ) -> Result<(), Error>;
    /// Removes a container's rootfs and binds from the share and forgets its memory limit.
    fn remove_container(&self, container_id: &str) -> Result<(), Error>;
}

/// Why a pod has no VM its containers share ([`PodVm::shared`]): the end of a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotShared(pub String);

impl NotShared {
    /// UNIMPLEMENTED: `what` cannot be had in pod `pod_id`, for this reason.
    pub fn refuse(&self, what: &str, pod_id: &str) -> Error {
        Error::Unimplemented(format!("{what} in pod {pod_id}: {}", self.0))
    }
}

/// Boots a sandbox's VM.
#[async_trait]
pub trait VmBooter: Send + Sync {
    /// Boots the pod's VM; on failure nothing it created is left.
    /// Marks each of its steps in `phases`.
    async fn boot(
        &self,
        config: &NodeConfig,
        request: BootRequest,
        phases: &Phases,
    ) -> Result<Arc<dyn PodVm>, Error>;

    /// Makes a VM-mode pod's sandbox ([`PodHold`]): the pod's host process in its network
    /// namespace and cgroup, and no VM; on failure nothing it created is left.
    async fn hold(&self, config: &NodeConfig, request: PodHold) -> Result<Arc<dyn PodVm>, Error>;
}

/// What to boot: the pod, its first container's rootfs, its shape and network.
pub struct BootRequest {
    pub pod_id: String,
    pub container_id: String,
    pub shape: VmShape,
    /// How the VM may grow to hold its containers' memory limits.
    pub memory: PodMemory,
    /// Machine type, CPU model, kernel parameters, disk driver.
    pub options: VmOptions,
    pub rootfs: RootfsSource,
    /// Host paths the container bind-mounts, bound into the share before the VM starts.
    pub binds: Vec<crate::spec::HostBind>,
    /// The pod network namespace to carry into the VM (none: no NIC, unless the pod's
    /// host process gets a new namespace that hooks fill).
    pub netns: Option<PathBuf>,
    /// Given when the spec has OCI hooks that run on the host.
    pub host_process: Option<HostProcess>,
    /// The host cgroup (the sandbox spec's `cgroupsPath`) every host process of the VM
    /// goes into; none: they stay where libvirt and the shim put them.
    pub cgroup: Option<crate::host::pod_cgroup::PodCgroup>,
    /// A VM image to boot instead of vmlet's guest (`vmlet.io/image-type: vm`; see
    /// docs/vm-mode.md); its disk is under `/disk/` of the rootfs.
    pub image: Option<ImageRequest>,
    /// The pod whose one container this VM is (a VM-mode CRI pod: the shim's id is the
    /// sandbox's); none when the VM is its own pod's.
    pub sandbox_id: Option<String>,
    /// What an operator knows the pod by (its record, [`crate::host::pod_record`]).
    pub names: crate::host::pod_record::PodNames,
}

/// A VM-mode CRI pod's sandbox (docs/vm-mode.md): the VM image comes with the pod's one
/// container, so the sandbox boots nothing. It holds the pod's network namespace with the
/// pod's host process (the sandbox's PID), in the pod's cgroup, and what cloud-init will
/// know the pod by.
pub struct PodHold {
    pub pod_id: String,
    /// The pod network namespace CNI set up (none: a new one, which the hooks fill).
    pub netns: Option<PathBuf>,
    pub cgroup: Option<crate::host::pod_cgroup::PodCgroup>,
    /// The sandbox's create hooks, run with the host process's PID.
    pub create_hooks: Vec<oci_spec::runtime::Hook>,
    pub hook_state: crate::spec::hooks::HookState,
    pub pod: ImagePod,
}

/// What a VM-mode pod's sandbox gives its one container's VM.
#[derive(Debug)]
pub struct ImagePod {
    /// The pod network namespace the VM's taps are wired to.
    pub netns: Option<PathBuf>,
    /// cloud-init's instance id (the pod's UID) and the VM's host name (the pod's).
    pub instance_id: String,
    pub hostname: String,
    /// The container whose VM the pod runs, once one was created: a VM-mode pod has one.
    container: std::sync::Mutex<Option<String>>,
}

impl ImagePod {
    pub fn new(netns: Option<PathBuf>, instance_id: String, hostname: String) -> Self {
        Self {
            netns,
            instance_id,
            hostname,
            container: std::sync::Mutex::new(None),
        }
    }

    /// Makes `container_id` the pod's one container; an error names the one it has.
    pub fn claim(&self, pod_id: &str, container_id: &str) -> Result<(), Error> {
        let mut container = self.container.lock().unwrap();
        match &*container {
            Some(other) if other != container_id => Err(Error::FailedPrecondition(format!(
                "pod {pod_id} is a VM-mode pod (vmlet.io/image-type: vm) whose VM is container {other}: it has no room for {container_id}"
            ))),
            _ => {
                *container = Some(container_id.to_owned());
                Ok(())
            }
        }
    }

    /// Frees the pod for another container once `container_id` is gone.
    pub fn release(&self, container_id: &str) {
        let mut container = self.container.lock().unwrap();
        if container.as_deref() == Some(container_id) {
            *container = None;
        }
    }
}

/// What a VM-mode pod's VM is booted with, besides its image's disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRequest {
    /// The root disk's size (MiB; none: the image's disk's).
    pub root_volume_mib: Option<u64>,
    /// cloud-init's instance id (the pod's UID) and host name.
    pub instance_id: String,
    pub hostname: String,
    pub user_data: Option<String>,
    /// `VirtletCloudInitUserDataScript`: the whole user-data, not a cloud-config.
    pub user_data_script: Option<String>,
    /// `VirtletCloudInitUserDataOverwrite`: the pod's user-data keys replace vmlet's.
    pub user_data_overwrite: bool,
    /// `VirtletCloudInitMetaData`: meta-data keys over vmlet's (a JSON object's text).
    pub meta_data: Option<String>,
    /// NoCloud or a config drive (`VirtletCloudInitImageType`).
    pub seed_source: vmlet_config::SeedSource,
    pub ssh_keys: Vec<String>,
    /// The container spec's environment (`NAME=value`).
    pub env: Vec<String>,
    /// The resolv.conf containerd wrote for the pod (its DNS); none: no DNS.
    pub resolv_conf: Option<PathBuf>,
    /// Whether the seed has a network-config (without one, the image uses DHCP).
    pub network_config: bool,
    /// How the root disk is attached (the pod's `vmlet.io/disk-driver`, else virtio).
    pub root_bus: crate::vmm::vm_spec::RootBus,
    /// SeaBIOS or OVMF (`vmlet.io/firmware`).
    pub firmware: vmlet_config::Firmware,
    /// The container's block devices (Kubernetes `volumeDevices`), plugged in as disks of
    /// the VM on the pod's disk driver, each with its serial ([`BlockDevice::named`]).
    pub disks: Vec<BlockDevice>,
    /// The container's filesystem volumes, which the seed mounts in the guest.
    pub volumes: Vec<crate::vm_mode::volumes::GuestVolume>,
    /// The block volume the root lives on (`vmlet.io/root-volume`), not among `disks`.
    pub root_volume: Option<BlockDevice>,
}

/// The pod's host process (see [`crate::host::netns_holder`]): started before the VM in the pod
/// network namespace (a new one when the spec's has no path), then `create_hooks` run with
/// its PID in `state`.
pub struct HostProcess {
    pub create_hooks: Vec<oci_spec::runtime::Hook>,
    pub state: crate::spec::hooks::HookState,
}
