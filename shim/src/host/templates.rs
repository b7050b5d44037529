//! Saved template VMs on the node's disk, for template starts: one file per VM shape,
//! `<key>.vmstate` in the node's template directory (root's, mode 0700: only shims open
//! them; QEMU is handed a descriptor, [`crate::devices::snapshot`]). The key is a hash of
//! what the saved state depends on (`crate::vm::template_start`): the shape, the guest's
//! kernel and initramfs, its command line, the devices, the QEMU and virtiofsd files, the
//! host's boot.
//!
//! Pods choose their shapes (a Kubernetes user writes the annotations), so what they can
//! make of the directory is bounded: at most [`Limits::max_count`] files and
//! [`Limits::max_bytes`] between them, and never more than the file system has free. A file
//! being saved is counted at the size its saver reserved (the most it may take: the guest's
//! RAM; the size is part of its name, `<key>.<bytes>.partial`), a saved one at what it takes
//! on the disk (the files are sparse, and a save that took more than was reserved is
//! refused). These are checked, and a new file made, under a lock on the directory. When the
//! limits leave no room, saved files no pod has loaded for [`UNUSED_FOR`] are removed, the
//! longest unused first; past that there is no template for the shape, and its pods start
//! cold (logged as a warning).
//!
//! A partial file is created new, and its saver holds an exclusive `flock` on it until it
//! is renamed to `<key>.vmstate` ([`Reserved::commit`]) or removed (dropped before that): a
//! partial file nobody holds was left by a shim that died, and the next reservation removes
//! it. A saved file is loaded only if it is a regular file of root's that only root may read,
//! with one link, in a directory that only root may enter. Nothing in the directory is
//! followed: every open is `O_NOFOLLOW`, and only shims write names there.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use crate::Error;

/// The lock file in the template directory.
const LOCK_FILE: &str = ".vmlet.lock";
/// How long a reservation waits for another's.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);
/// A saved file no pod has loaded for this long may make room for another shape.
pub const UNUSED_FOR: Duration = Duration::from_secs(3600);
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
#[derive(Debug)]
pub struct TemplateStore {
    dir: PathBuf,
    limits: Limits,
}

/// A state being saved: its partial file, locked, removed unless committed.
#[derive(Debug)]
pub struct Reserved {
    partial: PathBuf,
    saved: PathBuf,
    file: Flock<File>,
    size: u64,
    committed: bool,
}

/// One file of the directory, as the limits count it.
struct Entry {
    name: String,
    saved: bool,
    bytes: u64,
    modified: SystemTime,
}

