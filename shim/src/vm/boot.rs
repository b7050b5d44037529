//! The boot, top-down: each step records what it makes (in the pod's state) before it makes
//! it, so that a failure anywhere leaves nothing [`crate::host::reclaim::teardown`] cannot find.

use std::sync::Arc;

use vmlet_config::NodeConfig;
use vmlet_protocol::agent_ttrpc::AgentClient;

use super::net::{PodNet, TapServer};
use super::{accel, agent_link, host_setup, launch, net, vsock_backend, BootRequest, Recorder};
use crate::devices::hotplug::Hotplug;
use crate::guest::port_forward::{PortForward, Target};
use crate::guest::vsock::Endpoint;
use crate::host::pod_paths::PodPaths;
use crate::host::pod_user::PodUser;
use crate::task::phases::Phases;
use crate::vmm::VmManager;
use crate::Error;
use std::os::unix::fs::DirBuilderExt;

/// What the boot produced: the running VM's handles.
pub(super) struct Booted {
    pub endpoint: Endpoint,
    pub agent: AgentClient,
    pub boot_id: String,
    pub hotplug: Hotplug,
    pub ended: tokio::sync::watch::Receiver<bool>,
    pub qemu_pid: u32,
    pub tap_server: Option<TapServer>,
    pub port_forward: Option<PortForward>,
    /// QEMU, when the shim started it itself.
    pub qemu: Option<crate::host::qemu_process::QemuProcess>,
}

/// Boots the pod's VM (see the module's steps). On failure the caller tears down what was
/// recorded; what is only in memory (the tap server) goes with the error.
pub(super) async fn run(
    config: &NodeConfig,
    vmm: Arc<dyn VmManager>,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    phases: &Phases,
) -> Result<Booted, Error> {
    let user = super::pod_user(config, req, rec).await?;
    host_setup::prepare(config, req, paths, rec)?;
    phases.mark("host_setup");
    let (netns, mut net) = host_process_and_network(req, paths, rec, phases, &user).await?;
    let direct = launch::starts_direct(config, req);
    let (vsock, vsock_connection) = vsock_backend::start(config, paths, rec, &user, direct).await?;
    phases.mark("vsock_backend");
    let (key, given_key) = agent_link::give_key(&user, paths, direct)?;
    let guest = launch::agent_guest(config, req, paths, &vsock, given_key.qemu_path());
    let (key_pipe, key_file) = given_key.into_parts();
    let taps = net.taps.take();
    let devices = launch::Devices {
        kvm: false,
        direct,
        guest,
        taps,
        user,
        key_pipe,
        vsock_connection,
    };
    let mut launched = launch_domain(config, &vmm, req, paths, rec, phases, devices).await?;
    if let Some(file) = key_file {
        file.given()?;
    }
    let mut template = None;
    if let Some(start) = launched.template.take() {
        template = start
            .finish(
                launched.hotplug.qmp(),
                &req.pod_id,
                &paths.console,
                std::time::Duration::from_secs(config.agent_timeout_secs),
            )
            .await?;
        phases.mark("template");
    }
    let connected =
        agent_link::connect(config, &vmm, &req.pod_id, paths, &vsock, &launched, key).await;
    let (endpoint, agent, boot_id) = match (connected, template) {
        (Ok(connected), _) => connected,
        // A guest from a template whose agent never answers: no pod will be made its own
        // from that template either.
        (Err(e), Some(used)) => return Err(e.within(&used.discard(&req.pod_id).await)),
        (Err(e), None) => return Err(e),
    };
    phases.mark("guest_boot");
    agent_link::configure_network(&agent, &net.interfaces).await?;
    phases.mark("guest_network");
    let port_forward = match &netns {
        Some(netns) => {
            let target = Target::Agent(endpoint.clone());
            PortForward::start(&netns.path, target, &req.pod_id).await?
        }
        None => None,
    };
    phases.mark("port_forward");
    Ok(Booted {
        endpoint,
        agent,
        boot_id,
        hotplug: launched.hotplug,
        ended: launched.ended,
        qemu_pid: launched.qemu_pid,
        tap_server: launched.tap_server,
        port_forward,
        qemu: launched.qemu,
    })
}

