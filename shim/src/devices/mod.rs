//! What goes into the VM while it runs, over vmlet's QMP monitor ([`qmp`], its lines bounded
//! by [`qmp_lines`], which also bound the QEMU guest agent's): the spec's raw block devices ([`block_devices`], hot-plugged by
//! [`hotplug`]), memory for the containers' limits ([`memory`]), and a template start's
//! save and load of the whole VM ([`snapshot`]) with the pod's own vsock device plugged in
//! after the load ([`identity`]).

pub(crate) mod block_devices;
pub(crate) mod hotplug;
pub mod identity;
pub(crate) mod memory;
pub mod qmp;
pub(crate) mod qmp_lines;
pub mod snapshot;
