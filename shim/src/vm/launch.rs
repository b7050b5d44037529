//! The VM itself: described ([`crate::vmm::vm_spec::VmSpec`]), its taps served with their
//! slots, its libvirt domain started, and vmlet's QMP monitor taken when QEMU connects it.
//! QEMU's end of that monitor is how the shim learns, at once, that the VM ended. QEMU and
//! virtiofsd then join the pod's cgroup.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmlet_config::NodeConfig;

use super::net::{PendingTaps, TapServer};
use super::template_start::TemplateStart;
use super::{block, give_socket, BootRequest, Recorder};
use crate::devices::hotplug::Hotplug;
use crate::host::pod_paths::{domain_name, PodPaths};
use crate::vm_mode::serial_console::SerialConsole;
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

/// What the earlier steps give the domain.
pub(super) struct Devices {
    pub kvm: bool,
    /// What the VM runs ([`agent_guest`] for vmlet's guest).
    pub guest: GuestBoot,
    /// The pod's taps (none: no NIC).
    pub taps: Option<PendingTaps>,
}

/// vmlet's guest: the node's kernel and initrd with the pod's kernel parameters, the
/// share over virtio-fs, the agent over `vsock`, its key in fw_cfg.
pub(super) fn agent_guest(
    config: &NodeConfig,
    req: &BootRequest,
    paths: &PodPaths,
    vsock: &VsockDevice,
) -> GuestBoot {
    GuestBoot::Agent(AgentBoot {
        kernel: config.guest.kernel.to_string_lossy().into_owned(),
        initrd: config.guest.initrd.to_string_lossy().into_owned(),
        cmdline: agent_cmdline(SHARE_TAG, &req.options.kernel_params),
        virtiofsd: config.helpers.virtiofsd.to_string_lossy().into_owned(),
        share_dir: paths.share.to_string_lossy().into_owned(),
        share_tag: SHARE_TAG.into(),
        vsock: vsock.clone(),
        key_file: paths.agent_key.to_string_lossy().into_owned(),
    })
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
    /// The server that handed the taps to QEMU (none: no NIC).
    pub tap_server: Option<TapServer>,
    /// What the boot still does for a template start (none: a cold boot).
    pub template: Option<TemplateStart>,
}

/// Defines and starts the pod's domain (recorded first) and takes vmlet's QMP monitor.
pub(super) async fn start(
    config: &NodeConfig,
    vmm: &Arc<dyn VmManager>,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    devices: Devices,
) -> Result<Launched, Error> {
    let (pod_id, shape) = (req.pod_id.as_str(), req.shape);
    // vmlet's QMP monitor connects here when QEMU starts.
    let qmp_listener = tokio::net::UnixListener::bind(&paths.qmp_socket)
        .map_err(|e| Error::io(format!("bind {}", paths.qmp_socket.display()), e))?;
    let qemu_uid = give_socket(&paths.qmp_socket, &config.qemu_user)?;
    // A VM image's console is its task's stdio: QEMU connects it here.
    let console_listener = match &devices.guest {
        GuestBoot::Image(_) => {
            let listener = tokio::net::UnixListener::bind(&paths.console_socket)
                .map_err(|e| Error::io(format!("bind {}", paths.console_socket.display()), e))?;
            give_socket(&paths.console_socket, &config.qemu_user)?;
            Some(listener)
        }
        GuestBoot::Agent(_) => None,
    };
    let console = match console_listener {
        Some(_) => ConsoleTarget::Socket(paths.console_socket.to_string_lossy().into_owned()),
        None => ConsoleTarget::File(paths.console.to_string_lossy().into_owned()),
    };
    let name = domain_name(pod_id);
    let kvm = devices.kvm;
    let (mut spec, taps) = vm_spec(config, req, paths, &name, devices, console);
    // None for a VM image, which has no agent to wait for a restore.
    let mut template = super::template_start::choose(config, &spec).await?;
    spec.template = template.as_ref().map(TemplateStart::role);
    let request = crate::vmm::domain::start_request(&spec)?;
    let tap_server = match (&mut template, taps) {
        // A template start plugs the NICs in after the load.
        (Some(template), Some(taps)) => {
            template.plug_nics(taps.into_nics(spec.taps())?);
            None
        }
        // Served before QEMU starts: the wrapper fetches the taps before it executes QEMU.
        (None, Some(taps)) => Some(taps.serve(spec.taps())?),
        (_, None) => None,
    };
    log::info!(
        "pod {pod_id}: starting {name} ({} vCPU, {} MiB, {}{})",
        shape.vcpus,
        shape.memory_mib,
        if kvm { "kvm" } else { "tcg" },
        match spec.template {
            Some(TemplateRole::Save) => ", booting a template to save",
            Some(TemplateRole::Load) => ", loading a template",
            None => "",
        }
    );
    rec.record(crate::host::undo::Made::Domain(name.clone()))?;
    let started = Instant::now();
    {
        let vmm = vmm.clone();
        block(move || vmm.start(&request)).await??;
    }
    log::info!(
        "pod {pod_id}: domain started in {} ms",
        started.elapsed().as_millis()
    );
    let (hotplug, ended, qemu_pid) =
        accept_qmp(qmp_listener, &spec, req.options.disk_driver, qemu_uid).await?;
    let console = match console_listener {
        Some(listener) => {
            let (stream, _) = accept_qemu(&listener, qemu_uid, "the serial console").await?;
            let console = SerialConsole::start(stream, &paths.console)?;
            console.serve_operator(&paths.console_input)?;
            Some(console)
        }
        None => None,
    };
    // libvirt is done placing QEMU (in its own cgroup) once the domain started: the pod's
    // cgroup takes it, and virtiofsd, from here on.
    if req.cgroup.is_some() {
        place_in_pod_cgroup(config, pod_id, paths, rec, qemu_pid)?;
    }
    Ok(Launched {
        name,
        hotplug,
        ended,
        qemu_pid,
        started,
        console,
        tap_server,
        template,
    })
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
    };
    (spec, devices.taps)
}

