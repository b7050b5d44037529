//! VM-image pods' root disks on the node's disk: each pod's directory under the node's
//! `vm_images.disk_dir` (made new, root's, mode 0711; removed with the pod), and room for
//! every disk there. A pod's overlay grows as its guest writes, up to its disk's size; a
//! new one is made only when the file system has room for it and for what every overlay
//! already there may still write, so that VM-image pods together cannot fill it. The check
//! and the new overlay are made under a lock on the directory.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use crate::host::pod_paths::ROOT_DISK;
use crate::Error;

/// The lock file in the disk directory.
const LOCK_FILE: &str = ".vmlet.lock";
/// How long a pod's boot waits for another's check.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);
/// qcow2's own metadata beside a disk's data (L2 and refcount tables: under 0.1% with
/// 64 KiB clusters), and a margin, counted for every overlay.
fn with_metadata(size: u64) -> u64 {
    size + size / 256 + (16 << 20)
}

/// Makes `dir`, a VM-image pod's directory for its root disk under the node's `disks`
/// (made root's, mode 0711, where missing: QEMU's user reaches its own disk by name, nobody
/// lists them). `dir` is made new: a directory already there is an error, never reused.
pub fn make(disks: &Path, dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    make_disks(disks)?;
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    // The umask is no part of it.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| Error::io(format!("chmod {}", dir.display()), e))
}

/// The node's disk directory, made (root's, mode 0711) where missing; a link or a file
/// there is an error.
fn make_disks(disks: &Path) -> Result<(), Error> {
    crate::host::pod_paths::make_passable(disks)
        .map_err(|e| Error::io(format!("create {}", disks.display()), e))?;
    if !std::fs::symlink_metadata(disks).is_ok_and(|m| m.is_dir()) {
        return Err(Error::FailedPrecondition(format!(
            "vm_images.disk_dir {} is not a directory",
            disks.display()
        )));
    }
    Ok(())
}

/// Removes a VM-image pod's disk directory: its root disk, then the directory. What is
/// gone already is no error; nothing in it is followed (only the guest's QEMU writes the
/// disk's contents, never a name there).
pub fn remove(dir: &Path) -> Result<(), Error> {
    let ignore_gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    let disk = dir.join(ROOT_DISK);
    ignore_gone(std::fs::remove_file(&disk))
        .map_err(|e| Error::io(format!("remove {}", disk.display()), e))?;
    ignore_gone(std::fs::remove_dir(dir))
        .map_err(|e| Error::io(format!("remove {}", dir.display()), e))
}

/// The lock under which one pod's boot checks the room and makes its overlay.
pub struct RoomLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Waits (at most [`LOCK_DEADLINE`]) for the disk directory's lock, then checks that its
/// file system has room for a new disk of `size` bytes besides what every overlay already
/// there may still write. The lock is held until the returned value is dropped: make the
/// overlay before.
pub async fn room_for(disks: &Path, size: u64) -> Result<RoomLock, Error> {
    make_disks(disks)?;
    let lock = crate::host::file_lock::exclusive(&disks.join(LOCK_FILE), LOCK_DEADLINE).await?;
    let st = nix::sys::statvfs::statvfs(disks)
        .map_err(|e| Error::io(format!("statvfs {}", disks.display()), e.into()))?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let others = still_to_write(disks);
    let wanted = with_metadata(size);
    if free < others.saturating_add(wanted) {
        return Err(Error::ResourceExhausted(format!(
            "vm_images.disk_dir {}: {} MiB free, the VM-image pods there may still write {} MiB of their disks, and this pod's root disk may take {} MiB",
            disks.display(),
            free >> 20,
            others >> 20,
            wanted >> 20
        )));
    }
    Ok(RoomLock { _lock: lock })
}

/// What the overlays under `disks` (`*/root.qcow2`) may still write: each one's size (its
/// qcow2 header's) with its metadata, less what it holds on the disk already.
fn still_to_write(disks: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(disks) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let disk = entry.path().join(ROOT_DISK);
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(&disk)
                .ok()?;
            let held = file.metadata().ok()?.blocks() * 512;
            let mut header = [0u8; 32];
            file.read_exact(&mut header).ok()?;
            if &header[..4] != b"QFI\xfb" {
                return None;
            }
            let size = u64::from_be_bytes(header[24..32].try_into().ok()?);
            Some(with_metadata(size).saturating_sub(held))
        })
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(dir: &Path, pod: &str, size: u64) {
        std::fs::create_dir_all(dir.join(pod)).unwrap();
        let mut header = vec![0u8; 104];
        header[..4].copy_from_slice(b"QFI\xfb");
        header[4..8].copy_from_slice(&3u32.to_be_bytes());
        header[24..32].copy_from_slice(&size.to_be_bytes());
        std::fs::write(dir.join(pod).join(ROOT_DISK), header).unwrap();
    }

    #[test]
    fn a_pods_disk_directory_is_made_new_and_removed_with_its_disk() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let disks = tmp.path().join("var/lib/vmlet/disks");
        let dir = disks.join("p1");
        make(&disks, &dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o711);
        assert!(
            make(&disks, &dir).is_err(),
            "a directory there is not reused"
        );
        std::fs::write(dir.join(ROOT_DISK), "qcow2").unwrap();
        remove(&dir).unwrap();
        assert!(!dir.exists());
        remove(&dir).unwrap();
    }

    #[test]
    fn what_the_overlays_may_still_write_is_counted() {
        let tmp = tempfile::tempdir().unwrap();
        overlay(tmp.path(), "a", 1 << 30);
        overlay(tmp.path(), "b", 2 << 30);
        std::fs::create_dir(tmp.path().join("empty")).unwrap();
        let counted = still_to_write(tmp.path());
        let held = 2 * 4096; // each fake overlay holds a block or so
        assert!(counted <= with_metadata(1 << 30) + with_metadata(2 << 30));
        assert!(counted >= with_metadata(1 << 30) + with_metadata(2 << 30) - 2 * held);
    }

    #[tokio::test]
    async fn no_room_is_refused_by_name_and_room_is_given_under_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        // The node's first VM image makes the directory.
        let fresh = tmp.path().join("var/lib/vmlet/disks");
        drop(room_for(&fresh, 1 << 20).await.unwrap());
        assert!(fresh.is_dir());
        let lock = room_for(tmp.path(), 1 << 20).await.unwrap();
        drop(lock);
        // Pods that may still write more than any test machine's disk holds.
        overlay(tmp.path(), "big", 1 << 60);
        let err = room_for(tmp.path(), 1 << 20).await.err().expect("no room");
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
        assert!(
            err.message().contains("may still write"),
            "{}",
            err.message()
        );
    }
}
