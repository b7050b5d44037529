//! One pod's lock. The shim that makes a pod takes it before it makes anything of the pod
//! and holds it until the pod's teardown is done (the kernel lets go of it with the shim,
//! however the shim ends); whatever removes what a pod left behind (`shim delete` after a
//! dead shim, `vmletctl gc`) takes it first and then looks again. So nothing of a pod being
//! made or served is taken for a leftover, and a pod is never made while its leftovers are
//! being removed.
//!
//! The lock is a `flock(2)` on `STATE_DIR/.pod-locks/<pod id>` (root's, 0600, in a
//! directory of mode 0700). Its holder removes the file once the pod is gone
//! ([`PodLock::release_removing`]); a taker checks that the file it locked is still the one
//! at the path, so that a removed file's lock is never taken for the pod's.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::Error;

/// The locks' directory in the state directory (a name no pod id has: they never start
/// with a dot).
pub const LOCKS_DIR: &str = ".pod-locks";
/// How often a waiter tries again.
const RETRY: Duration = Duration::from_millis(20);

/// A pod's lock, held until dropped.
#[derive(Debug)]
pub struct PodLock {
    _held: Flock<File>,
    path: PathBuf,
}

impl PodLock {
    /// Removes the lock's file (still holding it): the pod is gone, and a later pod of the
    /// id makes a new one.
    pub fn remove_file(&self) -> Result<(), Error> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("remove {}", self.path.display()), e))
            }
            _ => Ok(()),
        }
    }
}

/// A pod's lock as its state carries it ([`crate::host::state::PodState::lock`]): shared
/// by the state's copies and let go when the last is dropped; never in the state file.
/// Any two are equal (a state's equality is its contents').
#[derive(Debug, Clone, Default)]
pub struct HeldLock(Option<Arc<PodLock>>);

impl HeldLock {
    pub fn new(lock: PodLock) -> Self {
        HeldLock(Some(Arc::new(lock)))
    }

    /// Removes the lock's file once everything of the pod is gone ([`PodLock::remove_file`];
    /// nothing where the state holds no lock).
    pub fn remove_file(&self) -> Result<(), Error> {
        self.0.as_ref().map_or(Ok(()), |lock| lock.remove_file())
    }
}

impl PartialEq for HeldLock {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for HeldLock {}

/// The file of `pod_id`'s lock.
pub fn path(state_dir: &Path, pod_id: &str) -> PathBuf {
    state_dir.join(LOCKS_DIR).join(pod_id)
}

/// Takes `pod_id`'s lock, waiting at most `deadline` for its holder (then a timeout that
/// names the pod).
pub async fn take(state_dir: &Path, pod_id: &str, deadline: Duration) -> Result<PodLock, Error> {
    let start = Instant::now();
    loop {
        if let Some(lock) = try_take(state_dir, pod_id)? {
            return Ok(lock);
        }
        if start.elapsed() >= deadline {
            return Err(held_too_long(pod_id, deadline));
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// [`take`] for callers without a runtime (`shim delete`), blocking the thread.
pub fn take_blocking(state_dir: &Path, pod_id: &str, deadline: Duration) -> Result<PodLock, Error> {
    let start = Instant::now();
    loop {
        if let Some(lock) = try_take(state_dir, pod_id)? {
            return Ok(lock);
        }
        if start.elapsed() >= deadline {
            return Err(held_too_long(pod_id, deadline));
        }
        std::thread::sleep(RETRY);
    }
}

fn held_too_long(pod_id: &str, deadline: Duration) -> Error {
    Error::Timeout(format!(
        "pod {pod_id}: its lock is still held after {deadline:?} (its shim, or a removal of what it left, is at work)"
    ))
}

/// `pod_id`'s lock if no one holds it; none where someone does. An id that is not a plain
/// name (what `vmletctl gc` reads from a tap's mark, say) is refused.
pub fn try_take(state_dir: &Path, pod_id: &str) -> Result<Option<PodLock>, Error> {
    if pod_id.is_empty() || pod_id.starts_with('.') || pod_id.contains(['/', '\0']) {
        return Err(Error::InvalidArgument(format!(
            "{pod_id:?} is not a pod id"
        )));
    }
    let dir = state_dir.join(LOCKS_DIR);
    crate::host::pod_paths::make_private_dir(&dir)?;
    let path = dir.join(pod_id);
    // The file may be removed between the open and the lock by a holder that is done: the
    // lock is the pod's only while the path still names the file locked.
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let held = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => held,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(Error::io(format!("lock {}", path.display()), e.into())),
        };
        let locked = held
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        match std::fs::symlink_metadata(&path) {
            Ok(now) if now.dev() == locked.dev() && now.ino() == locked.ino() => {
                return Ok(Some(PodLock { _held: held, path }));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("stat {}", path.display()), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_pods_lock_is_not_taken_until_its_holder_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let held = take(dir.path(), "p1", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(try_take(dir.path(), "p1").unwrap().is_none());
        // Another pod's is its own.
        let other = try_take(dir.path(), "p2").unwrap().expect("p2 is free");
        let err = take(dir.path(), "p1", Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
        assert!(err.message().contains("pod p1"), "{}", err.message());
        drop(held);
        let again = take_blocking(dir.path(), "p1", Duration::from_secs(1)).unwrap();
        again.remove_file().unwrap();
        drop(again);
        assert!(!path(dir.path(), "p1").exists());
        drop(other);
        let meta = std::fs::metadata(dir.path().join(LOCKS_DIR)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
    }

    #[tokio::test]
    async fn a_lock_whose_file_was_removed_is_not_the_pods() {
        let dir = tempfile::tempdir().unwrap();
        let first = take(dir.path(), "p", Duration::from_secs(1)).await.unwrap();
        // A waiter that opened the file before its holder removed it gets that file's lock
        // once the holder lets go, and must see that it is not the path's any more.
        let stale = File::open(path(dir.path(), "p")).unwrap();
        first.remove_file().unwrap();
        drop(first);
        let stale = Flock::lock(stale, FlockArg::LockExclusiveNonblock).unwrap();
        // The pod's lock is the new file's: free, though the stale file is locked.
        let lock = try_take(dir.path(), "p").unwrap().expect("a new file");
        assert!(try_take(dir.path(), "p").unwrap().is_none());
        drop((lock, stale));
    }

    #[test]
    fn a_link_in_place_of_a_lock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(LOCKS_DIR)).unwrap();
        std::fs::set_permissions(
            dir.path().join(LOCKS_DIR),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", path(dir.path(), "p")).unwrap();
        assert!(try_take(dir.path(), "p").is_err());
        for id in ["", ".", "..", "../x", "a/b", ".hidden"] {
            assert!(try_take(dir.path(), id).is_err(), "{id:?}");
        }
    }
}