impl TemplateStore {
    pub fn new(dir: impl Into<PathBuf>, limits: Limits) -> Self {
        TemplateStore {
            dir: dir.into(),
            limits,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The saved state of `key`, read-only; `None` while there is none. Its modification time
    /// is set to now: it was used ([`UNUSED_FOR`]).
    pub fn open(&self, key: &str) -> Result<Option<File>, Error> {
        check_key(key)?;
        self.check_dir()?;
        let path = self.path(&format!("{key}.{SAVED}"));
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        if !meta.is_file() || meta.uid() != 0 || meta.mode() & 0o077 != 0 || meta.nlink() != 1 {
            return Err(Error::FailedPrecondition(format!(
                "{} is not a file of root's, with one link, that only root may read: not loaded",
                path.display()
            )));
        }
        use nix::sys::time::TimeSpec;
        if let Err(e) = nix::sys::stat::futimens(&file, &TimeSpec::UTIME_OMIT, &TimeSpec::UTIME_NOW)
        {
            log::warn!("template {key}: mark it used: {e}");
        }
        Ok(Some(file))
    }

    /// Removes `key`'s saved state if it is still `loaded` (the file that QEMU refused to load,
    /// or that a pod could not be made its own from: not one saved since by another shim);
    /// gone already is no error.
    pub async fn discard(&self, key: &str, loaded: &File) -> Result<(), Error> {
        check_key(key)?;
        let _lock =
            crate::host::file_lock::exclusive(&self.dir.join(LOCK_FILE), LOCK_DEADLINE).await?;
        let path = self.path(&format!("{key}.{SAVED}"));
        let ours = loaded
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        match std::fs::symlink_metadata(&path) {
            Ok(there) if there.dev() == ours.dev() && there.ino() == ours.ino() => {
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io(format!("remove {}", path.display()), e))
            }
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("stat {}", path.display()), e)),
        }
    }

    /// Makes the partial file for saving `key`'s state of at most `size` bytes, if the limits
    /// and the file system leave room for it (after removing unused saved files, see the
    /// module); `Ok(None)` where they do not (logged as a warning), or where another shim is
    /// saving it.
    pub async fn reserve(&self, key: &str, size: u64) -> Result<Option<Reserved>, Error> {
        check_key(key)?;
        self.make_dir()?;
        let _lock =
            crate::host::file_lock::exclusive(&self.dir.join(LOCK_FILE), LOCK_DEADLINE).await?;
        if self.remove_abandoned(key)? {
            log::info!("template {key}: another shim is saving it");
            return Ok(None);
        }
        if !self.make_room(size)? {
            let (count, bytes) = self.held()?;
            log::warn!(
                "template {key}: the template directory {} holds {count} templates of {} MiB, all used within {} min (limits: {}, {} MiB): pods of this shape start cold",
                self.dir.display(),
                bytes >> 20,
                UNUSED_FOR.as_secs() / 60,
                self.limits.max_count,
                self.limits.max_bytes >> 20
            );
            return Ok(None);
        }
        let st = nix::sys::statvfs::statvfs(&self.dir)
            .map_err(|e| Error::io(format!("statvfs {}", self.dir.display()), e.into()))?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        if free < size {
            log::warn!(
                "template {key}: {} has {} MiB free, a template of this shape may take {} MiB: pods of this shape start cold",
                self.dir.display(),
                free >> 20,
                size >> 20
            );
            return Ok(None);
        }
        let partial = self.path(&format!("{key}.{size}.{PARTIAL}"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&partial)
            .map_err(|e| Error::io(format!("create {}", partial.display()), e))?;
        let file = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| Error::io(format!("lock {}", partial.display()), e.into()))?;
        Ok(Some(Reserved {
            saved: self.path(&format!("{key}.{SAVED}")),
            partial,
            file,
            size,
            committed: false,
        }))
    }

    /// Removes every partial file whose saver is gone (nobody holds its lock); returns whether
    /// one of `key`'s is still being saved.
    fn remove_abandoned(&self, key: &str) -> Result<bool, Error> {
        let mut saving = false;
        for entry in self.entries()?.into_iter().filter(|e| !e.saved) {
            let path = self.path(&entry.name);
            let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(&path)
            else {
                continue;
            };
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(_abandoned) => std::fs::remove_file(&path)
                    .map_err(|e| Error::io(format!("remove {}", path.display()), e))?,
                Err(_) => saving |= entry.name.starts_with(&format!("{key}.")),
            }
        }
        Ok(saving)
    }

    /// Whether `size` more bytes and one more file fit the limits, once saved files unused
    /// for [`UNUSED_FOR`] were removed as needed, the longest unused first.
    fn make_room(&self, size: u64) -> Result<bool, Error> {
        let entries = self.entries()?;
        let (mut count, mut bytes) = totals(&entries);
        let mut unused: Vec<Entry> = entries
            .into_iter()
            .filter(|e| e.saved && e.modified.elapsed().is_ok_and(|age| age >= UNUSED_FOR))
            .collect();
        unused.sort_by_key(|e| e.modified);
        let mut unused = unused.into_iter();
        while count >= self.limits.max_count || bytes.saturating_add(size) > self.limits.max_bytes {
            let Some(oldest) = unused.next() else {
                return Ok(false);
            };
            count -= 1;
            bytes = bytes.saturating_sub(oldest.bytes);
            let path = self.path(&oldest.name);
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            log::info!(
                "removed the template {} to make room: unused for {} min",
                path.display(),
                UNUSED_FOR.as_secs() / 60
            );
        }
        Ok(true)
    }

    /// How many saved and partial files the directory holds, and the bytes they count for.
    fn held(&self) -> Result<(usize, u64), Error> {
        Ok(totals(&self.entries()?))
    }

    /// The saved and partial files of the directory (nothing else is counted).
    fn entries(&self) -> Result<Vec<Entry>, Error> {
        let what = || format!("read {}", self.dir.display());
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io(what(), e))? {
            let entry = entry.map_err(|e| Error::io(what(), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let (saved, reserved) = match name.rsplit_once('.') {
                Some((_, SAVED)) => (true, 0),
                Some((rest, PARTIAL)) => {
                    let reserved = rest.rsplit_once('.').and_then(|(_, n)| n.parse().ok());
                    (false, reserved.unwrap_or(u64::MAX))
                }
                _ => continue,
            };
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                // Removed since it was listed.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(what(), e)),
            };
            entries.push(Entry {
                name,
                saved,
                bytes: (meta.blocks() * 512).max(reserved),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        Ok(entries)
    }

    /// The directory, made root's with mode 0700 where missing, then [`Self::check_dir`].
    fn make_dir(&self) -> Result<(), Error> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| Error::io(format!("create {}", self.dir.display()), e))?;
        self.check_dir()
    }

    /// A link or a file there is an error, as is a directory that others may enter.
    fn check_dir(&self) -> Result<(), Error> {
        let meta = match std::fs::symlink_metadata(&self.dir) {
            Ok(meta) => meta,
            // Nothing saved yet: nothing to load.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("stat {}", self.dir.display()), e)),
        };
        if !meta.is_dir() || meta.uid() != 0 || meta.permissions().mode() & 0o077 != 0 {
            return Err(Error::FailedPrecondition(format!(
                "the template directory {} is not a directory of root's that only root may enter",
                self.dir.display()
            )));
        }
        Ok(())
    }
}

