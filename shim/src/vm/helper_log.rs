//! The output of a process the shim starts for a pod (QEMU, virtiofsd): a new file of the
//! pod's log tmpfs, whose end an error quotes when the process fails as it starts.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::Error;

/// A new file of the pod's (the log tmpfs'), for a process's output; an existing one (or
/// a link) is refused.
pub(super) fn create(path: &Path) -> Result<File, Error> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))
}

/// `what` ended as it started: the error quotes its log.
pub(super) fn ended(log: &Path, what: &str) -> Error {
    Error::FailedPrecondition(format!("{what} ended as it started: {}", tail(log)))
}

/// The end of a process's log, for an error: read as the console's tail is (bounded, its
/// control characters dropped: what QEMU and virtiofsd log, the guest may have caused).
pub(super) fn tail(log: &Path) -> String {
    match crate::guest::console::tail(log).trim() {
        "" => format!("{} is empty", log.display()),
        text => format!("{}: {text}", log.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_quotes_the_end_of_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("qemu.log");
        let mut long = "x".repeat(5000);
        long.push_str("\nqemu: -device foo: not found");
        std::fs::write(&log, long).unwrap();
        let tail = tail(&log);
        assert!(tail.ends_with("not found"), "{tail}");
        assert!(tail.len() < crate::guest::console::CONSOLE_TAIL as usize + 100);
        std::fs::write(&log, "").unwrap();
        assert!(super::tail(&log).ends_with("is empty"));
        let exists = create(&log).unwrap_err();
        assert!(exists.message().contains("qemu.log"), "{exists}");
    }
}
