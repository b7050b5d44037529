//! `containerd-shim-vmlet-v2`: a containerd shim v2 that runs each task in its own
//! libvirt/QEMU VM and talks to `vmlet-agent` inside it over vsock.
//!
//! A pod goes through the folders in this order:
//! - [`task`]: containerd's task API, translated at the edge into calls on the pod's VM
//!   (with its events, metrics and the features `-info` reports);
//! - [`spec`]: every read of the OCI spec (the pod's side, a container's agent request, the
//!   rest of the bundle, devices, the kubelet's volumes, hooks, capabilities, seccomp),
//!   through which [`task`]'s create plan reads it;
//! - [`host`]: what a pod makes on the node (cgroup, share, log tmpfs, taps, the pod's host
//!   process), its undo journal ([`host::undo`]) and [`host::reclaim`], the teardown from
//!   it;
//! - [`vm`]: one pod's VM, its boot read top-down over one module per step;
//! - [`vmm`]: the VM's one description (`vmm::vm_spec`: its devices, each with its PCI
//!   slot) and what is derived from it (the domain XML, QEMU's arguments, the NICs, the pod's
//!   AppArmor profile), and the seam to libvirt, which the shim reaches through
//!   `vmlet-libvirt`;
//! - [`devices`]: what is added to the VM while it runs (block devices, memory) over vmlet's
//!   QMP monitor;
//! - [`guest`]: the agent's calls, the vsock route to it, the containers' stdio;
//! - [`vm_mode`]: a pod that boots a VM image (its disk, cloud-init seed, serial console).
//!
//! [`cli`] holds the shim's and the emulator wrapper's command lines; [`Error`] maps every
//! error to its ttrpc code.

pub mod cli;
pub mod devices;
mod error;
pub mod guest;
pub mod host;
pub(crate) mod spec;
pub mod task;
pub mod vm;
pub mod vm_mode;
pub mod vmm;

pub use error::Error;

/// Sets the process's umask to 077: every file, directory and socket the shim makes is its
/// own (root's) alone unless the code gives it a mode or an owner (the pod's directory, the
/// sockets its QEMU connects). Programs the shim runs for others (OCI hooks, a logging
/// binary) get 022 back; virtiofsd and vhost-device-vsock set theirs.
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Runs the shim (all actions containerd asks of it).
pub async fn run() {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if cli::answer_help_or_version(cli::shim_command(), &args) {
        return;
    }
    // containerd asks `-info` with no TTRPC_ADDRESS, which the shim crate's runner needs.
    if args.iter().any(|a| a == "-info") {
        if let Err(e) = task::features::print_info() {
            eprintln!("{}: -info: {e}", task::shim::RUNTIME_ID);
            std::process::exit(1);
        }
        return;
    }
    containerd_shim::asynchronous::run::<task::shim::VmletShim>(task::shim::RUNTIME_ID, None).await;
}
