//! The shim's error type and its one mapping to ttrpc codes.

use containerd_shim_protos::ttrpc;
use ttrpc::Code;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input from the user: spec, annotations, request fields.
    #[error("{0}")]
    InvalidArgument(String),
    /// The node config is wrong; the operator must fix it.
    #[error("node config")]
    Config(#[source] vmlet_config::Error),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// The node's operator does not let pods do this (an annotation off the allowlist).
    #[error("{0}")]
    PermissionDenied(String),
    /// A per-pod limit is reached (hot-plug ports).
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0} is not supported yet")]
    Unimplemented(String),
    #[error("libvirt: {0}")]
    Libvirt(String),
    /// The pod network could not be carried into the VM.
    #[error("pod network")]
    Network(#[source] vmlet_netns::Error),
    /// The agent answered with an error (its ttrpc code is kept).
    #[error("agent: {message}")]
    Agent { code: Code, message: String },
    /// The connection to the agent broke or timed out: what the guest did is unknown.
    #[error("agent unreachable: {0}")]
    AgentLost(String),
    #[error("{0}")]
    Timeout(String),
    /// An OCI hook failed (its message names the hook).
    #[error("{0}")]
    Hook(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The same error (its code kept) with `what` said before its message, as `what: ...`
    /// (after the kind's own word, where it has one: `agent: what: ...`).
    pub fn within(self, what: &str) -> Self {
        let prefix = |m: String| format!("{what}: {m}");
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(prefix(m)),
            Error::NotFound(m) => Error::NotFound(prefix(m)),
            Error::AlreadyExists(m) => Error::AlreadyExists(prefix(m)),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(prefix(m)),
            Error::PermissionDenied(m) => Error::PermissionDenied(prefix(m)),
            Error::ResourceExhausted(m) => Error::ResourceExhausted(prefix(m)),
            Error::Unimplemented(m) => Error::Unimplemented(prefix(m)),
            Error::Libvirt(m) => Error::Libvirt(prefix(m)),
            Error::Agent { code, message } => Error::Agent {
                code,
                message: prefix(message),
            },
            Error::AgentLost(m) => Error::AgentLost(prefix(m)),
            Error::Timeout(m) => Error::Timeout(prefix(m)),
            Error::Hook(m) => Error::Hook(prefix(m)),
            Error::Io { context, source } => Error::Io {
                context: prefix(context),
                source,
            },
            Error::Internal(m) => Error::Internal(prefix(m)),
            // Their sources carry their kind: said in one message, under the same code.
            e @ (Error::Config(_) | Error::Network(_)) => match e.code() {
                Code::INVALID_ARGUMENT => Error::InvalidArgument(prefix(e.message())),
                Code::PERMISSION_DENIED => Error::PermissionDenied(prefix(e.message())),
                Code::FAILED_PRECONDITION => Error::FailedPrecondition(prefix(e.message())),
                _ => Error::Internal(prefix(e.message())),
            },
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Error::Config(e) => match e {
                vmlet_config::Error::InvalidAnnotation { .. }
                | vmlet_config::Error::UnknownAnnotation { .. } => Code::INVALID_ARGUMENT,
                _ => Code::FAILED_PRECONDITION,
            },
            Error::NotFound(_) => Code::NOT_FOUND,
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::FailedPrecondition(_) | Error::Hook(_) => Code::FAILED_PRECONDITION,
            Error::Unimplemented(_) => Code::UNIMPLEMENTED,
            Error::PermissionDenied(_) => Code::PERMISSION_DENIED,
            Error::ResourceExhausted(_) => Code::RESOURCE_EXHAUSTED,
            Error::Agent { code, .. } => *code,
            Error::AgentLost(_) => Code::UNAVAILABLE,
            Error::Network(e) => match e {
                vmlet_netns::Error::Enter { .. } | vmlet_netns::Error::NoInterface(_) => {
                    Code::FAILED_PRECONDITION
                }
                _ => Code::INTERNAL,
            },
            Error::Timeout(_) => Code::DEADLINE_EXCEEDED,
            Error::Libvirt(_) | Error::Io { .. } | Error::Internal(_) => Code::INTERNAL,
        }
    }

    /// The full message, sources included.
    pub fn message(&self) -> String {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        message
    }
}

