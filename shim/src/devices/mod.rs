//! What goes into the VM while it runs, over vmlet's QMP monitor ([`qmp`], its lines bounded
//! by [`qmp_lines`]): the spec's raw block devices ([`block_devices`], hot-plugged by
//! [`hotplug`]) and memory for the containers' limits ([`memory`]).

pub(crate) mod block_devices;
pub(crate) mod hotplug;
pub(crate) mod memory;
pub(crate) mod qmp;
mod qmp_lines;
