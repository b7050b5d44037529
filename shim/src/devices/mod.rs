//! What goes into a running VM after it booted, over vmlet's QMP monitor ([`qmp`], its
//! lines bounded by [`qmp_lines`]): the spec's raw block devices ([`block_devices`],
//! hot-plugged by [`hotplug`]) and memory for the containers' limits ([`memory`]), in the
//! slots [`pci_layout`] keeps.

pub(crate) mod block_devices;
pub(crate) mod hotplug;
pub(crate) mod memory;
pub(crate) mod pci_layout;
pub(crate) mod qmp;
mod qmp_lines;
