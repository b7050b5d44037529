//! An exclusive `flock(2)` on a lock file of root's, waited for with a deadline and without
//! blocking a runtime thread: what one shim holds while it does what no other may do at the
//! same time on the node (the KVM probe, a VM image's room on the disk directory).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::Error;

/// How often a waiter tries again.
const RETRY: Duration = Duration::from_millis(50);

/// Takes the lock on `path` (made 0600 where missing, never through a link), waiting at
/// most `deadline` for its holder (then a timeout). The lock is held until the value is
/// dropped.
pub async fn exclusive(path: &Path, deadline: Duration) -> Result<Flock<File>, Error> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let start = Instant::now();
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if start.elapsed() < deadline => {
                file = f;
                tokio::time::sleep(RETRY).await;
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(Error::Timeout(format!(
                    "lock {}: still held by another after {deadline:?}",
                    path.display()
                )))
            }
            Err((_, e)) => return Err(Error::io(format!("lock {}", path.display()), e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_lock_is_waited_for_until_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = exclusive(&path, Duration::from_secs(1)).await.unwrap();
        let err = exclusive(&path, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
        assert!(err.message().contains("still held"), "{}", err.message());
        drop(held);
        exclusive(&path, Duration::from_millis(200)).await.unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        assert!(
            exclusive(&path, Duration::from_millis(200)).await.is_err(),
            "a link is not followed"
        );
    }
}
