//! `vmletctl`: the node operator's tool, beside the shim. It reads the node's pods as the
//! shim left them (state directories, libvirt domains, taps) and installs a release.
//!
//! - [`cli`]: its command line;
//! - [`ctl`]: `ps`, `console` and `gc` (what a lost state leaves outside it: [`gc_leftovers`]); [`pod_listing`]: `ps`'s table and a pod found by
//!   `NAMESPACE/NAME`; [`operator_console`]: `console --interactive`;
//! - [`host_check`]: `check`, what the node has and what vmlet needs of it, over
//!   [`node_program`] (the node's programs, asked with deadlines);
//! - [`node_install`]: `install` and `uninstall` of a release (the files it writes under the
//!   node's root: [`root_files`]), with containerd's config
//!   ([`containerd_config`], its imports and vmlet's drop-in: [`containerd_imports`]), libvirt's AppArmor rules ([`node_apparmor`]), libvirt's
//!   domain directory ([`libvirt_dir`]) and the node's
//!   Kubernetes label ([`node_label`]);
//! - [`metrics_server`]: `metrics --listen`.

pub mod cli;
pub mod containerd_config;
pub mod containerd_imports;
pub mod ctl;
pub mod distro_virtiofsd;
pub mod gc_leftovers;
pub mod host_check;
pub mod libvirt_dir;
pub mod metrics_server;
pub mod node_apparmor;
pub mod node_install;
pub mod node_label;
pub mod node_program;
pub mod operator_console;
pub mod pod_listing;
pub mod root_files;
