//! One pod's VM: state directory, shared directory, vsock backend, libvirt domain, agent.
//! Everything created is recorded in [`PodState`] first and removed by
//! [`crate::reclaim::teardown`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmlet_config::{Accel, CpuModel, NodeConfig, VmOptions, VmShape, VsockTransport};
use vmlet_protocol::agent::{ConfigureNetworkRequest, NetworkInterface, PingRequest, Route};
use vmlet_protocol::agent_ttrpc::AgentClient;
use vmlet_protocol::AGENT_PORT;

use crate::block_devices::{BlockDevice, Hotplug};
use crate::domain::{Domain, DomainParams, VsockDevice};
use async_trait::async_trait;

use crate::guest::{AgentGuest, Guest};
use crate::memory::{Fit, PodMemory};
use crate::pod_paths::{domain_name, PodPaths};
use crate::pod_vm::PodVm;
use crate::share;
pub use crate::share::RootfsSource;
use crate::state::PodState;
use crate::stdio::{Copies, ProcessName, StdioPaths};
use crate::taps::TapDescription;
use crate::vmm::VmManager;
use crate::vsock::{self, Endpoint};
use crate::Error;

/// virtio-fs tag of the shared directory.
const SHARE_TAG: &str = "vmlet";
/// How long teardown waits for the guest to power itself off.
const POWER_OFF_WAIT: Duration = Duration::from_secs(2);
/// How long QEMU may take to connect vmlet's QMP monitor once libvirt started it.
const QMP_CONNECT_WAIT: Duration = Duration::from_secs(10);

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
    /// Serves the tap fds to vmlet-vmwrapper; aborting it closes the shim's copies.
    tap_server: Option<tokio::task::JoinHandle<()>>,
    /// Carries connections to the pod namespace's loopback into the guest.
    port_forward: Option<crate::port_forward::PortForward>,
    /// vmlet's QMP monitor, with the block devices hot-plugged through it.
    hotplug: Arc<Mutex<Hotplug>>,
    /// The containers' memory limits and what the VM holds ([`crate::memory`]).
    memory: Mutex<PodMemory>,
    /// Held while the VM grows: one container's growth at a time.
    growing: tokio::sync::Mutex<()>,
    /// Becomes true when QEMU is gone (its end of vmlet's QMP monitor closed).
    ended: tokio::sync::watch::Receiver<bool>,
    /// Set when the shim itself stops the VM (its end is then expected).
    stopping: std::sync::atomic::AtomicBool,
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
    pub cgroup: Option<crate::pod_cgroup::PodCgroup>,
}

/// The pod's host process (see [`crate::netns_holder`]): started before the VM in the pod
/// network namespace (a new one when the spec's has no path), then `create_hooks` run with
/// its PID in `state`.
pub struct HostProcess {
    pub create_hooks: Vec<oci_spec::runtime::Hook>,
    pub state: crate::hooks::HookState,
}

/// What the boot steps produced.
struct Booted {
    endpoint: Endpoint,
    agent: AgentClient,
    boot_id: String,
    hotplug: Hotplug,
    ended: tokio::sync::watch::Receiver<bool>,
    qemu_pid: u32,
    port_forward: Option<crate::port_forward::PortForward>,
}

/// Takes the connection of vmlet's QMP monitor, which QEMU makes as it starts, and watches
/// it for QEMU's end: the kernel closes QEMU's side however it ends (killed, crashed, the
/// guest powered off or panicked), at once and without polling libvirt.
///
/// Only a process of the QEMU user (`qemu_uid`) is taken for QEMU; its PID is returned.
async fn accept_qmp(
    listener: tokio::net::UnixListener,
    driver: vmlet_config::DiskDriver,
    qemu_uid: u32,
) -> Result<(Hotplug, tokio::sync::watch::Receiver<bool>, u32), Error> {
    let accept = async {
        loop {
            let (stream, _) = listener
                .accept()
                .await
                .map_err(|e| Error::io("accept the QMP monitor", e))?;
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == qemu_uid => {
                    // Linux always reports the peer's PID; without it QEMU could not be
                    // placed in the pod's cgroup (0 would name the shim itself).
                    let pid = cred
                        .pid()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| Error::Internal("the QMP peer's PID is unknown".into()))?;
                    return Ok::<_, Error>((stream, pid as u32));
                }
                other => log::warn!("QMP socket: refused a connection not by QEMU ({other:?})"),
            }
        }
    };
    let (stream, qemu_pid) = tokio::time::timeout(QMP_CONNECT_WAIT, accept)
        .await
        .map_err(|_| Error::Timeout("QEMU did not connect vmlet's QMP monitor".into()))??;
    let stream = stream
        .into_std()
        .and_then(|s| s.set_nonblocking(false).map(|()| s))
        .map_err(|e| Error::io("QMP socket", e))?;
    let watched = stream.try_clone().map_err(|e| Error::io("QMP socket", e))?;
    let (ended_tx, ended) = tokio::sync::watch::channel(false);
    std::thread::Builder::new()
        .name("qemu-end".into())
        .spawn(move || {
            wait_for_hangup(&watched);
            ended_tx.send_replace(true);
        })
        .map_err(|e| Error::io("start the QEMU watcher", e))?;
    let qmp = block(move || crate::qmp::Qmp::handshake(stream)).await??;
    Ok((Hotplug::new(qmp, driver), ended, qemu_pid))
}