/// Starts the pod's host process (and its hooks), then wires the namespace's interfaces to
/// taps. The host process comes first: a hook (nerdctl's CNI) may put the interfaces into
/// the namespace it holds.
async fn host_process_and_network(
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    phases: &Phases,
    user: &PodUser,
) -> Result<(Option<host_setup::PodNetns>, PodNet), Error> {
    let netns = host_setup::start_host_process(req, rec).await?;
    phases.mark("host_process");
    let net = match &netns {
        Some(netns) => net::wire(&req.pod_id, paths, rec, netns, user).await?,
        None => PodNet::default(),
    };
    phases.mark("network");
    Ok((netns, net))
}

/// Chooses KVM or TCG (`devices.kvm` set here), then defines and starts the domain that
/// runs `devices`.
async fn launch_domain(
    config: &NodeConfig,
    vmm: &Arc<dyn VmManager>,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    phases: &Phases,
    mut devices: launch::Devices,
) -> Result<launch::Launched, Error> {
    devices.kvm = accel::use_kvm(config, vmm, &req.options).await?;
    phases.mark("accel");
    let launched = launch::start(config, vmm, req, paths, rec, devices).await?;
    phases.mark("domain");
    Ok(launched)
}

/// What a VM image's boot produced.
pub(super) struct BootedImage {
    pub hotplug: Hotplug,
    pub ended: tokio::sync::watch::Receiver<bool>,
    pub qemu_pid: u32,
    pub tap_server: Option<TapServer>,
    /// One DHCP responder per tap; dropped, they stop.
    pub dhcp: Vec<vmlet_netns::dhcp_server::DhcpServer>,
    pub console: crate::vm_mode::serial_console::SerialConsole,
    /// The QEMU guest agent's port, which runs the pod's execs.
    pub guest_agent: tokio::net::UnixStream,
    /// Port-forward to the guest's pod address.
    pub port_forward: Option<PortForward>,
    /// QEMU, when the shim started it itself (dropped, it is killed).
    pub qemu: Option<crate::host::qemu_process::QemuProcess>,
}

