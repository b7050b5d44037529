use std::path::PathBuf;

/// Errors of the netns crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod's network namespace cannot be opened or entered.
    #[error("cannot enter network namespace {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The namespace has no interface a VM could use.
    #[error("network namespace {0} has no usable interface (only loopback)")]
    NoInterface(PathBuf),
    /// A netlink request failed.
    #[error("netlink: {what}: {message}")]
    Netlink { what: String, message: String },
    /// Creating or configuring a tap failed.
    #[error("tap {name}")]
    Tap {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The namespace worker thread failed.
    #[error("network namespace worker: {0}")]
    Worker(String),
}

impl Error {
    pub(crate) fn netlink(what: impl Into<String>, e: impl std::fmt::Display) -> Self {
        Error::Netlink {
            what: what.into(),
            message: e.to_string(),
        }
    }
}
