//! The wire protocol between the vmlet shim and `vmlet-agent`.
//!
//! - Control: ttrpc service `vmlet.agent.v1.Agent` on vsock port [`AGENT_PORT`], generated
//!   from `protos/agent.proto` by `ttrpc-codegen` (pure Rust, no protoc).
//! - Stdio: one raw vsock connection per stream to port [`STREAM_PORT`], opened by the host,
//!   which first writes a [`StreamHeader`] line; after it the connection carries the bytes.
//! - Port-forward: one raw vsock connection per forwarded TCP connection to port
//!   [`FORWARD_PORT`], opened by the host with a [`ForwardRequest`] line, answered with a
//!   [`ForwardReply`] line; after an `OK` the connection carries the bytes.
//! - [`hybrid`]: the `CONNECT` handshake of hybrid vsock (`vhost-device-vsock`).
//! - [`cgroup_stats`]: a cgroup's figures as the stats reply carries them (read by the
//!   agent in the guest and by the shim for a VM image on the host).
//! - [`auth`]: what opens every connection on every port, before any of the above: the
//!   host proves it holds the VM's key, the agent proves it back.
//!
//! Everything the host reads from the guest is untrusted: `fuzz/` has cargo-fuzz targets
//! for decoding the agent's messages, the handshake reply and the port-forward reply.

pub mod auth;
pub mod cgroup_stats;
mod forward;
pub mod hybrid;
mod stream;

pub use forward::{ForwardReply, ForwardRequest};
pub use stream::{StreamHeader, StreamKind, MAX_HEADER_LEN};

/// vsock port of the agent's ttrpc server.
pub const AGENT_PORT: u32 = 1024;
/// vsock port for stdio stream connections.
pub const STREAM_PORT: u32 = 1025;
/// vsock port for port-forward connections (to TCP ports on the guest's loopback).
pub const FORWARD_PORT: u32 = 1026;
/// What the agent prints on the guest console once it listens on [`AGENT_PORT`]. The host
/// connects only after seeing it: a vsock connection attempted while the guest's driver
/// is still starting can leave vhost-device-vsock answering nothing for that VM again.
pub const READY_LINE: &str = "agent ready on vsock port";
/// Kernel command-line parameter that boots the agent as a template: a guest booted once,
/// saved, and restored into each pod's VM. It waits, holding nothing of any pod, until the
/// pod's vsock device is plugged in after the restore, and only then reads its key.
pub const TEMPLATE_PARAM: &str = "vmlet.template";
/// What a template's agent prints on the guest console once it waits to be restored: the
/// host saves the guest after seeing it.
pub const TEMPLATE_READY_LINE: &str = "template ready to be saved";
/// The options of a spec's mount the agent applies (anything else is handed to the file
/// system as data). `rro` binds read-only with every mount below (`mount_setattr(2)`,
/// `AT_RECURSIVE`); propagation options are accepted, a guest mount has none to give the
/// host. The shim's `-info` lists these to containerd.
pub const MOUNT_OPTIONS: &[&str] = &[
    "async",
    "atime",
    "bind",
    "dev",
    "diratime",
    "dirsync",
    "exec",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "norelatime",
    "nostrictatime",
    "nosuid",
    "private",
    "rbind",
    "relatime",
    "rprivate",
    "ro",
    "rro",
    "rshared",
    "rslave",
    "rw",
    "shared",
    "slave",
    "strictatime",
    "suid",
    "sync",
];

#[allow(
    clippy::all,
    non_upper_case_globals,
    non_camel_case_types,
    unused_mut,
    unused_imports,
    unused_qualifications,
    missing_docs,
    dead_code
)]
pub mod agent {
    include!(concat!(env!("OUT_DIR"), "/agent.rs"));
}

#[allow(
    clippy::all,
    non_upper_case_globals,
    non_camel_case_types,
    unused_mut,
    unused_imports,
    unused_qualifications,
    missing_docs,
    dead_code
)]
pub mod agent_ttrpc {
    include!(concat!(env!("OUT_DIR"), "/agent_ttrpc.rs"));
}
