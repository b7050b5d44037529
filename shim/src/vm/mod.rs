//! One pod's VM: state directory, shared directory, vsock backend, libvirt domain, agent.
//! Everything created is recorded in [`PodState`]'s undo journal first
//! ([`crate::host::undo`]) and removed by [`crate::host::reclaim::teardown`].
//!
//! [`Vm::boot`] makes the pod's state directory and runs [`boot::run`], the boot read
//! top-down: the host side ([`host_setup`]: cgroup, log tmpfs, share, the pod's host process
//! and its hooks), the network ([`net`]: taps wired to the pod namespace's interfaces), the
//! vsock backend ([`vsock_backend`]), the agent's key ([`agent_link`]), the accelerator
//! ([`accel`]), the domain and vmlet's QMP monitor ([`launch`]), then the agent and the
//! guest's network ([`agent_link`]) and port-forwarding into the guest. When a step fails, what the steps
//! recorded is torn down before the error returns.
//!
//! The pod kinds, each a [`PodVm`] the task service drives: [`agent_vm`] (vmlet's guest with
//! its agent: this [`Vm`]), [`image_vm`] (a VM image booted from its own disk, with
//! [`image_guest`] for its one process) and [`pod_hold`] (a VM-mode pod's sandbox, which
//! boots nothing).

mod accel;
mod agent_link;
mod agent_vm;
mod boot;
#[cfg(test)]
mod boot_tests;
mod direct_image;
mod direct_start;
#[cfg(test)]
mod fake_qemu;
mod helper_log;
mod host_setup;
mod image_exec;
mod image_guest;
mod image_vm;
mod launch;
mod net;
mod pod_hold;
mod pod_virtiofsd;
pub(crate) mod pod_vm;
mod template_start;
mod vsock_backend;

use std::sync::{Arc, Mutex};

use vmlet_config::{NodeConfig, VmShape};

use crate::devices::hotplug::Hotplug;
use crate::devices::memory::PodMemory;
use crate::guest::vsock::Endpoint;
use crate::guest::{AgentGuest, Guest};
use crate::host::pod_paths::PodPaths;
pub use crate::host::share::RootfsSource;
use crate::host::state::PodState;
use crate::host::undo::{Made, ProcessId};
use crate::task::phases::Phases;
pub use crate::vm::pod_vm::{BootRequest, HostProcess};
use crate::vm::pod_vm::{PodHold, PodVm, VmBooter};
use crate::vmm::VmManager;
use crate::Error;
pub use agent_link::connect_agent;

/// A booted VM with its agent connected.
pub struct Vm {
    pub pod_id: String,
    pub paths: PodPaths,
    pub endpoint: Endpoint,
    /// The agent's calls ([`Vm::guest`]).
    guest: Arc<dyn Guest>,
    pub boot_id: String,
    /// QEMU's PID on the host: what containerd is told for every process of the pod.
    pub host_pid: u32,
    /// vCPUs and memory the VM was booted with (memory can grow: [`Vm::fit_memory`]).
    pub shape: VmShape,
    /// The pod's host process, when the sandbox's spec had OCI hooks.
    pub holder_pid: Option<u32>,
    state: Mutex<PodState>,
    vmm: Arc<dyn VmManager>,
    /// Serves the tap fds to vmlet-vmwrapper; stopping it closes the shim's copies.
    tap_server: Option<net::TapServer>,
    /// Carries connections to the pod namespace's loopback into the guest.
    port_forward: Option<crate::guest::port_forward::PortForward>,
    /// vmlet's QMP monitor, with the block devices hot-plugged through it.
    hotplug: Hotplug,
    /// The containers' memory limits and what the VM holds ([`crate::devices::memory`]).
    memory: Mutex<PodMemory>,
    /// Held while the VM grows: one container's growth at a time.
    growing: tokio::sync::Mutex<()>,
    /// Becomes true when QEMU is gone (its end of vmlet's QMP monitor closed).
    ended: tokio::sync::watch::Receiver<bool>,
    /// Set when the shim itself stops the VM (its end is then expected).
    stopping: std::sync::atomic::AtomicBool,
    /// QEMU, when the shim started it itself (`launcher = "direct"`); dropped, it is
    /// killed.
    _qemu: Option<crate::host::qemu_process::QemuProcess>,
}

/// What the boot steps record in the pod's state as they go (saved at once: a shim that
/// dies mid-boot leaves what [`crate::host::reclaim`] needs to remove it all), and the pod's
/// cgroup that every host process of the VM joins.
struct Recorder<'a> {
    state: Arc<Mutex<PodState>>,
    cgroup: Option<&'a crate::host::pod_cgroup::PodCgroup>,
}

