use std::path::PathBuf;

/// Everything that can be wrong with the node config or a pod's annotations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file exists but could not be read.
    #[error("cannot read config file {path}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has an unknown key or a value of the wrong type.
    /// The message of `toml` names the key, the line and the column.
    #[error("config file {path}: {message}")]
    ParseConfig { path: PathBuf, message: String },
    /// A config value has the right type but is out of range.
    #[error("config key `{key}`: {reason}")]
    InvalidConfig { key: &'static str, reason: String },
    /// A `vmlet.io/` annotation that vmlet does not know (a typo must not be ignored).
    #[error("unknown annotation `{key}` (known: {known})")]
    UnknownAnnotation { key: String, known: String },
    /// A known annotation that the node's `annotations.allowed` does not list: the operator
    /// has not let pods set it.
    #[error("annotation `{key}` is not allowed on this node (the operator's annotations.allowed does not list it)")]
    AnnotationNotAllowed { key: String },
    /// A sizing annotation above the pod's limits (plus the node's overhead): the VM would
    /// take more of the node than kubelet accounts for the pod, which only the node's
    /// `annotations.beyond_limits` permits.
    #[error("annotation `{key}`: {value} is above the pod's limit of {limit} (its limit plus the node's overhead); the node does not allow annotations beyond a pod's limits (annotations.beyond_limits)")]
    AnnotationBeyondLimits {
        key: String,
        value: String,
        limit: String,
    },
    /// A known annotation with a bad value.
    #[error("annotation `{key}`: bad value {value:?}: {reason}")]
    InvalidAnnotation {
        key: String,
        value: String,
        reason: String,
    },
}