/// How many entries, and the bytes they count for.
fn totals(entries: &[Entry]) -> (usize, u64) {
    entries.iter().fold((0, 0), |(n, bytes), e| {
        (n + 1, bytes.saturating_add(e.bytes))
    })
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
    /// The partial file is still this reservation's: nobody removes a locked one. Returns the
    /// saved file, with which [`TemplateStore::discard`] knows it.
    pub fn commit(mut self) -> Result<File, Error> {
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
        let saved = self.file()?;
        std::fs::rename(&self.partial, &self.saved)
            .map_err(|e| Error::io(format!("rename {}", self.partial.display()), e))?;
        self.committed = true;
        Ok(saved)
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

    /// Reserves and commits `key` at once (an empty saved file).
    async fn saved(store: &TemplateStore, key: &str) {
        store
            .reserve(key, MIB)
            .await
            .unwrap()
            .unwrap()
            .commit()
            .unwrap();
    }

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
        assert_eq!(store.held().unwrap(), (0, 0));
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
        assert_eq!(store.held().unwrap(), (0, 0));
    }

    #[tokio::test]
    async fn a_partial_file_nobody_holds_is_removed_and_a_held_one_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        let k = key("a");
        let held = store.reserve(&k, MIB).await.unwrap().unwrap();
        assert!(
            store.reserve(&k, MIB).await.unwrap().is_none(),
            "being saved"
        );
        // A shim that died: its partial file is there, its lock is not.
        let left = dir
            .path()
            .join("templates")
            .join(format!("{}.{MIB}.partial", key("b")));
        std::fs::write(&left, "half").unwrap();
        assert!(store.reserve(&key("b"), MIB).await.unwrap().is_some());
        assert!(!left.exists() || std::fs::read(&left).unwrap().is_empty());
        assert!(held.partial.exists(), "a held partial file stays");
    }

    #[tokio::test]
    async fn saves_under_way_count_at_what_they_reserved() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 8, 600 * MIB);
        let _a = store.reserve(&key("a"), 256 * MIB).await.unwrap().unwrap();
        let _b = store.reserve(&key("b"), 256 * MIB).await.unwrap().unwrap();
        assert_eq!(store.held().unwrap(), (2, 512 * MIB));
        assert!(
            store.reserve(&key("c"), 100 * MIB).await.unwrap().is_none(),
            "two saves under way and nothing written yet still count"
        );
    }

    #[tokio::test]
    async fn a_template_unused_for_an_hour_makes_room_and_a_used_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 1, 1024 * MIB);
        saved(&store, &key("a")).await;
        assert!(
            store.reserve(&key("b"), MIB).await.unwrap().is_none(),
            "a was just saved"
        );
        let a = dir
            .path()
            .join("templates")
            .join(format!("{}.vmstate", key("a")));
        let old = std::time::SystemTime::now() - UNUSED_FOR - Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&a)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let b = store.reserve(&key("b"), MIB).await.unwrap().unwrap();
        assert!(!a.exists(), "the unused template made room");
        b.commit().unwrap();
        // Loading marks it used.
        let b_path = dir
            .path()
            .join("templates")
            .join(format!("{}.vmstate", key("b")));
        File::options()
            .write(true)
            .open(&b_path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        store.open(&key("b")).unwrap().unwrap();
        assert!(store.reserve(&key("c"), MIB).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn only_a_root_only_file_with_one_link_is_loaded_and_only_it_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 4, 1024 * MIB);
        let k = key("a");
        saved(&store, &k).await;
        let path = dir.path().join("templates").join(format!("{k}.vmstate"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = store.open(&k).unwrap_err();
        assert!(err.message().contains("only root may read"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(&path, dir.path().join("planted")).unwrap();
        assert!(store.open(&k).is_err(), "a second link");
        std::fs::remove_file(dir.path().join("planted")).unwrap();
        let loaded = store.open(&k).unwrap().unwrap();
        // Saved again since: the new file is not the one that failed to load.
        std::fs::remove_file(&path).unwrap();
        saved(&store, &k).await;
        store.discard(&k, &loaded).await.unwrap();
        assert!(path.exists());
        let again = store.open(&k).unwrap().unwrap();
        store.discard(&k, &again).await.unwrap();
        assert!(!path.exists());
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