/// QEMU (`qemu_pid`) and the virtiofsd serving the pod's share into the pod's cgroup.
fn place_in_pod_cgroup(
    config: &NodeConfig,
    pod_id: &str,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    qemu_pid: u32,
) -> Result<(), Error> {
    rec.place(qemu_pid, "QEMU")?;
    let virtiofsd =
        crate::host::pod_cgroup::virtiofsd_pids(&paths.share, &config.helpers.virtiofsd);
    if virtiofsd.is_empty() {
        log::warn!("pod {pod_id}: no virtiofsd of the node's serves the share; it stays in libvirt's cgroup");
    }
    for pid in virtiofsd {
        match rec.place(pid, "virtiofsd") {
            // Gone between the look and the move: nothing of it to place.
            Err(crate::Error::Io { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {
                log::warn!("pod {pod_id}: virtiofsd {pid} ended before it joined the pod's cgroup");
            }
            other => other?,
        }
    }
    Ok(())
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
    qemu_uid: u32,
) -> Result<(Hotplug, tokio::sync::watch::Receiver<bool>, u32), Error> {
    let (stream, qemu_pid) = accept_qemu(&listener, qemu_uid, "vmlet's QMP monitor").await?;
    let qmp = crate::devices::qmp::Qmp::handshake(stream).await?;
    let ended = qmp.ended();
    let ports = spec.hotplug_ports().into_iter().map(|p| p.id).collect();
    Ok((Hotplug::new(qmp, driver, ports), ended, qemu_pid))
}

/// Takes QEMU's connection to `listener` (`what` it is), within [`QEMU_CONNECT_WAIT`].
/// Only a process of the QEMU user (`qemu_uid`) is taken for QEMU; its PID is returned.
async fn accept_qemu(
    listener: &tokio::net::UnixListener,
    qemu_uid: u32,
    what: &str,
) -> Result<(tokio::net::UnixStream, u32), Error> {
    let accept = async {
        loop {
            let (stream, _) = listener
                .accept()
                .await
                .map_err(|e| Error::io(format!("accept {what}"), e))?;
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == qemu_uid => {
                    // Linux always reports the peer's PID; without it QEMU could not be
                    // placed in the pod's cgroup (0 would name the shim itself).
                    let pid = cred.pid().filter(|p| *p > 0).ok_or_else(|| {
                        Error::Internal(format!("the PID of {what}'s peer is unknown"))
                    })?;
                    return Ok::<_, Error>((stream, pid as u32));
                }
                other => log::warn!("{what}: refused a connection not by QEMU ({other:?})"),
            }
        }
    };
    tokio::time::timeout(QEMU_CONNECT_WAIT, accept)
        .await
        .map_err(|_| Error::Timeout(format!("QEMU did not connect {what}")))?
}
