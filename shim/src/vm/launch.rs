//! The VM itself: described ([`crate::vmm::vm_spec::VmSpec`]), its taps served with their
//! slots, its libvirt domain started (or, under `launcher = "direct"`, QEMU started by the
//! shim: [`super::direct_start`]), and vmlet's QMP monitor taken when QEMU
//! connects it. QEMU's end of that monitor is how the shim learns, at once, that the VM
//! ended. The pod's virtiofsd is the shim's under either launcher
//! ([`super::pod_virtiofsd`]). Under libvirt, QEMU then joins the pod's cgroup (started by
//! the shim, QEMU and virtiofsd join it before their exec).

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::os::fd::OwnedFd;

use vmlet_config::NodeConfig;

use super::net::{PendingTaps, TapServer};
use super::template_start::TemplateStart;
use super::{block, BootRequest, Recorder};
use crate::devices::hotplug::Hotplug;
use crate::host::pod_paths::{domain_name, PodPaths};
use crate::host::pod_user::PodUser;
use crate::host::qemu_peer::{QemuPeer, QemuPid};
use crate::host::qemu_process::QemuProcess;
use crate::vm_mode::serial_console::SerialConsole;
use crate::vmm::launcher_choice;
use crate::vmm::pci_slots::PciSlots;
use crate::vmm::vm_spec::{
    agent_cmdline, AgentBoot, ConsoleTarget, GuestBoot, TemplateRole, VmSpec, VsockDevice,
};
use crate::vmm::VmManager;
use crate::Error;

/// virtio-fs tag of the shared directory.
const SHARE_TAG: &str = "vmlet";
/// How long QEMU may take to connect vmlet's QMP monitor (and a VM image's console) once
/// libvirt started it.
const QEMU_CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long QEMU the shim started may take to end once its monitor failed (it ends at once
/// when it refused its command line).
const QEMU_ENDS: Duration = Duration::from_secs(2);

/// What the earlier steps give the domain.
pub(super) struct Devices {
    pub kvm: bool,
    /// The shim starts QEMU itself ([`starts_direct`]); otherwise libvirt does.
    pub direct: bool,
    /// What the VM runs ([`agent_guest`] for vmlet's guest).
    pub guest: GuestBoot,
    /// The pod's taps (none: no NIC).
    pub taps: Option<PendingTaps>,
    /// The pod's own user, which its QEMU runs as.
    pub user: PodUser,
    /// The pipe vmlet's guest's QEMU reads the agent's key from (the shim's QEMU only).
    pub key_pipe: Option<OwnedFd>,
    /// The shim's connection to the vsock backend (the shim's QEMU only): inherited by a
    /// cold start's QEMU, handed over the monitor by a template start.
    pub vsock_connection: Option<OwnedFd>,
}

/// vmlet's guest: the node's kernel and initrd with the pod's kernel parameters, the
/// share over virtio-fs, the agent over `vsock`, its key in fw_cfg (read from `key_file`).
pub(super) fn agent_guest(
    config: &NodeConfig,
    req: &BootRequest,
    paths: &PodPaths,
    vsock: &VsockDevice,
    key_file: String,
) -> GuestBoot {
    GuestBoot::Agent(AgentBoot {
        kernel: resolved(&config.guest.kernel),
        initrd: resolved(&config.guest.initrd),
        cmdline: agent_cmdline(SHARE_TAG, &req.options.kernel_params),
        virtiofsd: config.helpers.virtiofsd.to_string_lossy().into_owned(),
        share_dir: paths.share.to_string_lossy().into_owned(),
        share_socket: paths.share_socket.to_string_lossy().into_owned(),
        share_tag: SHARE_TAG.into(),
        vsock: vsock.clone(),
        key_file,
    })
}

/// `path` with its links resolved, as AppArmor names the file QEMU opens (the pod's profile
/// lists it: [`VmSpec::apparmor_files`]); as it is where it does not resolve (QEMU then
/// says the file is missing).
fn resolved(path: &std::path::Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_owned())
        .to_string_lossy()
        .into_owned()
}

/// A started domain.
pub(super) struct Launched {
    pub name: String,
    pub hotplug: Hotplug,
    /// Becomes true when QEMU is gone.
    pub ended: tokio::sync::watch::Receiver<bool>,
    pub qemu_pid: u32,
    /// When libvirt was asked to start it.
    pub started: Instant,
    /// A VM image's serial console (vmlet's guest writes a file instead).
    pub console: Option<SerialConsole>,
    /// A VM image's QEMU guest agent port, as QEMU connected it.
    pub guest_agent: Option<tokio::net::UnixStream>,
    /// The server that handed the taps to QEMU (none: no NIC).
    pub tap_server: Option<TapServer>,
    /// What the boot still does for a template start (none: a cold boot).
    pub template: Option<TemplateStart>,
    /// QEMU, when the shim started it itself (dropped, it is killed).
    pub qemu: Option<QemuProcess>,
}

