//! The pod network in the VM: every interface of the pod namespace is wired to a tap
//! ([`vmlet_netns::wire`]), and a tap server hands the taps' fds to vmlet-vmwrapper (QEMU's
//! side) once. The agent gets the addresses and routes later ([`super::agent_link`]).

use vmlet_config::NodeConfig;

use super::host_setup::PodNetns;
use super::{block, give_socket, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::taps::TapDescription;
use crate::Error;

/// The tap server of a pod; stopping it (or dropping it) closes the shim's copies of the
/// taps' fds.
pub struct TapServer(tokio::task::JoinHandle<()>);

impl TapServer {
    pub fn stop(&self) {
        self.0.abort();
    }
}

impl Drop for TapServer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The pod network as the VM gets it.
#[derive(Default)]
pub(super) struct PodNet {
    /// What the agent configures in the guest.
    pub interfaces: Vec<vmlet_netns::Interface>,
    /// Each interface's tap, in the same order.
    pub tap_names: Vec<String>,
    /// Where vmlet-vmwrapper fetches the taps (none: no NIC).
    pub tap_socket: Option<String>,
    pub tap_server: Option<TapServer>,
}

/// Wires the interfaces of `netns` to taps (recorded in the pod's state) and serves them.
pub(super) async fn wire(
    config: &NodeConfig,
    pod_id: &str,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    netns: &PodNetns,
) -> Result<PodNet, Error> {
    rec.record(crate::host::undo::Made::Network {
        netns: netns.path.clone(),
        wirings: Vec::new(),
    })?;
    let (path, owner) = (netns.path.clone(), pod_id.to_owned());
    let wired = match block(move || vmlet_netns::wire(&path, &owner)).await? {
        Ok(wired) => wired,
        Err(vmlet_netns::Error::NoInterface(_)) if netns.may_be_empty => {
            vmlet_netns::Wired::default()
        }
        Err(e) => return Err(Error::Network(e)),
    };
    rec.try_save(|s| s.wired(&netns.path, wired.wirings.clone()))?;
    let taps: Vec<TapDescription> = wired
        .wirings
        .iter()
        .map(|w| TapDescription {
            mac: w.interface.mac_string(),
            mtu: w.interface.mtu,
        })
        .collect();
    if taps.len() > crate::host::taps::MAX_TAPS {
        return Err(Error::Unimplemented(format!(
            "more than {} pod interfaces",
            crate::host::taps::MAX_TAPS
        )));
    }
    let tap_names: Vec<_> = wired.wirings.iter().map(|w| w.tap_name.clone()).collect();
    let interfaces: Vec<_> = wired.wirings.into_iter().map(|w| w.interface).collect();
    log::info!(
        "pod {pod_id}: wired {} interface(s) from {}",
        interfaces.len(),
        netns.path.display()
    );
    if taps.is_empty() {
        return Ok(PodNet {
            interfaces,
            tap_names,
            ..PodNet::default()
        });
    }
    let listener = tokio::net::UnixListener::bind(&paths.tap_socket)
        .map_err(|e| Error::io(format!("bind {}", paths.tap_socket.display()), e))?;
    let qemu_uid = give_socket(&paths.tap_socket, &config.qemu_user)?;
    Ok(PodNet {
        interfaces,
        tap_names,
        tap_socket: Some(paths.tap_socket.to_string_lossy().into_owned()),
        tap_server: Some(TapServer(crate::host::taps::serve(
            listener, taps, wired.taps, qemu_uid,
        ))),
    })
}
