//! Saved template VMs on the node's disk, for template starts: one file per VM shape,
//! `<key>.vmstate` in the node's template directory (root's, mode 0700: only shims open
//! them; QEMU is handed a descriptor, [`crate::devices::snapshot`]). The key is a hash of
//! everything the saved state depends on ([`key`]): the shape, the guest's kernel and
//! initramfs, its command line, the devices, QEMU's version.
//!
//! Pods choose their shapes (a Kubernetes user writes the annotations), so what they can
//! make of the directory is bounded: at most [`Limits::max_count`] files and
//! [`Limits::max_bytes`] between them, and never more than the file system has free. A new
//! file is counted at the size its saver reserves (the most it may take: the guest's RAM);
//! a saved one at what it takes on the disk (the files are sparse, and a commit that took
//! more than was reserved is refused); one being saved at the larger of that and its length.
//! These are checked, and a new file made, under a lock on the directory; past a limit
//! there is no template for the shape, and its pods start cold.
//!
//! A file is written as `<key>.partial`, created new (so one shim at a time saves a shape),
//! and renamed to `<key>.vmstate` once its save completed ([`Reserved::commit`]); dropped
//! before that, it is removed. A partial file older than [`STALE_PARTIAL`] (its shim died
//! while saving) is removed by the next reservation of its shape. Nothing in the directory
//! is followed: every open is `O_NOFOLLOW`, and only shims write names there.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::Error;

/// The lock file in the template directory.
const LOCK_FILE: &str = ".vmlet.lock";
/// How long a reservation waits for another's.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);
/// A save takes well under a second; a partial file this old was left by a shim that died.
pub const STALE_PARTIAL: Duration = Duration::from_secs(300);
const SAVED: &str = "vmstate";
const PARTIAL: &str = "partial";

/// What the template directory may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_count: usize,
    pub max_bytes: u64,
}