/// Defines and starts the pod's domain (recorded first) and takes vmlet's QMP monitor.
pub(super) async fn start(
    config: &NodeConfig,
    vmm: &Arc<dyn VmManager>,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    mut devices: Devices,
) -> Result<Launched, Error> {
    let (pod_id, shape) = (req.pod_id.as_str(), req.shape);
    // vmlet's QMP monitor connects here when QEMU starts.
    let qmp_listener = tokio::net::UnixListener::bind(&paths.qmp_socket)
        .map_err(|e| Error::io(format!("bind {}", paths.qmp_socket.display()), e))?;
    devices.user.give_private(&paths.qmp_socket)?;
    let qemu_uid = devices.user.uid;
    // A VM image's console is its task's stdio, and its QEMU guest agent runs its execs:
    // QEMU connects both here.
    let (console_listener, agent_listener) = match &devices.guest {
        GuestBoot::Image(_) => (
            Some(listen_for_qemu(&paths.console_socket, &devices.user)?),
            Some(listen_for_qemu(&paths.guest_agent_socket, &devices.user)?),
        ),
        GuestBoot::Agent(_) => (None, None),
    };
    let console = match console_listener {
        Some(_) => ConsoleTarget::Socket(paths.console_socket.to_string_lossy().into_owned()),
        None => ConsoleTarget::File(paths.console.to_string_lossy().into_owned()),
    };
    let name = domain_name(pod_id);
    let (kvm, direct) = (devices.kvm, devices.direct);
    let key_pipe = devices.key_pipe.take();
    let vsock_connection = devices.vsock_connection.take();
    let (mut spec, taps) = vm_spec(config, req, paths, &name, devices, console);
    match crate::vmm::qemu_command::libvirt_only(&spec) {
        Some(why) if direct => {
            return Err(Error::Internal(format!(
                "pod {pod_id}: chosen to start without libvirt, but {why}"
            )))
        }
        Some(why) if launcher_choice::choose(config).direct => {
            log::info!("pod {pod_id}: starts through libvirt: {why}");
        }
        _ => log::info!(
            "pod {pod_id}: starts {}",
            if direct {
                "without libvirt"
            } else {
                "through libvirt"
            }
        ),
    }
    // For the operator only: a pod starts without it.
    if let Err(e) = record(req, paths, &spec, direct) {
        log::warn!("pod {pod_id}: no record for vmletctl: {}", e.message());
    }
    // None for a VM image, which has no agent to wait for a restore.
    let mut template = super::template_start::choose(config, &spec, direct).await?;
    spec.template = template.as_ref().map(TemplateStart::role);
    // What QEMU the shim starts inherits beside the taps.
    let mut made: Vec<OwnedFd> = key_pipe.into_iter().collect();
    match (&mut template, vsock_connection) {
        (Some(template), Some(connection)) => template.hand_vsock_connection(connection),
        (None, connection) => made.extend(connection),
        // QEMU the shim starts connects no socket of the backend's itself.
        (Some(_), None) if direct => {
            return Err(Error::Internal(format!(
                "pod {pod_id}: a template start without the shim's connection to its vsock backend"
            )))
        }
        (Some(_), None) => {}
    }
    // Under libvirt, the process libvirt starts for the domain: the PID libvirt writes
    // before it runs vmlet's wrapper, which executes QEMU in the same process.
    let libvirts_qemu = if direct {
        None
    } else {
        let (vmm, name) = (vmm.clone(), name.clone());
        let file = block(move || vmm.qemu_pid_file(&name)).await??;
        Some(QemuPeer {
            uid: qemu_uid,
            pid: QemuPid::InFile(file),
        })
    };
    let mut tap_fds: Vec<OwnedFd> = Vec::new();
    let tap_server = match (&mut template, taps) {
        // A template start plugs the NICs in after the load.
        (Some(template), Some(taps)) => {
            template.plug_nics(taps.into_nics(spec.taps())?);
            None
        }
        // QEMU started by the shim inherits them.
        (None, Some(taps)) if direct => {
            tap_fds = taps
                .into_nics(spec.taps())?
                .into_iter()
                .map(|(_, fd)| fd)
                .collect();
            None
        }
        // Served before QEMU starts: the wrapper fetches the taps before it executes QEMU
        // (in QEMU's process: libvirt has written its PID by then).
        (None, Some(taps)) => {
            let qemu = libvirts_qemu
                .clone()
                .ok_or_else(|| Error::Internal("taps served to a QEMU the shim starts".into()))?;
            Some(taps.serve(spec.taps(), qemu)?)
        }
        (_, None) => None,
    };
    log::info!(
        "pod {pod_id}: starting {name} ({} vCPU, {} MiB, {}{}{})",
        shape.vcpus,
        shape.memory_mib,
        if kvm { "kvm" } else { "tcg" },
        if direct { ", without libvirt" } else { "" },
        match spec.template {
            Some(TemplateRole::Save) => ", booting a template to save",
            Some(TemplateRole::Load) => ", loading a template",
            None => "",
        }
    );
    let started = Instant::now();
    let qemu = if direct {
        Some(super::direct_start::start(config, req, paths, rec, &spec, tap_fds, made).await?)
    } else {
        if let Some(share) = spec.guest.share() {
            let cgroup_procs = crate::host::pod_cgroup::procs_files_of(req.cgroup.as_ref())?;
            super::pod_virtiofsd::start(
                config,
                paths,
                rec,
                share,
                cgroup_procs,
                super::pod_virtiofsd::Client::Qemu(&spec.user),
            )?;
        }
        let request = crate::vmm::domain::start_request(&spec)?;
        rec.record(crate::host::undo::Made::Domain(name.clone()))?;
        let vmm = vmm.clone();
        block(move || vmm.start(&request)).await??;
        None
    };
    log::info!(
        "pod {pod_id}: {} started in {} ms",
        if direct { "QEMU" } else { "domain" },
        started.elapsed().as_millis()
    );
    let peer = match (&qemu, libvirts_qemu) {
        (Some(qemu), _) => QemuPeer {
            uid: qemu_uid,
            pid: QemuPid::Is(qemu.pid),
        },
        (None, Some(libvirts)) => libvirts,
        (None, None) => return Err(Error::Internal("no QEMU started".into())),
    };
    let accepted = accept_qmp(qmp_listener, &spec, req.options.disk_driver, peer);
    let (hotplug, ended, qemu_pid) = match &qemu {
        // QEMU that ends before it connects says why in its log.
        Some(qemu) => tokio::select! {
            accepted = accepted => match accepted {
                Ok(accepted) => accepted,
                // QEMU that connected and then ended (a device it refused) says why in its
                // log.
                Err(e) if qemu.ended_within(QEMU_ENDS).await.unwrap_or(false) => {
                    return Err(Error::FailedPrecondition(format!(
                        "pod {pod_id}: QEMU ended as it started ({}): {}",
                        super::helper_log::tail(&paths.qemu_log),
                        e.message()
                    )));
                }
                Err(e) => return Err(e),
            },
            ended = qemu.ended_within(QEMU_CONNECT_WAIT) => {
                if !ended? {
                    return Err(Error::Timeout("QEMU did not connect vmlet's QMP monitor".into()));
                }
                return Err(Error::FailedPrecondition(format!(
                    "pod {pod_id}: QEMU ended before it connected vmlet's QMP monitor ({})",
                    super::helper_log::tail(&paths.qemu_log)
                )));
            }
        },
        None => accepted.await?,
    };
    // The console and the guest agent's port are this pod's QEMU's alone (by its uid, and
    // by its PID).
    let ours = QemuPeer {
        uid: qemu_uid,
        pid: QemuPid::Is(qemu_pid),
    };
    let console = match console_listener {
        Some(listener) => {
            let (stream, _) = accept_qemu(&listener, &ours, "the serial console").await?;
            let console = SerialConsole::start(stream, &paths.console)?;
            console.serve_operator(&paths.console_input)?;
            Some(console)
        }
        None => None,
    };
    let guest_agent = match agent_listener {
        Some(listener) => Some(
            accept_qemu(&listener, &ours, "the QEMU guest agent's port")
                .await?
                .0,
        ),
        None => None,
    };
    // libvirt is done placing QEMU (in its own cgroup) once the domain started: the pod's
    // cgroup takes it from here on (virtiofsd, the shim's, joined it as it started).
    if req.cgroup.is_some() && !direct {
        rec.place(qemu_pid, "QEMU")?;
    }
    Ok(Launched {
        name,
        hotplug,
        ended,
        qemu_pid,
        started,
        console,
        guest_agent,
        tap_server,
        template,
        qemu,
    })
}

