use ttrpc::Code;

/// Errors of the agent; [`Error::to_ttrpc`] is the one mapping to ttrpc codes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("boot: {0}")]
    Boot(String),
    #[error("container {0} not found")]
    ContainerNotFound(String),
    #[error("container {0} already exists")]
    ContainerExists(String),
    #[error("process {0} not found or already exited")]
    ProcessNotFound(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("process {id} is {state}, cannot {action}")]
    WrongState {
        id: String,
        state: &'static str,
        action: &'static str,
    },
    #[error("container {id}: {message}")]
    ContainerSetup { id: String, message: String },
    #[error("network: {0}")]
    Network(String),
    #[error("block device: {0}")]
    Device(String),
    /// A hot-plugged block device did not show up in time.
    #[error("block device: {0}")]
    DeviceTimeout(String),
    /// A process of the guest did not do what it had to within its deadline.
    #[error("{0}")]
    Timeout(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Error::ContainerNotFound(_) | Error::ProcessNotFound(_) => Code::NOT_FOUND,
            Error::ContainerExists(_) => Code::ALREADY_EXISTS,
            Error::InvalidRequest(_) => Code::INVALID_ARGUMENT,
            Error::WrongState { .. } => Code::FAILED_PRECONDITION,
            Error::DeviceTimeout(_) | Error::Timeout(_) => Code::DEADLINE_EXCEEDED,
            Error::ContainerSetup { .. }
            | Error::Device(_)
            | Error::Boot(_)
            | Error::Network(_)
            | Error::Io { .. } => Code::INTERNAL,
        }
    }

    /// The ttrpc error the shim receives. The message carries the whole source chain.
    pub fn to_ttrpc(&self) -> ttrpc::Error {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        ttrpc::Error::RpcStatus(ttrpc::get_status(self.code(), message))
    }
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> Self {
        e.to_ttrpc()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(Error::ContainerNotFound("a".into()).code(), Code::NOT_FOUND);
        assert_eq!(
            Error::ContainerExists("a".into()).code(),
            Code::ALREADY_EXISTS
        );
        assert_eq!(
            Error::InvalidRequest("a".into()).code(),
            Code::INVALID_ARGUMENT
        );
    }

    #[test]
    fn message_carries_source() {
        let e = Error::io("open x", std::io::Error::from_raw_os_error(2));
        match e.to_ttrpc() {
            ttrpc::Error::RpcStatus(s) => assert!(s.message.contains("No such file")),
            other => panic!("{other:?}"),
        }
    }
}