/// The key of a saved state: the SHA-256, in hex, of `description`, which names everything
/// the state depends on (a load into a VM that differs in any of it fails or misbehaves).
pub fn key(description: &str) -> String {
    Sha256::digest(description.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The node's template directory.
pub struct TemplateStore {
    dir: PathBuf,
    limits: Limits,
}

/// A state being saved: its partial file, removed unless committed.
#[derive(Debug)]
pub struct Reserved {
    partial: PathBuf,
    saved: PathBuf,
    file: File,
    size: u64,
    committed: bool,
}

impl TemplateStore {
    pub fn new(dir: impl Into<PathBuf>, limits: Limits) -> Self {
        TemplateStore {
            dir: dir.into(),
            limits,
        }
    }

    fn path(&self, key: &str, kind: &str) -> PathBuf {
        self.dir.join(format!("{key}.{kind}"))
    }

    /// The saved state of `key`, read-only; `None` while there is none.
    pub fn open(&self, key: &str) -> Result<Option<File>, Error> {
        check_key(key)?;
        let path = self.path(key, SAVED);
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("open {}", path.display()), e)),
        }
    }

    /// Removes `key`'s saved state (one that did not load); gone already is no error.
    pub fn discard(&self, key: &str) -> Result<(), Error> {
        check_key(key)?;
        let path = self.path(key, SAVED);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("remove {}", path.display()), e))
            }
            _ => Ok(()),
        }
    }

    /// Makes the partial file for saving `key`'s state of at most `size` bytes, if the limits
    /// and the file system leave room for it; `Ok(None)` where they do not, or where another
    /// shim is saving it (the reason is logged).
    pub async fn reserve(&self, key: &str, size: u64) -> Result<Option<Reserved>, Error> {
        check_key(key)?;
        self.make_dir()?;
        let _lock =
            crate::host::file_lock::exclusive(&self.dir.join(LOCK_FILE), LOCK_DEADLINE).await?;
        let partial = self.path(key, PARTIAL);
        if let Ok(meta) = std::fs::symlink_metadata(&partial) {
            let age = meta.modified().ok().and_then(|m| m.elapsed().ok());
            if age.is_some_and(|age| age < STALE_PARTIAL) {
                log::info!("template {key}: another shim is saving it");
                return Ok(None);
            }
            std::fs::remove_file(&partial)
                .map_err(|e| Error::io(format!("remove {}", partial.display()), e))?;
        }
        let (count, bytes) = self.held();
        if count >= self.limits.max_count || bytes.saturating_add(size) > self.limits.max_bytes {
            log::info!(
                "template {key}: the template directory {} holds {count} templates of {} MiB (limits: {}, {} MiB); pods of this shape start cold",
                self.dir.display(),
                bytes >> 20,
                self.limits.max_count,
                self.limits.max_bytes >> 20
            );
            return Ok(None);
        }
        let st = nix::sys::statvfs::statvfs(&self.dir)
            .map_err(|e| Error::io(format!("statvfs {}", self.dir.display()), e.into()))?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        if free < size {
            log::info!(
                "template {key}: {} has {} MiB free, a template of this shape may take {} MiB; pods of this shape start cold",
                self.dir.display(),
                free >> 20,
                size >> 20
            );
            return Ok(None);
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&partial)
            .map_err(|e| Error::io(format!("create {}", partial.display()), e))?;
        Ok(Some(Reserved {
            saved: self.path(key, SAVED),
            partial,
            file,
            size,
            committed: false,
        }))
    }

    /// How many saved and partial files the directory holds, and their full sizes.
    fn held(&self) -> (usize, u64) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                let meta = e.metadata().ok()?;
                let held = meta.blocks() * 512;
                if name.ends_with(&format!(".{SAVED}")) {
                    Some(held)
                } else if name.ends_with(&format!(".{PARTIAL}")) {
                    Some(held.max(meta.len()))
                } else {
                    None
                }
            })
            .fold((0, 0), |(n, bytes), held| {
                (n + 1, bytes.saturating_add(held))
            })
    }

    /// The directory, made root's with mode 0700 where missing; a link or a file there is an
    /// error, as is a directory that others may enter.
    fn make_dir(&self) -> Result<(), Error> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| Error::io(format!("create {}", self.dir.display()), e))?;
        let meta = std::fs::symlink_metadata(&self.dir)
            .map_err(|e| Error::io(format!("stat {}", self.dir.display()), e))?;
        if !meta.is_dir() || meta.uid() != 0 || meta.permissions().mode() & 0o077 != 0 {
            return Err(Error::FailedPrecondition(format!(
                "the template directory {} is not a directory of root's that only root may enter",
                self.dir.display()
            )));
        }
        Ok(())
    }
}

/// A key is what [`key`] makes: 64 hex digits (so it names one file of the directory).
fn check_key(key: &str) -> Result<(), Error> {
    if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Error::Internal(format!("{key:?} is not a template key")))
    }
}

impl Reserved {
    /// A write-only descriptor of the partial file, for QEMU's save.
    pub fn file(&self) -> Result<File, Error> {
        self.file
            .try_clone()
            .map_err(|e| Error::io(format!("dup {}", self.partial.display()), e))
    }