impl Recorder<'_> {
    fn save(&self, f: impl FnOnce(&mut PodState)) -> Result<(), Error> {
        self.try_save(|s| {
            f(s);
            Ok(())
        })
    }

    /// [`Recorder::save`] of a change that may be refused (nothing is saved then).
    fn try_save(&self, f: impl FnOnce(&mut PodState) -> Result<(), Error>) -> Result<(), Error> {
        let mut s = self.state.lock().unwrap();
        f(&mut s)?;
        s.save()
    }

    /// Records what a step is about to make (or, a process, has just started) in the
    /// journal, and saves it.
    fn record(&self, made: Made) -> Result<(), Error> {
        self.save(|s| s.record(made))
    }

    /// Records a helper process the shim has just started (`what`, PID `pid`, its output in
    /// `log`), by its start time, while it is still the shim's child; one that ended already
    /// fails with its log's tail, one that could not be recorded is killed (nothing would
    /// end it).
    fn record_helper(&self, pid: u32, what: &str, log: &std::path::Path) -> Result<(), Error> {
        let process = ProcessId::of_child(pid, what).ok_or_else(|| helper_log::ended(log, what))?;
        self.record(Made::Process(process.clone()))
            .inspect_err(|_| {
                let _ = process.kill();
            })
    }

    /// Records a mount the share or the log directory made.
    fn mount(&self, target: &std::path::Path) -> Result<(), Error> {
        self.record(Made::Mount(target.to_owned()))
    }

    /// Puts a host process of the VM into the pod's cgroup (when it has one).
    fn place(&self, pid: u32, what: &str) -> Result<(), Error> {
        match self.cgroup {
            Some(cgroup) => cgroup.add(pid, what),
            None => Ok(()),
        }
    }
}

/// Runs a blocking call (libvirt, mounts) off the async executor.
pub(crate) async fn block<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task: {e}")))
}

/// Boots [`Vm`]s through libvirt at the config's URI (by way of `vmlet-libvirt`).
pub struct LibvirtBooter;

#[async_trait::async_trait]
impl VmBooter for LibvirtBooter {
    async fn boot(
        &self,
        config: &NodeConfig,
        request: BootRequest,
        phases: &Phases,
    ) -> Result<Arc<dyn PodVm>, Error> {
        let vmm = libvirt(config);
        if request.image.is_some() {
            return Ok(Arc::new(
                image_vm::ImageVm::boot(config, vmm, request, phases).await?,
            ));
        }
        Ok(Arc::new(Vm::boot(config, vmm, request, phases).await?))
    }

    async fn hold(&self, config: &NodeConfig, request: PodHold) -> Result<Arc<dyn PodVm>, Error> {
        Ok(Arc::new(
            pod_hold::HeldPod::make(config, libvirt(config), request).await?,
        ))
    }
}

/// The node's libvirt, through `vmlet-libvirt`.
fn libvirt(config: &NodeConfig) -> Arc<dyn VmManager> {
    Arc::new(crate::vmm::libvirt_helper::LibvirtHelper::new(
        &config.helpers.libvirt,
        &config.libvirt_uri,
    ))
}

impl Vm {
    /// Boots the pod's VM with one container's rootfs in the share and the pod network
    /// wired in. On failure everything created so far is removed before the error returns.
    pub async fn boot(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        req: BootRequest,
        phases: &Phases,
    ) -> Result<Vm, Error> {
        let (paths, state) = new_pod_state(config, &req.pod_id, req.sandbox_id.as_deref()).await?;
        let recorder = Recorder {
            state: state.clone(),
            cgroup: req.cgroup.as_ref(),
        };
        // A failed step drops what it started (the tap server) with the error.
        let booted = match boot::run(config, vmm.clone(), &req, &paths, &recorder, phases).await {
            Ok(booted) => booted,
            Err(e) => return Err(reclaim_failed_boot(&vmm, &state, &req.pod_id, e).await),
        };
        let state = state.lock().unwrap().clone();
        Ok(Vm {
            shape: req.shape,
            holder_pid: state.holder_pid(),
            pod_id: req.pod_id,
            paths,
            endpoint: booted.endpoint,
            guest: Arc::new(AgentGuest::new(booted.agent)),
            boot_id: booted.boot_id,
            host_pid: booted.qemu_pid,
            state: Mutex::new(state),
            vmm,
            tap_server: booted.tap_server,
            port_forward: booted.port_forward,
            hotplug: booted.hotplug,
            memory: Mutex::new(req.memory),
            growing: tokio::sync::Mutex::new(()),
            ended: booted.ended,
            stopping: std::sync::atomic::AtomicBool::new(false),
            _qemu: booted.qemu,
        })
    }
}

/// How long a new pod waits for its lock: held by a removal of what an earlier pod of the
/// id left (`shim delete`, `vmletctl gc`), which is quick, or by a live pod of the id
/// (then the state directory is there and the create is refused).
const POD_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the pod's lock (held by the state until the pod is gone: [`crate::host::pod_lock`]),
/// then makes the pod's state directory (which must not exist) and the state recorded in
/// it; `sandbox_id` names the pod whose shim serves it, when that is not `pod_id`'s.
async fn new_pod_state(
    config: &NodeConfig,
    pod_id: &str,
    sandbox_id: Option<&str>,
) -> Result<(PodPaths, Arc<Mutex<PodState>>), Error> {
    let paths = new_pod_paths(config, pod_id)?;
    let lock = crate::host::pod_lock::take(&config.state_dir, pod_id, POD_LOCK_WAIT).await?;
    made_pod_state(paths, sandbox_id, lock)
}

