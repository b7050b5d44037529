//! What an operator knows a pod by (`pod.json` in its state directory): its Kubernetes
//! namespace and name, what kind of VM it is, its shape, accelerator and launcher, and when
//! its VM was started. The shim writes it as the VM starts; `vmletctl ps` shows it and
//! `vmletctl console NAMESPACE/NAME` finds the pod by it. Nothing of the pod reads it.
//!
//! The file carries a [`VERSION`]: a reader takes a record of its own version or an older
//! one (fields added later have defaults), and names a newer one it cannot read.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The record's name in the pod's state directory.
pub const FILE: &str = "pod.json";
/// The record's layout this version writes.
pub const VERSION: u32 = 1;
/// The largest record read.
const LIMIT: u64 = 16 << 10;

/// What an operator knows the pod by: Kubernetes' namespace and pod name for a CRI pod,
/// else containerd's namespace and the task's id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNames {
    pub namespace: String,
    pub name: String,
}

impl PodNames {
    /// `namespace/name`.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What the pod's VM runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodKind {
    /// vmlet's guest running the pod's containers.
    Containers,
    /// A VM image booted as the pod (docs/vm-mode.md).
    VmImage,
}

impl PodKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PodKind::Containers => "containers",
            PodKind::VmImage => "vm-image",
        }
    }
}

/// One pod's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub version: u32,
    #[serde(flatten)]
    pub names: PodNames,
    pub kind: PodKind,
    pub vcpus: u32,
    /// The memory it booted with (a vmlet guest may grow later, by its containers' limits).
    pub memory_mib: u64,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// `libvirt` or `direct` (QEMU started by the shim).
    pub launcher: String,
    /// When its VM was started, in seconds since the Unix epoch.
    pub started: u64,
}

impl PodRecord {
    /// Writes the record into the pod's state directory `dir` (whole or not at all; root's
    /// alone to read: it names the pod).
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Internal(e.to_string()))?;
        let tmp = dir.join(".pod.json.tmp");
        write_private(&tmp, &json).map_err(|e| Error::io("write the pod's record", e))?;
        std::fs::rename(&tmp, dir.join(FILE)).map_err(|e| Error::io("save the pod's record", e))
    }

    /// The record in the pod's state directory `dir`: None when it has none (a pod still
    /// starting, a VM-mode pod's sandbox, a pod of an earlier version), else the record or
    /// why it cannot be read.
    pub fn load(dir: &Path) -> Option<Result<Self, String>> {
        let path = dir.join(FILE);
        let parsed = match read_private(&path, LIMIT) {
            Ok(None) => return None,
            Ok(Some(text)) => Self::parse(&text),
            Err(e) => Err(e.to_string()),
        };
        Some(parsed.map_err(|e| format!("{}: {e}", path.display())))
    }

    fn parse(text: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let found = serde_json::from_slice::<Version>(text)
            .map_err(|e| e.to_string())?
            .version;
        if found > VERSION {
            return Err(format!(
                "a record of version {found}, newer than this vmlet's ({VERSION})"
            ));
        }
        serde_json::from_slice(text).map_err(|e| e.to_string())
    }
}

/// At most `limit` bytes of the file at `path`, never through a link; None when there is
/// none.
pub(crate) fn read_private(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = Vec::new();
    file.take(limit).read_to_end(&mut text)?;
    Ok(Some(text))
}

/// `bytes` into a new file at `path` (one there is replaced), mode 0600, never through a link.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> PodRecord {
        PodRecord {
            version: VERSION,
            names: PodNames {
                namespace: "default".into(),
                name: "web".into(),
            },
            kind: PodKind::VmImage,
            vcpus: 2,
            memory_mib: 512,
            accel: "tcg".into(),
            launcher: "libvirt".into(),
            started: 1_790_000_000,
        }
    }

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        record().write(dir.path()).unwrap();
        assert_eq!(PodRecord::load(dir.path()).unwrap().unwrap(), record());
        let mode = std::fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.contains(r#""kind": "vm-image""#), "{text}");
        assert!(text.contains(r#""namespace": "default""#), "{text}");
    }

    #[test]
    fn no_record_is_none_and_a_newer_or_broken_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        assert!(PodRecord::load(dir.path()).is_none());
        let mut newer = serde_json::to_value(record()).unwrap();
        newer["version"] = (VERSION + 1).into();
        std::fs::write(dir.path().join(FILE), newer.to_string()).unwrap();
        let err = PodRecord::load(dir.path()).unwrap().unwrap_err();
        assert!(err.contains("newer than this vmlet's"), "{err}");
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        assert!(PodRecord::load(dir.path()).unwrap().is_err());
    }

    #[test]
    fn a_link_in_place_of_the_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, serde_json::to_vec(&record()).unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join(FILE)).unwrap();
        assert!(PodRecord::load(dir.path()).unwrap().is_err());
    }

    #[test]
    fn an_oversized_record_is_cut_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut json = serde_json::to_value(record()).unwrap();
        json["padding"] = "x".repeat(LIMIT as usize).into();
        std::fs::write(dir.path().join(FILE), json.to_string()).unwrap();
        assert!(PodRecord::load(dir.path()).unwrap().is_err());
    }
}