/// Boots a VM image (docs/vm-mode.md): the host side and network as for vmlet's guest,
/// then the disk found in the rootfs, its overlay, the cloud-init seed and a DHCP
/// responder per tap, and the domain that boots them with firmware. No vsock, no agent.
pub(super) async fn run_image(
    config: &NodeConfig,
    vmm: Arc<dyn VmManager>,
    req: &BootRequest,
    image: &crate::vm::pod_vm::ImageRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    phases: &Phases,
) -> Result<BootedImage, Error> {
    let dns = match &image.resolv_conf {
        Some(path) => crate::vm_mode::pod_dns::Dns::read(path).await?,
        None => crate::vm_mode::pod_dns::Dns::default(),
    };
    // The volumes' host devices, opened before anything is made: a missing one fails here.
    let disk_fds = image
        .disks
        .iter()
        .map(crate::devices::block_devices::open_host)
        .collect::<Result<Vec<_>, _>>()?;
    let user = super::pod_user(config, req, rec).await?;
    let direct = launch::starts_direct(config, req);
    let for_qemu = QemuFiles {
        user: &user,
        by_path: !direct,
    };
    host_setup::prepare(config, req, paths, rec)?;
    phases.mark("host_setup");
    let rootfs = crate::host::share::container_rootfs(&paths.dir, &req.container_id)?;
    let (mut disk, file) = crate::vm_mode::vm_disk::find(&rootfs)?;
    // An overlay's size, capped by the node; a persistent root is its volume's size.
    let root = match &image.root_volume {
        None => RootDisk::Overlay(crate::vm_mode::vm_disk::overlay_size(
            &disk,
            image.root_volume_mib,
            config.vm_images.max_root_disk_mib,
        )?),
        Some(volume) => RootDisk::Volume(volume),
    };
    disk.path = crate::vm_mode::vm_disk::bind_for_qemu(
        &file,
        &paths.dir,
        crate::host::pod_paths::IMAGE_DISK,
        &|t| rec.mount(t),
    )?;
    let (netns, mut net) = host_process_and_network(req, paths, rec, phases, &user).await?;
    let dhcp = match &netns {
        Some(netns) => start_dhcp(netns, &net, &dns, &image.hostname).await?,
        None => Vec::new(),
    };
    phases.mark("dhcp");
    let (overlay, root_volume) = match root {
        RootDisk::Overlay(size) => (
            make_overlay(config, req, rec, &disk, size, &for_qemu).await?,
            None,
        ),
        RootDisk::Volume(volume) => {
            let copy_as = crate::host::host_command::ToolConfinement {
                uid: user.uid,
                gid: user.gid,
                cgroup_procs: crate::host::pod_cgroup::procs_files_of(req.cgroup.as_ref())?,
                view: crate::host::qemu_view::MountView::new(&config.state_dir, &paths.dir, false)?,
            };
            let root = crate::vm_mode::persistent_root::prepare(volume, &disk, copy_as).await?;
            if root.copied {
                log::info!(
                    "pod {}: the image's disk copied onto its root volume {}",
                    req.pod_id,
                    root.device.display()
                );
            }
            let root = crate::vmm::vm_spec::RootVolume {
                device: root.device.to_string_lossy().into_owned(),
                rdev: (volume.major, volume.minor),
                offset: crate::vm_mode::persistent_root::OFFSET,
                size: root.size,
            };
            (std::path::PathBuf::new(), Some(root))
        }
    };
    // The seed holds the pod's secrets (its environment, its keys): root's alone, and the
    // volume the pod's QEMU's.
    let seed_dir = &paths.seed_dir;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(seed_dir)
        .map_err(|e| Error::io(format!("create {}", seed_dir.display()), e))?;
    let seed = crate::vm_mode::nocloud::Seed::build(&crate::vm_mode::nocloud::SeedInput {
        instance_id: &image.instance_id,
        hostname: &image.hostname,
        user_data: image.user_data.as_deref(),
        user_data_script: image.user_data_script.as_deref(),
        overwrite: image.user_data_overwrite,
        meta_data: image.meta_data.as_deref(),
        source: image.seed_source,
        ssh_keys: &image.ssh_keys,
        env: &image.env,
        interfaces: &net.interfaces,
        dns: &dns,
        network_config: image.network_config,
        volumes: &image.volumes,
    })?;
    let seed_iso = &paths.seed_iso;
    seed.write_iso(seed_dir, seed_iso).await?;
    for_qemu.give(seed_iso)?;
    phases.mark("disks");
    let guest = crate::vmm::vm_spec::GuestBoot::Image(crate::vmm::vm_spec::ImageDisks {
        overlay: overlay.to_string_lossy().into_owned(),
        backing: disk.path.to_string_lossy().into_owned(),
        backing_format: disk.format,
        seed: seed_iso.to_string_lossy().into_owned(),
        root_bus: image.root_bus,
        firmware: image.firmware,
        guest_agent_socket: paths.guest_agent_socket.to_string_lossy().into_owned(),
        root_volume,
        volumes: crate::vm_mode::volumes::any_shared(&image.volumes).then(|| {
            crate::vmm::vm_spec::VolumeShare {
                socket: paths.share_socket.to_string_lossy().into_owned(),
                dir: paths
                    .share
                    .join(&req.container_id)
                    .join("mounts")
                    .to_string_lossy()
                    .into_owned(),
            }
        }),
    });
    let devices = launch::Devices {
        kvm: false,
        direct,
        guest,
        taps: net.taps.take(),
        user,
        key_pipe: None,
        vsock_connection: None,
    };
    let launched = launch_domain(config, &vmm, req, paths, rec, phases, devices).await?;
    if !image.disks.is_empty() {
        // Plugged while the firmware or the kernel starts: the guest finds them as it
        // enumerates, or when its hot-plug driver comes up.
        launched
            .hotplug
            .attach(&req.container_id, &image.disks, disk_fds)
            .await?;
        phases.mark("volumes");
    }
    let port_forward = match &netns {
        Some(netns) => image_port_forward(netns, &net, &req.pod_id).await?,
        None => None,
    };
    phases.mark("port_forward");
    Ok(BootedImage {
        port_forward,
        hotplug: launched.hotplug,
        ended: launched.ended,
        qemu_pid: launched.qemu_pid,
        tap_server: launched.tap_server,
        dhcp,
        console: launched
            .console
            .ok_or_else(|| Error::Internal("a VM image launched without its console".into()))?,
        guest_agent: launched.guest_agent.ok_or_else(|| {
            Error::Internal("a VM image launched without its guest agent's port".into())
        })?,
        qemu: launched.qemu,
    })
}

/// What a VM image boots: an overlay of this size, or its root volume.
enum RootDisk<'a> {
    Overlay(u64),
    Volume(&'a crate::devices::block_devices::BlockDevice),
}

