//! Who the shim takes for a pod's QEMU on the sockets QEMU connects (vmlet's QMP monitor,
//! the tap socket, a VM image's console and guest agent port): a process of the pod's own
//! uid whose PID is QEMU's. The shim knows that PID where it started QEMU itself; under
//! libvirt it is read from the file where libvirt keeps it, which libvirt writes before
//! QEMU's program (vmlet's wrapper, which executes QEMU in the same process) runs. So a
//! process that connects first (before QEMU exists, or beside it) is refused even if it
//! runs as the pod's uid.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use tokio::net::unix::UCred;

/// The longest PID file read (a PID and a newline).
const PID_FILE_MAX: u64 = 32;

/// The pod's QEMU, as a socket's peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuPeer {
    /// The pod's own uid.
    pub uid: u32,
    pub pid: QemuPid,
}

/// Where QEMU's PID is known from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QemuPid {
    /// The shim started QEMU, or has taken its monitor: its PID.
    Is(u32),
    /// libvirt started it: the file libvirt wrote its PID to
    /// ([`crate::vmm::VmManager::qemu_pid_file`]), read at each connection.
    InFile(PathBuf),
}

impl QemuPeer {
    /// The peer's PID where `cred` is the pod's QEMU's; otherwise why it is not.
    pub fn admits(&self, cred: &UCred) -> Result<u32, String> {
        if cred.uid() != self.uid {
            return Err(format!(
                "uid {} (pid {:?}) is not the pod's QEMU's uid {}",
                cred.uid(),
                cred.pid(),
                self.uid
            ));
        }
        // Linux always reports the peer's PID; 0 would name the shim itself.
        let pid = cred
            .pid()
            .filter(|p| *p > 0)
            .ok_or_else(|| "the peer's PID is unknown".to_owned())? as u32;
        let qemu = match &self.pid {
            QemuPid::Is(qemu) => *qemu,
            QemuPid::InFile(file) => read_pid(file)?,
        };
        if pid == qemu {
            Ok(pid)
        } else {
            Err(format!(
                "pid {pid} of uid {} is not QEMU's ({qemu})",
                self.uid
            ))
        }
    }
}

/// The PID in `file`: a regular file of the shim's own user (root's: libvirt's state
/// directory), not a link, read up to [`PID_FILE_MAX`] bytes.
fn read_pid(file: &std::path::Path) -> Result<u32, String> {
    let what = |e: std::io::Error| format!("{}: {e}", file.display());
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)
        .map_err(what)?;
    let meta = opened.metadata().map_err(what)?;
    // SAFETY: geteuid has no preconditions.
    let shims = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != shims {
        return Err(format!(
            "{}: not a regular file of uid {shims}",
            file.display()
        ));
    }
    let mut text = String::new();
    opened
        .take(PID_FILE_MAX)
        .read_to_string(&mut text)
        .map_err(what)?;
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|pid| *pid > 0)
        .ok_or_else(|| format!("{}: {:?} is not a PID", file.display(), text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The credentials of a connection this process makes to itself.
    async fn own_cred(dir: &std::path::Path) -> UCred {
        let path = dir.join("s");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        stream.peer_cred().unwrap()
    }

    #[tokio::test]
    async fn only_the_pid_libvirt_wrote_is_taken_for_qemu() {
        let dir = tempfile::tempdir().unwrap();
        let cred = own_cred(dir.path()).await;
        let me = std::process::id();
        let file = dir.path().join("vmlet-p1.pid");
        let peer = QemuPeer {
            uid: cred.uid(),
            pid: QemuPid::InFile(file.clone()),
        };
        // Before libvirt wrote it (a process that connects before QEMU exists).
        let err = peer.admits(&cred).unwrap_err();
        assert!(err.contains("vmlet-p1.pid"), "{err}");
        // Another process's PID: the peer is not QEMU.
        std::fs::write(&file, "1\n").unwrap();
        let err = peer.admits(&cred).unwrap_err();
        assert!(err.contains(&format!("pid {me} ")), "{err}");
        assert!(err.contains("(1)"), "{err}");
        std::fs::write(&file, format!("{me}\n")).unwrap();
        assert_eq!(peer.admits(&cred), Ok(me));
        // Not a PID, a link, or more than a PID's worth of bytes.
        for text in ["", "x", "0", &"9".repeat(40)] {
            std::fs::write(&file, text).unwrap();
            let err = peer.admits(&cred).unwrap_err();
            assert!(err.contains("is not a PID"), "{text:?}: {err}");
        }
        let real = dir.path().join("real.pid");
        std::fs::write(&real, format!("{me}\n")).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&real, &file).unwrap();
        assert!(peer.admits(&cred).is_err(), "a link is not followed");
    }

    #[tokio::test]
    async fn the_pods_uid_and_the_known_pid_are_both_needed() {
        let dir = tempfile::tempdir().unwrap();
        let cred = own_cred(dir.path()).await;
        let me = std::process::id();
        let other_uid = QemuPeer {
            uid: cred.uid() + 1,
            pid: QemuPid::Is(me),
        };
        let err = other_uid.admits(&cred).unwrap_err();
        assert!(err.contains("is not the pod's QEMU's uid"), "{err}");
        let other_pid = QemuPeer {
            uid: cred.uid(),
            pid: QemuPid::Is(me + 1),
        };
        assert!(other_pid.admits(&cred).is_err());
        let ours = QemuPeer {
            uid: cred.uid(),
            pid: QemuPid::Is(me),
        };
        assert_eq!(ours.admits(&cred), Ok(me));
    }
}