/// Whether the shim starts the pod's QEMU itself: where the node's choice is the direct
/// launcher ([`launcher_choice`]), unless the pod needs what only libvirt does
/// ([`crate::vmm::qemu_command::libvirt_only`] says why, from the VM's description): a CPU
/// model libvirt expands. (vsock is vhost-user's under that launcher: the config refuses the
/// kernel's, and `auto` chooses libvirt for it.) VM images and vmlet's guest alike.
pub(super) fn starts_direct(config: &NodeConfig, req: &BootRequest) -> bool {
    use vmlet_config::CpuModel;
    launcher_choice::choose(config).direct
        && !matches!(
            req.options.cpu_model,
            Some(CpuModel::HostModel | CpuModel::Libvirt(_))
        )
}

/// The pod's record for the operator ([`crate::host::pod_record`]), as its VM starts.
fn record(req: &BootRequest, paths: &PodPaths, spec: &VmSpec, direct: bool) -> Result<(), Error> {
    use crate::host::pod_record::{PodKind, PodRecord, VERSION};
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    PodRecord {
        version: VERSION,
        names: req.names.clone(),
        kind: match spec.guest {
            GuestBoot::Agent(_) => PodKind::Containers,
            GuestBoot::Image(_) => PodKind::VmImage,
        },
        vcpus: spec.vcpus,
        memory_mib: spec.memory_mib,
        accel: if spec.kvm { "kvm" } else { "tcg" }.into(),
        launcher: if direct { "direct" } else { "libvirt" }.into(),
        started,
    }
    .write(&paths.dir)
}

