//! Pod network namespace plumbing for vmlet.
//!
//! The walking skeleton boots VMs without a network; issue 3 fills this crate with what
//! DESIGN.md describes: entering the pod netns on a dedicated thread, reading the CNI
//! interfaces, creating taps and joining them to the CNI interfaces with tc mirred.
//! Until then it only names the error type the shim will map to ttrpc codes.
#![forbid(unsafe_code)]

/// Errors of the netns crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Pod networking is not wired into the VM yet.
    #[error("pod networking is not supported yet")]
    Unsupported,
}