    /// The save completed: the file is flushed to the disk and becomes the shape's template
    /// (unless it takes more than was reserved: then it is removed, and that is the error).
    pub fn commit(mut self) -> Result<(), Error> {
        self.file
            .sync_all()
            .map_err(|e| Error::io(format!("fsync {}", self.partial.display()), e))?;
        let held = self
            .file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", self.partial.display()), e))?
            .blocks()
            * 512;
        if held > self.size {
            return Err(Error::ResourceExhausted(format!(
                "{} takes {} MiB, more than the {} MiB reserved for it",
                self.partial.display(),
                held >> 20,
                self.size >> 20
            )));
        }
        std::fs::rename(&self.partial, &self.saved)
            .map_err(|e| Error::io(format!("rename {}", self.partial.display()), e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::Path;

    const MIB: u64 = 1 << 20;

    fn store(dir: &Path, max_count: usize, max_bytes: u64) -> TemplateStore {
        TemplateStore::new(
            dir.join("templates"),
            Limits {
                max_count,
                max_bytes,
            },
        )
    }

    #[test]
    fn keys_are_the_descriptions_hashes() {
        let a = key("2 vCPU, 256 MiB, vmlinux sha256:..., qemu 10.0.2");
        assert_eq!(a.len(), 64);
        assert_ne!(a, key("2 vCPU, 512 MiB, vmlinux sha256:..., qemu 10.0.2"));
        assert!(check_key(&a).is_ok());
        for bad in ["../etc/passwd", "", &a[..63], &format!("{}/", &a[..63])] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_state_is_saved_as_partial_then_committed_and_opened() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        let k = key("a");
        assert!(store.open(&k).unwrap().is_none());
        let reserved = store.reserve(&k, 256 * MIB).await.unwrap().unwrap();
        assert_eq!(
            reserved.partial.parent(),
            Some(dir.path().join("templates").as_path())
        );
        let mode = std::fs::metadata(dir.path().join("templates"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        reserved.file().unwrap().write_all(b"state").unwrap();
        assert!(
            store.reserve(&k, 256 * MIB).await.unwrap().is_none(),
            "one shim saves a shape at a time"
        );
        reserved.commit().unwrap();
        let mut saved = String::new();
        std::io::Read::read_to_string(&mut store.open(&k).unwrap().unwrap(), &mut saved).unwrap();
        assert_eq!(saved, "state");
    }

    #[tokio::test]
    async fn a_save_given_up_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        let k = key("a");
        drop(store.reserve(&k, 256 * MIB).await.unwrap().unwrap());
        assert_eq!(store.held(), (0, 0));
        assert!(store.reserve(&k, 256 * MIB).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn shapes_past_the_limits_get_no_template() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 2, 600 * MIB);
        for shape in ["a", "b"] {
            let reserved = store
                .reserve(&key(shape), 260 * MIB)
                .await
                .unwrap()
                .unwrap();
            // Sparse: only what is written counts.
            reserved.file().unwrap().set_len(1024 * MIB).unwrap();
            reserved
                .file()
                .unwrap()
                .write_all(&vec![1u8; 256 * MIB as usize])
                .unwrap();
            reserved.commit().unwrap();
        }
        assert!(
            store.reserve(&key("c"), MIB).await.unwrap().is_none(),
            "a third template"
        );
        let store = TemplateStore::new(
            dir.path().join("templates"),
            Limits {
                max_count: 8,
                max_bytes: 600 * MIB,
            },
        );
        assert!(
            store.reserve(&key("c"), 100 * MIB).await.unwrap().is_none(),
            "512 MiB held and 100 more is past 600"
        );
        assert!(store.reserve(&key("c"), 80 * MIB).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_save_that_took_more_than_it_reserved_is_refused_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        let k = key("a");
        let reserved = store.reserve(&k, MIB).await.unwrap().unwrap();
        reserved
            .file()
            .unwrap()
            .write_all(&vec![1u8; 2 * MIB as usize])
            .unwrap();
        let err = reserved.commit().unwrap_err();
        assert!(
            err.message().contains("more than the 1 MiB reserved"),
            "{err}"
        );
        assert!(store.open(&k).unwrap().is_none());
        assert_eq!(store.held(), (0, 0));
    }

    #[tokio::test]
    async fn a_partial_file_left_by_a_dead_shim_is_replaced_once_stale() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        let k = key("a");
        let left = store.reserve(&k, MIB).await.unwrap().unwrap();
        let partial = left.partial.clone();
        std::mem::forget(left);
        assert!(store.reserve(&k, MIB).await.unwrap().is_none());
        let old = std::time::SystemTime::now() - STALE_PARTIAL - Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&partial)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(store.reserve(&k, MIB).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_directory_others_may_enter_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        std::fs::create_dir(dir.path().join("templates")).unwrap();
        std::fs::set_permissions(
            dir.path().join("templates"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let err = store.reserve(&key("a"), MIB).await.unwrap_err();
        assert!(err.message().contains("only root may enter"), "{err}");

        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path(), dir.path().join("linked")).unwrap();
        let linked = TemplateStore::new(
            dir.path().join("linked"),
            Limits {
                max_count: 4,
                max_bytes: 1024 * MIB,
            },
        );
        assert!(linked.reserve(&key("a"), MIB).await.is_err());
    }
}
