//! The boot, top-down: each step records what it makes (in the pod's state) before it makes
//! it, so that a failure anywhere leaves nothing [`crate::reclaim::teardown`] cannot find.

use std::sync::Arc;

use vmlet_config::NodeConfig;
use vmlet_protocol::agent_ttrpc::AgentClient;

use super::net::{PodNet, TapServer};
use super::{accel, agent_link, host_side, launch, net, vsock_backend, BootRequest, Recorder};
use crate::hotplug::Hotplug;
use crate::phases::Phases;
use crate::pod_paths::PodPaths;
use crate::port_forward::PortForward;
use crate::vmm::VmManager;
use crate::vsock::Endpoint;
use crate::Error;

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
    host_side::prepare(config, req, paths, rec)?;
    phases.mark("host_side");
    // The pod's host process and its hooks come before the network: a hook (nerdctl's CNI)
    // may put the interfaces into the namespace it holds.
    let netns = host_side::start_host_process(req, rec).await?;
    phases.mark("host_process");
    let net = match &netns {
        Some(netns) => net::wire(config, &req.pod_id, paths, rec, netns).await?,
        None => PodNet::default(),
    };
    phases.mark("network");
    let vsock = vsock_backend::start(config, paths, rec).await?;
    phases.mark("vsock_backend");
    let kvm = accel::use_kvm(config, &vmm, &req.options).await?;
    phases.mark("accel");
    let launched = launch::start(
        config,
        &vmm,
        req,
        paths,
        rec,
        launch::Devices {
            kvm,
            vsock: &vsock,
            tap_socket: net.tap_socket.clone(),
        },
    )
    .await?;
    phases.mark("domain");
    let (endpoint, agent, boot_id) =
        agent_link::connect(config, &vmm, &req.pod_id, paths, &vsock, &launched).await?;
    phases.mark("guest_boot");
    agent_link::configure_network(&agent, &net.interfaces).await?;
    phases.mark("guest_network");
    let port_forward = match &netns {
        Some(netns) => PortForward::start(&netns.path, endpoint.clone(), &req.pod_id).await?,
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
        tap_server: net.tap_server,
        port_forward,
    })
}