/// Where pod `pod_id`'s state goes, refused at once where it exists (a live pod of the id
/// holds its lock: not after the wait), with the state directory made passable and closed
/// as pods' need it.
fn new_pod_paths(config: &NodeConfig, pod_id: &str) -> Result<PodPaths, Error> {
    let paths = PodPaths::new(&config.state_dir, pod_id);
    refuse_existing(&paths)?;
    crate::host::pod_paths::make_passable(&config.state_dir)
        .and_then(|()| crate::host::pod_paths::close_state_dir(&config.state_dir))
        .map_err(|e| Error::io(format!("prepare {}", config.state_dir.display()), e))?;
    Ok(paths)
}

/// ALREADY_EXISTS where the pod's state directory is there; naming the live shim of the
/// pod that has the id, and its containerd namespace (vmlet names a pod by its id alone).
fn refuse_existing(paths: &PodPaths) -> Result<(), Error> {
    if !paths.dir.exists() {
        return Ok(());
    }
    let serving = PodState::load(&paths.dir)
        .ok()
        .and_then(|state| crate::host::reclaim::serving_shim(&state));
    Err(Error::AlreadyExists(match serving {
        Some((pid, namespace)) if !namespace.is_empty() => format!(
            "pod state {}: a pod of this id runs (shim {pid}, containerd namespace {namespace}); vmlet names a pod by its id alone, so an id serves one pod per node whatever its namespace",
            paths.dir.display()
        ),
        _ => format!("pod state {}", paths.dir.display()),
    }))
}

/// [`new_pod_state`] once the pod's `lock` is held.
fn made_pod_state(
    paths: PodPaths,
    sandbox_id: Option<&str>,
    lock: crate::host::pod_lock::PodLock,
) -> Result<(PodPaths, Arc<Mutex<PodState>>), Error> {
    refuse_existing(&paths)?;
    std::fs::create_dir(&paths.dir)
        .map_err(|e| Error::io(format!("create {}", paths.dir.display()), e))?;
    let state = Arc::new(Mutex::new(PodState {
        dir: paths.dir.clone(),
        shim_pid: Some(std::process::id()),
        shim_id: sandbox_id.map(str::to_owned),
        lock: crate::host::pod_lock::HeldLock::new(lock),
        ..Default::default()
    }));
    Ok((paths, state))
}

/// Removes what a failed boot recorded and returns its error.
async fn reclaim_failed_boot(
    vmm: &Arc<dyn VmManager>,
    state: &Arc<Mutex<PodState>>,
    pod_id: &str,
    error: Error,
) -> Error {
    let state = state.lock().unwrap().clone();
    let vmm = vmm.clone();
    if let Ok(Err(cleanup)) =
        block(move || crate::host::reclaim::teardown_failed_create(&*vmm, &state)).await
    {
        log::error!(
            "cleanup after failed boot of {pod_id}: {}",
            cleanup.message()
        );
    }
    error
}

/// Ends the VM `state` records at once, if there is one yet: libvirt destroys its domain,
/// or the shim kills the QEMU it started.
async fn end_vm(state: &Mutex<PodState>, vmm: &Arc<dyn VmManager>) -> Result<(), Error> {
    let (domain, qemu) = {
        let state = state.lock().unwrap();
        (state.domain().map(str::to_owned), state.qemu().cloned())
    };
    if let Some(qemu) = qemu {
        block(move || qemu.kill()).await??;
    }
    let Some(domain) = domain else {
        return Ok(());
    };
    let vmm = vmm.clone();
    block(move || vmm.remove(&domain)).await?
}

/// How long a teardown waits for the guest to power itself off.
const POWER_OFF_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Stops `pod`'s VM and removes everything it recorded in `state`. The guest is asked to
/// power itself off first, which is faster than libvirt's destroy (SIGTERM, then waiting
/// for QEMU), which remains the fallback.
async fn power_off_and_reclaim(
    pod: &dyn PodVm,
    state: PodState,
    vmm: Arc<dyn VmManager>,
) -> Result<(), Error> {
    let started = std::time::Instant::now();
    if !pod.has_ended() {
        let asked = tokio::time::timeout(POWER_OFF_WAIT, pod.guest().shutdown()).await;
        if matches!(asked, Ok(Ok(_))) {
            let _ = tokio::time::timeout(POWER_OFF_WAIT, pod.ended()).await;
        }
    }
    let result = block(move || crate::host::reclaim::teardown(&*vmm, &state)).await?;
    log::info!(
        "pod {}: torn down in {} ms",
        pod.pod_id(),
        started.elapsed().as_millis()
    );
    result
}

/// Who the pod's QEMU runs as: a uid of its own ([`crate::host::pod_user`], recorded in its
/// journal first), whichever launcher starts it (libvirt by the domain's static DAC label).
async fn pod_user(
    config: &NodeConfig,
    req: &BootRequest,
    rec: &Recorder<'_>,
) -> Result<crate::host::pod_user::PodUser, Error> {
    crate::host::pod_user::claim(config, &req.pod_id, |uid| rec.record(Made::PodUser(uid))).await
}