/// A socket at `path` that only the pod's QEMU's `user` may connect to.
fn listen_for_qemu(
    path: &std::path::Path,
    user: &PodUser,
) -> Result<tokio::net::UnixListener, Error> {
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| Error::io(format!("bind {}", path.display()), e))?;
    user.give_private(path)?;
    Ok(listener)
}

/// The pod's VM: `req`'s shape and options, the node's helpers, `devices`, and its console
/// going to `console`; and its taps, to serve as the description has them.
fn vm_spec(
    config: &NodeConfig,
    req: &BootRequest,
    paths: &PodPaths,
    name: &str,
    devices: Devices,
    console: ConsoleTarget,
) -> (VmSpec, Option<PendingTaps>) {
    let spec = VmSpec {
        name: name.to_owned(),
        pod_id: req.pod_id.clone(),
        kvm: devices.kvm,
        tcg_translation_cache_mib: config.guest.tcg_translation_cache_mib,
        free_page_reporting: config.guest.free_page_reporting,
        vcpus: req.shape.vcpus,
        memory_mib: req.shape.memory_mib,
        hotplug_mib: req.memory.region_mib,
        machine: req.options.machine.clone(),
        cpu_model: req.options.cpu_model.clone(),
        guest: devices.guest,
        emulator: config.helpers.vmwrapper.to_string_lossy().into_owned(),
        qemu: config.helpers.qemu.to_string_lossy().into_owned(),
        console,
        network: devices.taps.as_ref().map(|t| t.network.clone()),
        qmp_socket: paths.qmp_socket.to_string_lossy().into_owned(),
        slots: PciSlots::assign(),
        template: None,
        user: devices.user,
    };
    (spec, devices.taps)
}

/// Takes the connection of vmlet's QMP monitor, which QEMU makes as it starts, for
/// hot-plugging into the ports `spec` made. Its end is QEMU's: the kernel closes QEMU's side
/// however it ends (killed, crashed, the guest powered off or panicked), and the monitor
/// reports it at once ([`crate::devices::qmp::Qmp::ended`]), without polling libvirt.
/// QEMU's PID is returned.
async fn accept_qmp(
    listener: tokio::net::UnixListener,
    spec: &VmSpec,
    driver: vmlet_config::DiskDriver,
    qemu: QemuPeer,
) -> Result<(Hotplug, tokio::sync::watch::Receiver<bool>, u32), Error> {
    let (stream, qemu_pid) = accept_qemu(&listener, &qemu, "vmlet's QMP monitor").await?;
    let qmp = crate::devices::qmp::Qmp::handshake(stream).await?;
    let ended = qmp.ended();
    let ports = spec.hotplug_ports().into_iter().map(|p| p.id).collect();
    Ok((Hotplug::new(qmp, driver, ports), ended, qemu_pid))
}

/// Takes QEMU's connection to `listener` (`what` it is), within [`QEMU_CONNECT_WAIT`].
/// Only `qemu` is taken; its PID is returned.
async fn accept_qemu(
    listener: &tokio::net::UnixListener,
    qemu: &QemuPeer,
    what: &str,
) -> Result<(tokio::net::UnixStream, u32), Error> {
    let accept = async {
        loop {
            let (stream, _) = listener
                .accept()
                .await
                .map_err(|e| Error::io(format!("accept {what}"), e))?;
            let admitted = stream
                .peer_cred()
                .map_err(|e| format!("an unknown peer ({e})"))
                .and_then(|cred| qemu.admits(&cred));
            match admitted {
                Ok(pid) => return Ok::<_, Error>((stream, pid)),
                Err(why) => log::warn!("{what}: refused a connection not by QEMU: {why}"),
            }
        }
    };
    tokio::time::timeout(QEMU_CONNECT_WAIT, accept)
        .await
        .map_err(|_| Error::Timeout(format!("QEMU did not connect {what}")))?
}
