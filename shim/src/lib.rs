//! `containerd-shim-vmlet-v2`: a containerd shim v2 that runs each task in its own
//! libvirt/QEMU VM and talks to `vmlet-agent` inside it over vsock.
//!
//! - [`task`]: containerd's task API, translated at the edge into calls on [`vm::Vm`]
//!   (the process state machine and the exit rules in their own files);
//! - [`vm`]: one pod's VM (state dir, virtio-fs share, vsock backend, domain, agent);
//! - [`pod_vm`]: the pod's VM as the task service uses it ([`pod_vm::PodVm`]) and how a
//!   sandbox gets one ([`pod_vm::VmBooter`]): the seams its lifecycle tests fake;
//! - [`events`]: the task service's events, through a channel to containerd's publisher;
//! - [`guest`]: the agent's calls behind a trait, with their deadlines and error mapping;
//! - [`pod_paths`]: where a pod's host files are; [`reclaim`]: what is reclaimed after a
//!   pod, its shim or a failed boot (used by the shim, `vmletctl gc` and failed boots);
//! - [`domain`]: the libvirt domain XML from typed structs;
//! - [`vmm`]: the VM manager seam (libvirt; a fake in unit tests);
//! - [`vsock`]: reaching guest ports (vhost-vsock or hybrid vsock), each connection
//!   opened by the agent's handshake (the VM's key);
//! - [`stdio`]: containerd FIFOs <-> raw vsock stream connections (or a VM image's
//!   [`serial_console`]);
//! - [`state`]: what a pod created, persisted for `shim delete`;
//! - [`pod_cgroup`]: the pod's host cgroup, where every host process of its VM goes;
//! - [`hooks`]: OCI hooks run on the host; [`netns_holder`]: the pod's host process whose
//!   PID they are given;
//! - [`block_devices`]: the spec's raw block devices, hot-plugged through vmlet's own QMP
//!   monitor ([`qmp`], its lines bounded); [`memory`]: growing the VM (virtio-mem) to hold its containers'
//!   memory limits;
//! - [`share`]: the pod's shared directory, laid out so the guest cannot steer host path
//!   operations, over [`fd_mount`] (mounts, unmounts and removal by file descriptor);
//!   [`log_dir`]: the size-limited tmpfs for what the guest can make the host log;
//! - [`seccomp`]: the spec's seccomp profile compiled to the BPF program the agent installs;
//! - [`cli`]: the shim's and the emulator wrapper's command lines;
//! - [`features`]: what `-info` tells containerd the runtime supports;
//! - [`pod_metrics`]: each pod's figures, served by its shim for `vmletctl metrics`;
//! - [`vm_disk`]: a VM image's disk and its overlay; [`disk_dir`]: where the overlays
//!   live on the node's disk, and room for them.
//!
//! `vmletctl` (the node operator's tool) and `vmlet-libvirt` (libvirt's calls, made for the
//! shim by a helper process; it and vmletctl are the only programs that link libvirt) are
//! crates of their own.

pub mod block_devices;
pub mod capabilities;
pub mod cli;
pub mod console;
pub mod disk_dir;
pub mod domain;
mod error;
pub mod events;
pub mod fd_mount;
pub mod features;
pub mod file_lock;
pub mod guest;
pub mod guest_text;
pub mod hooks;
pub mod host_command;
pub mod hotplug;
pub mod kvm_probe;
pub mod libvirt_xml;
pub mod log_dir;
pub mod log_uri;
pub mod memory;
pub mod metrics;
pub mod netns_holder;
pub mod nocloud;
pub mod pci_layout;
pub mod phases;
pub mod pod_apparmor;
pub mod pod_cgroup;
pub mod pod_metrics;
pub mod pod_paths;
pub mod pod_vm;
pub mod port_forward;
pub mod qmp;
mod qmp_lines;
pub mod reclaim;
pub mod seccomp;
pub mod serial_console;
pub mod share;
pub mod shim;
pub mod sk_lookup;
pub mod spec;
pub mod state;
pub mod stdio;
pub mod taps;
pub mod task;
pub mod vm;
pub mod vm_disk;
pub mod vmm;
pub mod vmm_helper;
pub mod vsock;

pub use error::Error;

/// Runs the shim (all actions containerd asks of it).
pub async fn run() {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if cli::answer_help_or_version(cli::shim_command(), &args) {
        return;
    }
    // containerd asks `-info` with no TTRPC_ADDRESS, which the shim crate's runner needs.
    if args.iter().any(|a| a == "-info") {
        if let Err(e) = features::print_info() {
            eprintln!("{}: -info: {e}", shim::RUNTIME_ID);
            std::process::exit(1);
        }
        return;
    }
    containerd_shim::asynchronous::run::<shim::VmletShim>(shim::RUNTIME_ID, None).await;
}