impl From<vmlet_config::Error> for Error {
    fn from(e: vmlet_config::Error) -> Self {
        match e {
            vmlet_config::Error::InvalidAnnotation { .. }
            | vmlet_config::Error::UnknownAnnotation { .. } => {
                Error::InvalidArgument(e.to_string())
            }
            vmlet_config::Error::AnnotationNotAllowed { .. }
            | vmlet_config::Error::AnnotationBeyondLimits { .. } => {
                Error::PermissionDenied(e.to_string())
            }
            other => Error::Config(other),
        }
    }
}

impl From<ttrpc::Error> for Error {
    fn from(e: ttrpc::Error) -> Self {
        match e {
            // The message is the guest's: bounded and without control characters.
            ttrpc::Error::RpcStatus(status) => Error::Agent {
                code: status.code(),
                message: crate::guest::guest_text::clean(
                    &status.message,
                    crate::guest::guest_text::MAX_MESSAGE,
                ),
            },
            other => Error::AgentLost(other.to_string()),
        }
    }
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.message()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_containerd_depends_on() {
        let cases = [
            (Error::InvalidArgument("x".into()), Code::INVALID_ARGUMENT),
            (Error::NotFound("x".into()), Code::NOT_FOUND),
            (Error::AlreadyExists("x".into()), Code::ALREADY_EXISTS),
            (
                Error::FailedPrecondition("x".into()),
                Code::FAILED_PRECONDITION,
            ),
            (Error::Unimplemented("x".into()), Code::UNIMPLEMENTED),
            (Error::Hook("x".into()), Code::FAILED_PRECONDITION),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
        }
    }

    #[test]
    fn bad_annotation_is_invalid_argument_and_names_the_key() {
        let e: Error = vmlet_config::Error::InvalidAnnotation {
            key: "vmlet.io/memory".into(),
            value: "lots".into(),
            reason: "no".into(),
        }
        .into();
        assert_eq!(e.code(), Code::INVALID_ARGUMENT);
        match ttrpc::Error::from(e) {
            ttrpc::Error::RpcStatus(s) => assert!(s.message.contains("vmlet.io/memory")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn annotation_off_the_allowlist_is_permission_denied_and_named() {
        let e: Error = vmlet_config::Error::AnnotationNotAllowed {
            key: "vmlet.io/kernel-params".into(),
        }
        .into();
        assert_eq!(e.code(), Code::PERMISSION_DENIED);
        assert!(
            e.message().contains("vmlet.io/kernel-params"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn agent_messages_are_cleaned() {
        let long = format!("\x1b]0;owned\x07{}", "z".repeat(100_000));
        let e: Error = ttrpc::Error::RpcStatus(ttrpc::get_status(Code::INTERNAL, long)).into();
        let message = e.message();
        assert!(
            !message.contains('\x1b') && !message.contains('\x07'),
            "{message}"
        );
        assert!(message.len() < 2 * crate::guest::guest_text::MAX_MESSAGE);
    }

    #[test]
    fn what_an_error_was_within_is_said_first_and_its_code_kept() {
        let cases = [
            Error::Timeout("no answer".into()),
            Error::io("read x", std::io::Error::other("gone")),
            Error::Agent {
                code: Code::NOT_FOUND,
                message: "no such NIC".into(),
            },
        ];
        let expected = [
            "plug NIC 0: no answer",
            "plug NIC 0: read x: gone",
            "agent: plug NIC 0: no such NIC",
        ];
        for (e, expected) in cases.into_iter().zip(expected) {
            let code = e.code();
            let within = e.within("plug NIC 0");
            assert_eq!(within.code(), code);
            assert_eq!(within.message(), expected);
        }
        let with_sources: [Error; 2] = [
            vmlet_config::Error::InvalidAnnotation {
                key: "vmlet.io/memory".into(),
                value: "lots".into(),
                reason: "no".into(),
            }
            .into(),
            vmlet_config::Error::AnnotationNotAllowed {
                key: "vmlet.io/kernel-params".into(),
            }
            .into(),
        ];
        for e in with_sources {
            let code = e.code();
            let within = e.within("boot");
            assert_eq!(within.code(), code, "{within}");
            assert!(within.message().starts_with("boot: "), "{within}");
        }
    }

    #[test]
    fn agent_codes_pass_through() {
        let e: Error = ttrpc::Error::RpcStatus(ttrpc::get_status(Code::NOT_FOUND, "gone")).into();
        assert_eq!(e.code(), Code::NOT_FOUND);
    }
}
