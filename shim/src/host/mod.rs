//! What a pod makes on the node, and where it is undone.
//!
//! - [`pod_paths`]: where a pod's files are; [`state`]: what it made, recorded before each
//!   thing is made as an entry of the undo journal ([`undo`]: each kind of entry and its
//!   undo); [`reclaim`]: the one teardown, undoing the journal in reverse (a shim's delete, a
//!   failed boot, `shim delete` after a dead shim, `vmletctl gc`);
//! - [`pod_cgroup`]: the pod's host cgroup, [`cgroup_stats`] a VM image's figures from it;
//!   [`log_dir`]: the size-limited tmpfs for what the
//!   guest can make the host log; [`share`]: the shared directory, over [`fd_mount`] (mounts,
//!   unmounts and removal by file descriptor);
//! - [`netns_holder`]: the pod's host process; [`taps`]: the tap fds handed to the emulator
//!   wrapper; [`sk_lookup`]: port-forwarding's listener in the pod's namespace;
//! - [`host_command`]: host programs run with deadlines and bounded output; [`file_lock`]:
//!   a lock between shims; [`pidfd`]: processes held by pidfd; [`qemu_process`]: QEMU as the
//!   shim's confined child (in its own view of the node's files: [`qemu_view`], under a
//!   profile of its own where AppArmor is on: [`qemu_apparmor`]),
//!   [`virtiofsd`] the pod's virtiofsd and [`vhost_device_vsock`] its
//!   vsock backend;
//! - [`templates`]: saved template VMs, one per VM shape, within the node's limits;
//! - [`pod_record`]: what an operator knows a pod by (`vmletctl ps`); [`pod_user`]: the
//!   pod's own uid, which its QEMU runs as;
//! - [`unix_accept`]: accepting on a socket the shim keeps serving, past an error.

pub(crate) mod cgroup_stats;
pub(crate) mod fd_mount;
pub(crate) mod file_lock;
pub mod host_command;
pub(crate) mod log_dir;
pub(crate) mod netns_holder;
pub(crate) mod pidfd;
pub mod pod_cgroup;
pub mod pod_lock;
pub mod pod_paths;
pub mod pod_record;
pub mod pod_user;
pub mod qemu_apparmor;
pub mod qemu_peer;
pub mod qemu_process;
pub mod qemu_view;
pub mod reclaim;
pub(crate) mod share;
pub(crate) mod sk_lookup;
pub mod state;
pub mod taps;
pub mod templates;
pub mod undo;
pub(crate) mod unix_accept;
pub mod vhost_device_vsock;
pub(crate) mod virtiofsd;