/// Blocks until the peer of `stream` has closed it (only hang-up is watched: the data on
/// it is the QMP client's to read).
fn wait_for_hangup(stream: &std::os::unix::net::UnixStream) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    // nix names no POLLRDHUP: the peer's shutdown or close.
    let rdhup = PollFlags::from_bits_retain(libc::POLLRDHUP);
    let end = rdhup | PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    loop {
        let mut fds = [PollFd::new(stream.as_fd(), rdhup)];
        match poll(&mut fds, PollTimeout::NONE) {
            // nix's `revents` is None when a bit it does not name is set: POLLRDHUP.
            Ok(_) => match fds[0].revents() {
                None => return,
                Some(e) if e.intersects(end) => return,
                Some(_) => {}
            },
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// Runs a blocking call (libvirt, mounts) off the async executor.
async fn block<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task: {e}")))
}

impl Vm {
    /// Boots the pod's VM with one container's rootfs in the share and the pod network
    /// wired in. On failure everything created so far is removed before the error returns.
    pub async fn boot(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        req: BootRequest,
    ) -> Result<Vm, Error> {
        let paths = PodPaths::new(&config.state_dir, &req.pod_id);
        if paths.dir.exists() {
            return Err(Error::AlreadyExists(format!(
                "pod state {}",
                paths.dir.display()
            )));
        }
        std::fs::create_dir_all(&config.state_dir)
            .and_then(|()| std::fs::create_dir(&paths.dir))
            .map_err(|e| Error::io(format!("create {}", paths.dir.display()), e))?;
        let state = Arc::new(Mutex::new(PodState {
            dir: paths.dir.clone(),
            shim_pid: Some(std::process::id()),
            ..Default::default()
        }));
        let mut tap_server = None;
        let result = Self::boot_steps(
            config,
            vmm.clone(),
            &req,
            &paths,
            state.clone(),
            &mut tap_server,
        )
        .await;
        match result {
            Ok(booted) => {
                let state = state.lock().unwrap().clone();
                Ok(Vm {
                    shape: req.shape,
                    holder_pid: state.holder_pid,
                    pod_id: req.pod_id,
                    paths,
                    endpoint: booted.endpoint,
                    guest: Arc::new(AgentGuest::new(booted.agent)),
                    boot_id: booted.boot_id,
                    host_pid: booted.qemu_pid,
                    state: Mutex::new(state),
                    vmm,
                    tap_server,
                    port_forward: booted.port_forward,
                    hotplug: Arc::new(Mutex::new(booted.hotplug)),
                    memory: Mutex::new(req.memory),
                    growing: tokio::sync::Mutex::new(()),
                    ended: booted.ended,
                    stopping: std::sync::atomic::AtomicBool::new(false),
                })
            }
            Err(e) => {
                if let Some(server) = tap_server {
                    server.abort();
                }
                let state = state.lock().unwrap().clone();
                if let Ok(Err(cleanup)) =
                    block(move || crate::reclaim::teardown(&*vmm, &state)).await
                {
                    log::error!(
                        "cleanup after failed boot of {}: {}",
                        req.pod_id,
                        cleanup.message()
                    );
                }
                Err(e)
            }
        }
    }

    async fn boot_steps(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        req: &BootRequest,
        paths: &PodPaths,
        state: Arc<Mutex<PodState>>,
        tap_server: &mut Option<tokio::task::JoinHandle<()>>,
    ) -> Result<Booted, Error> {
        let (pod_id, shape) = (req.pod_id.as_str(), req.shape);
        let save = |f: &dyn Fn(&mut PodState)| -> Result<(), Error> {
            let mut s = state.lock().unwrap();
            f(&mut s);
            s.save()
        };
        save(&|_| {})?;
        std::fs::set_permissions(
            &paths.dir,
            std::fs::Permissions::from_mode(share::POD_DIR_MODE),
        )
        .map_err(|e| Error::io("chmod pod dir", e))?;
        if let Some(cgroup) = &req.cgroup {
            save(&|s| s.cgroup = Some(cgroup.path.clone()))?;
            cgroup.create()?;
        }
        let place = |pid: u32, what: &str| match &req.cgroup {
            Some(cgroup) => cgroup.add(pid, what),
            None => Ok(()),
        };
        let record = |target: &Path| save(&|s| s.mounts.push(target.to_owned()));
        crate::log_dir::mount(&paths.dir, config.pod_log_mib, &record)?;
        share::prepare(&paths.dir, &record)?;
        share::mount_container(
            &paths.dir,
            &req.container_id,
            &req.rootfs,
            &req.binds,
            &record,
        )?;

        // The pod's host process and the hooks that need it come before the network: a
        // hook (nerdctl's CNI) may put the interfaces into the namespace it holds.
        let mut wire_from = req.netns.clone();
        let mut may_be_empty = false;
        if let Some(host) = &req.host_process {
            let join = req.netns.clone();
            let pid = block(move || crate::netns_holder::spawn(join.as_deref())).await??;
            save(&|s| s.holder_pid = Some(pid))?;
            place(pid, "the pod's host process")?;
            let state = crate::hooks::HookState {
                pid,
                ..host.state.clone()
            };
            crate::hooks::run(&host.create_hooks, &state, "creating").await?;
            if wire_from.is_none() {
                // The spec asked for a new namespace: whatever the hooks put there.
                wire_from = Some(crate::netns_holder::netns_path(pid));
                may_be_empty = true;
            }
        }
        let mut interfaces = Vec::new();
        let tap_socket = match &wire_from {
            Some(netns) => {
                save(&|s| s.netns = Some(netns.clone()))?;
                let (path, owner) = (netns.clone(), pod_id.to_owned());
                let wired = match block(move || vmlet_netns::wire(&path, &owner)).await? {
                    Ok(wired) => wired,
                    Err(vmlet_netns::Error::NoInterface(_)) if may_be_empty => {
                        vmlet_netns::Wired::default()
                    }
                    Err(e) => return Err(Error::Network(e)),
                };
                save(&|s| s.wirings = wired.wirings.clone())?;
                let taps: Vec<TapDescription> = wired
                    .wirings
                    .iter()
                    .map(|w| TapDescription {
                        mac: w.interface.mac_string(),
                        mtu: w.interface.mtu,
                    })
                    .collect();
                if taps.len() > crate::taps::MAX_TAPS {
                    return Err(Error::Unimplemented(format!(
                        "more than {} pod interfaces",
                        crate::taps::MAX_TAPS
                    )));
                }
                interfaces = wired.wirings.into_iter().map(|w| w.interface).collect();
                log::info!(
                    "pod {pod_id}: wired {} interface(s) from {}",
                    interfaces.len(),
                    netns.display()
                );
                if taps.is_empty() {
                    None
                } else {
                    let listener =
                        tokio::net::UnixListener::bind(&paths.tap_socket).map_err(|e| {
                            Error::io(format!("bind {}", paths.tap_socket.display()), e)
                        })?;
                    let qemu_uid = chown_to_user(&paths.tap_socket, &config.qemu_user)?;
                    *tap_server = Some(crate::taps::serve(listener, taps, wired.taps, qemu_uid));
                    Some(paths.tap_socket.to_string_lossy().into_owned())
                }
            }
            None => None,
        };

        let transport = match config.vsock {
            VsockTransport::Auto if Path::new("/dev/vhost-vsock").exists() => VsockTransport::Vhost,
            VsockTransport::Auto => VsockTransport::VhostUser,
            other => other,
        };
        let vsock_device = match transport {
            VsockTransport::VhostUser => {
                let (binary, socket, uds, log) = (
                    config.helpers.vhost_device_vsock.clone(),
                    paths.vhost_socket.clone(),
                    paths.vsock_uds.clone(),
                    paths.vsock_log.clone(),
                );
                let pid =
                    block(move || vsock::start_vhost_device_vsock(&binary, &socket, &uds, &log))
                        .await??;
                save(&|s| s.vsock_pid = Some(pid))?;
                place(pid, "vhost-device-vsock")?;
                chown_to_user(&paths.vhost_socket, &config.qemu_user)?;
                VsockDevice::VhostUser {
                    socket: paths.vhost_socket.to_string_lossy().into_owned(),
                }
            }
            _ => VsockDevice::Vhost,
        };

        let kvm = match config.accel {
            Accel::Kvm => true,
            Accel::Tcg => false,
            Accel::Auto => {
                let (vmm, qemu, machine) = (
                    vmm.clone(),
                    config.helpers.qemu.to_string_lossy().into_owned(),
                    config.guest.machine.clone(),
                );
                Path::new("/dev/kvm").exists()
                    && block(move || vmm.kvm_usable(&qemu, &machine)).await?
            }
        };
        let host_cpu = req.options.cpu_model.as_ref().and_then(CpuModel::host_mode);
        if let (false, Some(name)) = (kvm, host_cpu) {
            return Err(Error::FailedPrecondition(format!(
                "CPU mode {name} (the pod's CPU annotation) needs KVM, and this node runs TCG"
            )));
        }
        // vmlet's QMP monitor connects here when QEMU starts.
        let qmp_listener = tokio::net::UnixListener::bind(&paths.qmp_socket)
            .map_err(|e| Error::io(format!("bind {}", paths.qmp_socket.display()), e))?;
        let qemu_uid = chown_to_user(&paths.qmp_socket, &config.qemu_user)?;
        let name = domain_name(pod_id);
        let params = DomainParams {
            name: name.clone(),
            pod_id: pod_id.into(),
            kvm,
            vcpus: shape.vcpus,
            memory_mib: shape.memory_mib,
            hotplug_mib: req.memory.region_mib,
            machine: req.options.machine.clone(),
            cpu_model: req.options.cpu_model.clone(),
            kernel: config.guest.kernel.to_string_lossy().into_owned(),
            initrd: config.guest.initrd.to_string_lossy().into_owned(),
            // memhp_default_state: the guest onlines what virtio-mem plugs. swiotlb=noforce:
            // a hot-plug region above 4 GiB would make the kernel reserve 64 MiB of bounce
            // buffers, which the guest's devices (virtio without an IOMMU) never use.
            cmdline: format!(
                "console=ttyS0 panic=-1 quiet memhp_default_state=online swiotlb=noforce vmlet.share={SHARE_TAG} {}",
                req.options.kernel_params
            )
            .trim_end()
            .to_owned(),
            emulator: config.helpers.vmwrapper.to_string_lossy().into_owned(),
            qemu: config.helpers.qemu.to_string_lossy().into_owned(),
            virtiofsd: config.helpers.virtiofsd.to_string_lossy().into_owned(),
            share_dir: paths.share.to_string_lossy().into_owned(),
            share_tag: SHARE_TAG.into(),
            console_log: paths.console.to_string_lossy().into_owned(),
            vsock: vsock_device.clone(),
            tap_socket,
            qmp_socket: paths.qmp_socket.to_string_lossy().into_owned(),
        };
        let xml = Domain::new(&params).to_xml()?;
        log::info!(
            "pod {pod_id}: starting {name} ({} vCPU, {} MiB, {})",
            shape.vcpus,
            shape.memory_mib,
            if kvm { "kvm" } else { "tcg" }
        );
        save(&|s| s.domain = Some(name.clone()))?;
        let started = Instant::now();
        {
            let vmm = vmm.clone();
            block(move || vmm.start(&xml)).await??;
        }
        log::info!(
            "pod {pod_id}: domain started in {} ms",
            started.elapsed().as_millis()
        );
        let (hotplug, ended, qemu_pid) =
            accept_qmp(qmp_listener, req.options.disk_driver, qemu_uid).await?;
        // libvirt is done placing QEMU (in its own cgroup) once the domain started: the
        // pod's cgroup takes it, and virtiofsd, from here on.
        if req.cgroup.is_some() {
            place(qemu_pid, "QEMU")?;
            for pid in crate::pod_cgroup::virtiofsd_pids(&paths.share) {
                place(pid, "virtiofsd")?;
            }
        }
        let endpoint = match vsock_device {
            VsockDevice::VhostUser { .. } => Endpoint::Hybrid {
                uds: paths.vsock_uds.clone(),
            },
            VsockDevice::Vhost => {
                let vmm = vmm.clone();
                let n = name.clone();
                let xml = block(move || vmm.live_xml(&n)).await??;
                Endpoint::Vhost {
                    cid: guest_cid(&xml)
                        .ok_or_else(|| Error::Libvirt(format!("{name} has no vsock CID")))?,
                }
            }
        };
        let deadline = Duration::from_secs(config.agent_timeout_secs);
        let mut end = ended.clone();
        let connected = tokio::select! {
            r = connect_agent(&endpoint, deadline, Some(&paths.console)) => r,
            // The guest died while booting (kernel panic, no init): no need to wait on.
            _ = end.wait_for(|ended| *ended) => Err(Error::FailedPrecondition(
                "the VM stopped (QEMU exited) before its agent answered".into(),
            )),
        };
        let (agent, boot_id) = connected.map_err(|e| {
            let message = format!(
                "{}; console tail:\n{}",
                e.message(),
                crate::console::tail(&paths.console)
            );
            match e {
                Error::Timeout(_) => Error::Timeout(message),
                _ => Error::FailedPrecondition(message),
            }
        })?;
        log::info!(
            "pod {pod_id}: agent answered {} ms after start",
            started.elapsed().as_millis()
        );
        if !interfaces.is_empty() {
            agent
                .configure_network(agent_ctx(), &network_request(&interfaces))
                .await
                .map_err(Error::from)?;
        }
        let port_forward = match &wire_from {
            Some(netns) => {
                crate::port_forward::PortForward::start(netns, endpoint.clone(), pod_id).await?
            }
            None => None,
        };
        Ok(Booted {
            endpoint,
            agent,
            boot_id,
            hotplug,
            ended,
            qemu_pid,
            port_forward,
        })
    }
}

#[async_trait]
impl PodVm for Vm {
    fn pod_id(&self) -> &str {
        &self.pod_id
    }

    fn host_pid(&self) -> u32 {
        self.host_pid
    }

    fn holder_pid(&self) -> Option<u32> {
        self.holder_pid
    }

    async fn attach_stdio(
        &self,
        process: ProcessName<'_>,
        namespace: &str,
        paths: &StdioPaths,
        terminal: bool,
    ) -> Result<Copies, Error> {
        crate::stdio::attach(&self.endpoint, process, namespace, paths, terminal).await
    }

    /// Hot-plugs `container_id`'s block devices and returns what the agent needs to find
    /// them (nothing stays attached on failure).
    async fn attach_block_devices(
        &self,
        container_id: &str,
        devices: &[BlockDevice],
    ) -> Result<Vec<vmlet_protocol::agent::BlockDevice>, Error> {
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let fds = devices
            .iter()
            .map(crate::block_devices::open_host)
            .collect::<Result<Vec<_>, _>>()?;
        let (hotplug, id, devices) = (
            self.hotplug.clone(),
            container_id.to_owned(),
            devices.to_vec(),
        );
        block(move || hotplug.lock().unwrap().attach(&id, &devices, fds)).await?
    }

    /// Whether QEMU is gone.
    fn has_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Resolves when QEMU is gone; logs it when the shim did not stop the VM itself.
    async fn ended(&self) {
        let mut ended = self.ended.clone();
        // An error means the watcher is gone, which it only is after QEMU ended.
        let _ = ended.wait_for(|e| *e).await;
    }

    /// The pod's agent.
    fn guest(&self) -> &dyn Guest {
        &*self.guest
    }

    /// Whether the shim is stopping the VM itself.
    fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Ends the VM at once (libvirt destroys it: QEMU is killed), for a guest that did not
    /// obey a SIGKILL of the pod; every process of the pod then ends with status 137.
    async fn kill(&self) -> Result<(), Error> {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let Some(domain) = self.state.lock().unwrap().domain.clone() else {
            return Ok(());
        };
        let vmm = self.vmm.clone();
        block(move || vmm.remove(&domain)).await?
    }

    /// Grows the VM when it must so that it holds `container_id`'s memory limit (MiB; none:
    /// unlimited) beside the pod's other containers' (see [`crate::memory`]), then records
    /// the limit. A VM sized by `vmlet.io/memory` refuses what does not fit.
    async fn fit_memory(&self, container_id: &str, limit_mib: Option<u64>) -> Result<(), Error> {
        let _one_at_a_time = self.growing.lock().await;
        let fit = self.memory.lock().unwrap().fit(container_id, limit_mib)?;
        if let Fit::Grow { plugged_mib } = fit {
            self.check_running()?;
            let started = Instant::now();
            let hotplug = self.hotplug.clone();
            block(move || {
                crate::memory::plug(
                    hotplug.lock().unwrap().qmp(),
                    plugged_mib,
                    crate::memory::PLUG_TIMEOUT,
                )
            })
            .await??;
            log::info!(
                "pod {}: the VM grew to {} MiB for {container_id} (limit {limit_mib:?} MiB) in {:?}",
                self.pod_id,
                self.shape.memory_mib + plugged_mib,
                started.elapsed()
            );
        }
        self.memory
            .lock()
            .unwrap()
            .commit(container_id, limit_mib, fit);
        Ok(())
    }

    /// Unplugs what [`Vm::attach_block_devices`] attached for `container_id`.
    async fn detach_block_devices(&self, container_id: &str) -> Result<(), Error> {
        let (hotplug, id) = (self.hotplug.clone(), container_id.to_owned());
        block(move || hotplug.lock().unwrap().detach(&id)).await?
    }

    /// Puts another container of the pod (rootfs and binds) into the running VM's share.
    /// On failure what was mounted is removed again.
    fn add_container(
        &self,
        container_id: &str,
        rootfs: &RootfsSource,
        binds: &[crate::spec::HostBind],
    ) -> Result<(), Error> {
        let added =
            share::mount_container(&self.paths.dir, container_id, rootfs, binds, &|target| {
                let mut state = self.state.lock().unwrap();
                state.mounts.push(target.to_owned());
                state.save()
            });
        if added.is_err() {
            let _ = self.remove_container(container_id);
        }
        added
    }

    /// Removes a container's rootfs and binds from the share (the VM goes on).
    fn remove_container(&self, container_id: &str) -> Result<(), Error> {
        self.memory.lock().unwrap().release(container_id);
        let dir = self.paths.dir.join(share::MOUNTS_DIR).join(container_id);
        let mut state = self.state.lock().unwrap();
        let (theirs, ours): (Vec<PathBuf>, Vec<PathBuf>) = std::mem::take(&mut state.mounts)
            .into_iter()
            .partition(|m| m.starts_with(&dir));
        state.mounts = ours;
        let unmounted = share::unmount_recorded(&self.paths.dir, &theirs);
        state.save()?;
        unmounted.and(share::remove_container_dir(&self.paths.dir, container_id))
    }

    /// Stops the VM and removes everything the pod created. The guest is asked to power
    /// itself off first: that is faster than libvirt's destroy (SIGTERM, then waiting for
    /// QEMU), which remains the fallback.
    async fn teardown(&self) -> Result<(), Error> {
        let started = Instant::now();
        if let Some(server) = &self.tap_server {
            server.abort();
        }
        if let Some(forward) = &self.port_forward {
            forward.stop();
        }
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if !self.has_ended() {
            let asked = tokio::time::timeout(POWER_OFF_WAIT, self.guest.shutdown()).await;
            if matches!(asked, Ok(Ok(_))) {
                let _ = tokio::time::timeout(POWER_OFF_WAIT, self.ended()).await;
            }
        }
        let state = self.state.lock().unwrap().clone();
        let vmm = self.vmm.clone();
        let result = block(move || crate::reclaim::teardown(&*vmm, &state)).await?;
        log::info!(
            "pod {}: torn down in {} ms",
            self.pod_id,
            started.elapsed().as_millis()
        );
        result
    }
}

/// Gives `path` to `user` (QEMU's) and returns the user's uid.
fn chown_to_user(path: &Path, user: &str) -> Result<u32, Error> {
    let user = nix::unistd::User::from_name(user)
        .map_err(|e| Error::io(format!("look up user {user}"), e.into()))?
        .ok_or_else(|| {
            Error::Config(vmlet_config::Error::InvalidConfig {
                key: "qemu_user",
                reason: format!("no user {user} on this host"),
            })
        })?;
    nix::unistd::chown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| Error::io(format!("chown {}", path.display()), e.into()))?;
    Ok(user.uid.as_raw())
}

