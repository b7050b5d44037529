//! Pod network namespace plumbing for vmlet.
//!
//! The CNI plugins configured the pod's network namespace before the sandbox is created.
//! [`wire`] carries that network into the VM without changing what the cluster sees: inside
//! the namespace (on a dedicated thread, see [`worker`]) it lists the CNI interfaces, creates
//! one tap per interface with the same MTU, and joins each pair with an `ingress` qdisc and a
//! match-all u32 filter with `mirred egress redirect` in both directions (the model Kata
//! calls tcfilter). The tap file descriptors go to QEMU; the guest gets the interface's MAC,
//! addresses and MTU. [`unwire`] removes exactly what was added. Each tap carries its pod's
//! mark as its alias ([`marks`]), so that one whose pod's state was lost can still be found
//! and removed ([`marked_taps`], [`remove_marked_tap`]).
//!
//! A VM-mode pod (docs/vm-mode.md) whose image ignores cloud-init's network-config gets its
//! interface's address by DHCP: [`dhcp`] answers its VM's requests with what CNI gave the
//! interface, [`dhcp_server`] reads them from the tap.

pub mod dhcp;
pub mod dhcp_server;
mod error;
mod interface;
mod links;
pub mod marks;
mod tap;
mod wiring;
pub mod worker;

pub use error::Error;
pub use interface::{format_mac, is_link_local, Interface, IpNet, Route};
pub use marks::{marked_taps, remove_marked_tap, MarkedTap};
pub use tap::TAP_PREFIX;
pub use wiring::{unwire, wire, Wired, Wiring};
