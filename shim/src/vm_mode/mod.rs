//! A pod that boots a VM image instead of running containers on the agent (docs/vm-mode.md):
//! its disk and overlay ([`vm_disk`]) in the node's disk directory ([`disk_dir`]), or its
//! root on a block volume ([`persistent_root`]), its
//! cloud-init seed ([`nocloud`], with the pod's DNS: [`pod_dns`]), which mounts its filesystem volumes ([`volumes`]), and its
//! serial console as its stdio ([`serial_console`]).

pub mod disk_dir;
pub(crate) mod nocloud;
pub(crate) mod persistent_root;
pub(crate) mod pod_dns;
pub mod serial_console;
pub(crate) mod vm_disk;
pub(crate) mod volumes;