/// The guest CID libvirt assigned (`<cid auto='yes' address='N'/>` in the live XML).
fn guest_cid(xml: &str) -> Option<u32> {
    let cid = xml.split("<cid ").nth(1)?.split("/>").next()?;
    let address = cid.split("address=").nth(1)?;
    address
        .trim_matches(|c| c == '\'' || c == '"' || c == ' ')
        .split(['\'', '"'])
        .next()?
        .parse()
        .ok()
}

fn agent_ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(30_000_000_000)
}

/// The agent's view of the wired interfaces.
fn network_request(interfaces: &[vmlet_netns::Interface]) -> ConfigureNetworkRequest {
    ConfigureNetworkRequest {
        interfaces: interfaces
            .iter()
            .map(|i| NetworkInterface {
                mac: i.mac_string(),
                mtu: i.mtu,
                addresses: i.addresses.iter().map(|a| a.to_string()).collect(),
                routes: i
                    .routes
                    .iter()
                    .map(|r| Route {
                        destination: r.destination.map(|d| d.to_string()).unwrap_or_default(),
                        gateway: r.gateway.map(|g| g.to_string()).unwrap_or_default(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// How long one connection attempt to the agent may take.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// Connects to the agent and pings it. With `console`, waits first until the guest console
/// shows the agent listening (see [`vmlet_protocol::READY_LINE`]).
pub async fn connect_agent(
    endpoint: &Endpoint,
    timeout: Duration,
    console: Option<&Path>,
) -> Result<(AgentClient, String), Error> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no attempt");
    if let Some(console) = console {
        let mut watch = crate::console::ReadyWatch::new(console, vmlet_protocol::READY_LINE);
        while !watch.shows_ready() {
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "the agent did not report ready on the console within {} s",
                    timeout.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    while Instant::now() < deadline {
        // One attempt may hang: vhost-device-vsock can leave a CONNECT made while the guest
        // is still booting without any reply. Bound each attempt, then retry.
        let attempt = tokio::time::timeout(CONNECT_ATTEMPT, endpoint.connect(AGENT_PORT)).await;
        let connected = match attempt {
            Ok(result) => result,
            Err(_) => {
                last = format!("connect: no answer within {CONNECT_ATTEMPT:?}");
                continue;
            }
        };
        match connected {
            Ok(stream) => {
                let client = AgentClient::new(ttrpc::r#async::Client::new(
                    ttrpc::r#async::transport::Socket::new(stream),
                ));
                match client
                    .ping(
                        ttrpc::context::with_timeout(2_000_000_000),
                        &PingRequest::default(),
                    )
                    .await
                {
                    Ok(pong) => return Ok((client, pong.boot_id)),
                    Err(e) => last = format!("ping: {e}"),
                }
            }
            Err(e) => last = e.message(),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(Error::Timeout(format!(
        "the agent did not answer within {} s (last error: {last})",
        timeout.as_secs()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vhost-device-vsock that accepts CONNECT and never answers (as seen while a guest
    /// boots): the agent connection must give up in time instead of hanging.
    #[tokio::test]
    async fn agent_connect_gives_up_on_an_unanswered_handshake() {
        let dir = std::env::temp_dir().join(format!("vmlet-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uds = dir.join("vsock.sock");
        let listener = tokio::net::UnixListener::bind(&uds).unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let endpoint = Endpoint::Hybrid { uds: uds.clone() };
        let started = Instant::now();
        let result = connect_agent(&endpoint, Duration::from_secs(3), None).await;
        let took = started.elapsed();
        server.abort();
        std::fs::remove_dir_all(&dir).unwrap();
        let err = result.err().expect("no agent answered");
        assert!(took < Duration::from_secs(6), "gave up after {took:?}");
        assert!(err.message().contains("no answer"), "{}", err.message());
    }

    #[test]
    fn cid_from_live_xml() {
        assert_eq!(
            guest_cid("<vsock model='virtio'>\n<cid auto='yes' address='7'/>"),
            Some(7)
        );
        assert_eq!(guest_cid("<vsock/>"), None);
    }
}
