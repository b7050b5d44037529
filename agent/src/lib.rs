//! vmlet guest agent.
//!
//! Runs as PID 1 in the VM ([`run_agent`]): mounts the basic file systems, loads the kernel
//! modules listed by the image builder, mounts the virtio-fs share, reaps every child, and
//! serves the `vmlet.agent.v1.Agent` ttrpc service on vsock port 1024, raw stdio stream
//! connections on port 1025 and port-forward connections to the guest's loopback on port
//! 1026 ([`forward`]). Every connection first proves that it comes from the pod's shim, with
//! the key QEMU's fw_cfg device carries ([`host_gate`], its handshakes in [`handshake_slots`]); the agent serves nothing without
//! that key.
//!
//! With [`vmlet_protocol::TEMPLATE_PARAM`] the guest boots as a template ([`template`]): it
//! is saved once it is ready and restored into each pod's VM, and it reads its key and
//! mounts the share only after the restore.
//!
//! A Kubernetes emptyDir of medium Memory becomes a tmpfs of the guest the pod's containers
//! share ([`pod_volumes`]).
//!
//! Containers are started by re-executing this binary as [`CONTAINER_INIT_ARG`] in fresh
//! mount, PID, UTS and IPC namespaces ([`launch`]; a container sharing the pod's PID
//! namespace joins it instead); that process ([`container_init`]) sets up the rootfs and
//! waits for the start signal before it executes the container's process.
//! Exec processes are cloned by the container's exec server ([`EXEC_SERVER_ARG`],
//! [`exec_server`]), started at the container's first exec, which has joined the init's
//! namespaces and root once; each process is a child of the agent. A process with a
//! terminal gets a pseudo-terminal whose master end carries its stdin and output.
//! Before it executes, every container process takes the spec's capabilities,
//! `no_new_privileges` and seccomp filter ([`become_process`]); the init also masks the spec's masked paths
//! and makes its read-only paths read-only. The guest is the host's untrusted side: the
//! agent's test faults (`vmlet.fault=` on the kernel command line, [`boot::Faults`]) play
//! a compromised agent for the shim's tests.

pub mod become_process;
mod block_devices;
pub mod boot;
mod cgroup;
mod clock;
pub mod container_init;
mod containers;
mod error;
pub mod exec_server;
mod exec_server_handle;
pub mod forward;
pub mod handshake_slots;
mod helper_fds;
mod helper_status;
pub mod host_gate;
mod in_rootfs;
pub mod init_spec;
pub mod launch;
mod logger;
mod network;
mod pod_volumes;
mod privileges;
mod process_stdio;
mod pty;
mod reaper;
mod request_specs;
mod service;
mod streams;
pub mod template;

pub use error::Error;

/// First argument that turns this binary into the container init.
pub const CONTAINER_INIT_ARG: &str = "__container-init";
/// First argument that turns this binary into a container's exec server.
pub const EXEC_SERVER_ARG: &str = "__exec-server";

/// Runs the agent as the guest's PID 1. Never returns: on a fatal error it powers off, so
/// that the host sees the VM stop instead of a hang.
pub fn run_agent() -> ! {
    logger::init();
    let result = boot::boot().and_then(|boot| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::Boot(format!("tokio runtime: {e}")))?;
        runtime.block_on(service::serve(boot))
    });
    if let Err(e) = result {
        log::error!("vmlet-agent: fatal: {e}");
    }
    boot::power_off()
}