/// Port-forward to the VM image's address on its first interface (IPv4 first); none, with
/// a warning, when that interface has no address.
async fn image_port_forward(
    netns: &host_setup::PodNetns,
    net: &PodNet,
    pod_id: &str,
) -> Result<Option<PortForward>, Error> {
    let addresses = net
        .interfaces
        .first()
        .map(|i| &i.addresses[..])
        .unwrap_or(&[]);
    let Some(address) = addresses
        .iter()
        .map(|a| a.addr)
        .find(std::net::IpAddr::is_ipv4)
        .or_else(|| addresses.first().map(|a| a.addr))
    else {
        log::warn!("pod {pod_id}: no port-forward: its first interface has no address");
        return Ok(None);
    };
    if let Err(why) = crate::guest::port_forward::check_guest_address(address) {
        log::warn!("pod {pod_id}: no port-forward to the guest: {why}");
        return Ok(None);
    }
    PortForward::start(&netns.path, Target::Address(address), pod_id).await
}

/// A DHCP responder on each of the pod's taps that has an address to give (the guest's
/// interface's, with the pod's DNS and `hostname`).
async fn start_dhcp(
    netns: &host_setup::PodNetns,
    net: &PodNet,
    dns: &crate::vm_mode::pod_dns::Dns,
    hostname: &str,
) -> Result<Vec<vmlet_netns::dhcp_server::DhcpServer>, Error> {
    let mut dhcp = Vec::new();
    for (interface, tap) in net.interfaces.iter().zip(&net.tap_names) {
        let Some(mut lease) = vmlet_netns::dhcp::Lease::for_interface(interface) else {
            continue;
        };
        lease.dns = dns
            .nameservers
            .iter()
            .filter_map(|a| match a {
                std::net::IpAddr::V4(v4) => Some(*v4),
                _ => None,
            })
            .collect();
        lease.domain = dns.search.first().cloned();
        lease.hostname = Some(hostname.to_owned());
        let (path, tap) = (netns.path.clone(), tap.clone());
        let responder = vmlet_netns::dhcp::Responder { lease };
        dhcp.push(
            super::block(move || vmlet_netns::dhcp_server::start(&path, &tap, responder))
                .await?
                .map_err(Error::Network)?,
        );
    }
    Ok(dhcp)
}

/// The VM image's overlay over `disk`, of `size` bytes (room for it made first), in the
/// pod's directory on the node's disk.
async fn make_overlay(
    config: &NodeConfig,
    req: &BootRequest,
    rec: &Recorder<'_>,
    disk: &crate::vm_mode::vm_disk::DiskImage,
    size: u64,
    for_qemu: &QemuFiles<'_>,
) -> Result<std::path::PathBuf, Error> {
    // On the node's disk, not the state directory (a tmpfs): the guest writes it, up to
    // `size`, which the node caps.
    let disk_dir = crate::host::pod_paths::disk_dir(&config.vm_images.disk_dir, &req.pod_id);
    rec.record(crate::host::undo::Made::DiskDir(disk_dir.clone()))?;
    let room = crate::vm_mode::disk_dir::room_for(
        &config.vm_images.disk_dir,
        &config.state_dir,
        &disk_dir,
        size,
    )
    .await?;
    crate::vm_mode::disk_dir::make(&config.vm_images.disk_dir, &disk_dir)?;
    let overlay = disk_dir.join(crate::host::pod_paths::ROOT_DISK);
    crate::vm_mode::vm_disk::create_overlay(disk, &overlay, size).await?;
    drop(room);
    for_qemu.give(&overlay)?;
    Ok(overlay)
}

/// Who a VM image's disks are for. QEMU that libvirt starts opens them by path: they are
/// its user's alone (libvirt relabels nothing of a pod's). QEMU that the shim starts
/// inherits them as descriptors ([`super::direct_image`]): they stay root's, so that not even
/// the pod's QEMU reopens them (the seed holds the pod's secrets). 0600 either way.
struct QemuFiles<'a> {
    user: &'a PodUser,
    by_path: bool,
}

impl QemuFiles<'_> {
    fn give(&self, path: &std::path::Path) -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt;
        match self.by_path {
            true => self.user.give_private(path),
            false => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::io(format!("chmod {}", path.display()), e)),
        }
    }
}
