//! The pod network in the VM: every interface of the pod namespace is wired to a tap
//! ([`vmlet_netns::wire`]); once the VM is described, a tap server hands the taps' fds, each
//! with its NIC's slot, to vmlet-vmwrapper (QEMU's side) once ([`PendingTaps::serve`]). The
//! agent gets the addresses and routes later ([`super::agent_link`]).

use std::os::fd::OwnedFd;

use super::host_setup::PodNetns;
use super::{block, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::pod_user::PodUser;
use crate::host::qemu_peer::QemuPeer;
use crate::host::taps::TapDescription;
use crate::vmm::vm_spec::{Network, Nic};
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
    /// The taps, until the VM's description gives each NIC its slot (none: no NIC).
    pub taps: Option<PendingTaps>,
}

/// The taps of a pod, with the socket vmlet-vmwrapper will fetch them from, not yet served.
pub(super) struct PendingTaps {
    /// The VM's NICs (slots come with the VM's description).
    pub network: Network,
    listener: tokio::net::UnixListener,
    fds: Vec<OwnedFd>,
    /// The pod's QEMU's user, given the socket only as it is served: nothing of that uid
    /// that runs before QEMU (`qemu-img` on a VM image's disk) can connect it.
    user: PodUser,
}

impl PendingTaps {
    fn check(&self, described: &[TapDescription]) -> Result<(), Error> {
        if described.len() != self.fds.len() {
            return Err(Error::Internal(format!(
                "{} NICs described for {} taps",
                described.len(),
                self.fds.len()
            )));
        }
        Ok(())
    }

    /// Taps `fds` described by `network`, to serve on `listener` (root's until served) to
    /// `user`'s QEMU.
    pub fn new(
        network: Network,
        listener: tokio::net::UnixListener,
        fds: Vec<OwnedFd>,
        user: PodUser,
    ) -> Self {
        PendingTaps {
            network,
            listener,
            fds,
            user,
        }
    }

    /// Each of the VM's NICs as `described` beside its tap's fd, for the shim to plug in
    /// itself (a template start): nothing is served. A description per fd, or an error.
    pub fn into_nics(
        self,
        described: Vec<TapDescription>,
    ) -> Result<Vec<(TapDescription, OwnedFd)>, Error> {
        self.check(&described)?;
        Ok(described.into_iter().zip(self.fds).collect())
    }

    /// Serves the taps as `described` (the VM's NICs, each with its slot) to the first
    /// connection of the pod's QEMU (`qemu`); a description per fd, or an error.
    pub fn serve(self, described: Vec<TapDescription>, qemu: QemuPeer) -> Result<TapServer, Error> {
        self.check(&described)?;
        self.user
            .give_private(std::path::Path::new(&self.network.tap_socket))?;
        Ok(TapServer(crate::host::taps::serve(
            self.listener,
            described,
            self.fds,
            qemu,
        )))
    }
}

/// Wires the interfaces of `netns` to taps (recorded in the pod's state) and binds the socket
/// they will be served on; [`PendingTaps::serve`] serves them once the VM is described.
pub(super) async fn wire(
    pod_id: &str,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    netns: &PodNetns,
    user: &PodUser,
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
    let nics: Vec<Nic> = wired
        .wirings
        .iter()
        .map(|w| Nic {
            mac: w.interface.mac_string(),
            mtu: w.interface.mtu,
        })
        .collect();
    if nics.len() > crate::vmm::pci_slots::MAX_NICS {
        return Err(Error::Unimplemented(format!(
            "more than {} pod interfaces",
            crate::vmm::pci_slots::MAX_NICS
        )));
    }
    let tap_names: Vec<_> = wired.wirings.iter().map(|w| w.tap_name.clone()).collect();
    let interfaces: Vec<_> = wired.wirings.into_iter().map(|w| w.interface).collect();
    log::info!(
        "pod {pod_id}: wired {} interface(s) from {}",
        interfaces.len(),
        netns.path.display()
    );
    if nics.is_empty() {
        return Ok(PodNet {
            interfaces,
            tap_names,
            ..PodNet::default()
        });
    }
    // Bound under the shim's umask (077): root's alone until it is served.
    let listener = tokio::net::UnixListener::bind(&paths.tap_socket)
        .map_err(|e| Error::io(format!("bind {}", paths.tap_socket.display()), e))?;
    Ok(PodNet {
        interfaces,
        tap_names,
        taps: Some(PendingTaps::new(
            Network {
                tap_socket: paths.tap_socket.to_string_lossy().into_owned(),
                nics,
            },
            listener,
            wired.taps,
            user.clone(),
        )),
    })
}
