//! VM-image pods' root disks on the node's disk: each pod's directory under the node's
//! `vm_images.disk_dir` (made new, root's, mode 0711; removed with the pod), and room for
//! every disk there. A pod's overlay grows as its guest writes, up to its disk's size; a
//! new one is made only when the file system has room for it and for what every overlay
//! already there may still write, so that VM-image pods together cannot fill it. The check
//! and the new overlay are made under a lock on the directory.
//!
//! The disk directory outlives the state directory (a tmpfs): after a node's reboot (or a
//! teardown that could not remove it) a pod's disk stays with no pod to remove it. Each
//! check of the room first removes such disks (a directory of vmlet's whose pod has no
//! state directory and whose lock no one holds), and the pod's own directory when one is
//! there already (its id used before the reboot), so the first VM-image pod made after a
//! reboot finds the room whole again.

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
/// lists them). `dir` is made new: a directory already there is an error, never reused
/// ([`room_for`] removes an earlier pod's first).
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

/// Waits (at most [`LOCK_DEADLINE`]) for the disk directory's lock, removes the disks no
/// pod has ([`reclaim_orphans`]) and `own`, the pod's directory, where an earlier pod of the
/// id left it (the caller holds the id's lock and made its state directory new), then
/// checks that its file system has room for a new disk of `size` bytes besides what every
/// overlay still there may still write. The lock is held until the returned value is
/// dropped: make the overlay before.
pub async fn room_for(
    disks: &Path,
    state_dir: &Path,
    own: &Path,
    size: u64,
) -> Result<RoomLock, Error> {
    make_disks(disks)?;
    let lock = crate::host::file_lock::exclusive(&disks.join(LOCK_FILE), LOCK_DEADLINE).await?;
    let (d, s, o) = (disks.to_owned(), state_dir.to_owned(), own.to_owned());
    // Unlinking large files is no work for the runtime's threads.
    crate::vm::block(move || reclaim(&d, &s, &o)).await??;
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

/// [`reclaim_orphans`], each logged, then `own` where it is there.
fn reclaim(disks: &Path, state_dir: &Path, own: &Path) -> Result<(), Error> {
    for (pod_id, removed) in reclaim_orphans(disks, state_dir) {
        match removed {
            Ok(()) => log::info!(
                "pod {pod_id}: its disk under {} had no pod (left by an earlier boot of the node, or a teardown that could not remove it): removed",
                disks.display()
            ),
            Err(e) => log::warn!("pod {pod_id}: its disk has no pod and could not be removed: {e}"),
        }
    }
    if std::fs::symlink_metadata(own).is_ok() {
        if !is_vmlets(own) {
            return Err(Error::FailedPrecondition(format!(
                "{} is there already and is not a pod's disk directory of vmlet's (a directory of root's, mode 0711): left as it is",
                own.display()
            )));
        }
        log::warn!(
            "{}: left by an earlier pod of this id (the node rebooted before its teardown): removed",
            own.display()
        );
        remove(own)?;
    }
    Ok(())
}

/// Removes the pods' directories under `disks` whose pod has no state directory under
/// `state_dir` and whose lock ([`crate::host::pod_lock`]) no one holds: a pod's teardown
/// removes its own, so these were left by the pods of an earlier boot of the node (or by a
/// teardown that could not remove them). Only vmlet's are taken ([`orphans`]); of one
/// holding more than its disk, the disk goes and the directory stays (reported). A pod
/// being made or torn down holds its lock (from before its state directory exists until
/// its teardown is done); one that runs has its state directory. Each is looked at again
/// with its lock held, so this needs no disk directory lock (`vmletctl gc` calls it too).
/// Returns each pod whose directory was found so, and whether its removal worked.
pub fn reclaim_orphans(disks: &Path, state_dir: &Path) -> Vec<(String, Result<(), Error>)> {
    use crate::host::pod_lock;
    let mut found = Vec::new();
    for pod_id in orphans(disks, state_dir) {
        let lock = match pod_lock::try_take(state_dir, &pod_id) {
            Ok(Some(lock)) => lock,
            // Held: its pod is being made or removed.
            Ok(None) => continue,
            Err(e) => {
                found.push((pod_id, Err(e)));
                continue;
            }
        };
        if has_state(state_dir, &pod_id) {
            continue;
        }
        let removed = remove(&disks.join(&pod_id)).and_then(|()| lock.remove_file());
        found.push((pod_id, removed));
    }
    found
}

/// The pods whose directories under `disks` are vmlet's ([`is_vmlets`]) and have no state
/// directory under `state_dir`: what [`reclaim_orphans`] removes where no one holds their
/// lock (and what `vmletctl gc --dry-run` lists, taking no lock).
pub fn orphans(disks: &Path, state_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(disks) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pod_id = entry.file_name().to_str()?.to_owned();
            (crate::host::pod_paths::check_pod_id(&pod_id).is_ok()
                && is_vmlets(&entry.path())
                && !has_state(state_dir, &pod_id))
            .then_some(pod_id)
        })
        .collect()
}

/// A pod's disk directory as [`make`] makes it: a directory (not a link) of the shim's
/// user, mode 0711.
fn is_vmlets(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o7777 == 0o711
    })
}

fn has_state(state_dir: &Path, pod_id: &str) -> bool {
    std::fs::symlink_metadata(state_dir.join(pod_id)).is_ok()
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

    /// A pod's directory (0711, as [`make`] makes it) holding an overlay of `size` bytes.
    fn overlay(dir: &Path, pod: &str, size: u64) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir.join(pod)).unwrap();
        std::fs::set_permissions(dir.join(pod), std::fs::Permissions::from_mode(0o711)).unwrap();
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
        let state = tempfile::tempdir().unwrap();
        // The node's first VM image makes the directory.
        let fresh = tmp.path().join("var/lib/vmlet/disks");
        let own = fresh.join("p");
        drop(room_for(&fresh, state.path(), &own, 1 << 20).await.unwrap());
        assert!(fresh.is_dir());
        let own = tmp.path().join("p");
        let lock = room_for(tmp.path(), state.path(), &own, 1 << 20)
            .await
            .unwrap();
        drop(lock);
        // A running pod that may still write more than any test machine's disk holds.
        overlay(tmp.path(), "big", 1 << 60);
        std::fs::create_dir(state.path().join("big")).unwrap();
        let err = room_for(tmp.path(), state.path(), &own, 1 << 20)
            .await
            .err()
            .expect("no room");
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
        assert!(
            err.message().contains("may still write"),
            "{}",
            err.message()
        );
    }

    /// After a reboot, disks whose pods have no state directory are removed by the next
    /// check of the room, and the room is whole again: an earlier pod's of the checking
    /// pod's own id too. A running pod's disk, one whose pod holds its lock (being made), and
    /// a directory that is not one of vmlet's are kept.
    #[tokio::test]
    async fn the_next_pods_room_check_removes_the_disks_no_pod_has() {
        use crate::host::pod_lock;
        use std::os::unix::fs::PermissionsExt;
        let disks = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        overlay(disks.path(), "before-reboot", 1 << 60);
        overlay(disks.path(), "running", 1 << 20);
        std::fs::create_dir(state.path().join("running")).unwrap();
        overlay(disks.path(), "being-made", 1 << 20);
        let held = pod_lock::try_take(state.path(), "being-made")
            .unwrap()
            .unwrap();
        let foreign = disks.path().join("not-vmlets");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The id of the pod that checks was used before the reboot; it has made its state
        // directory and holds its lock.
        overlay(disks.path(), "reused", 1 << 60);
        std::fs::create_dir(state.path().join("reused")).unwrap();
        let _reused = pod_lock::try_take(state.path(), "reused").unwrap().unwrap();
        let own = disks.path().join("reused");
        drop(
            room_for(disks.path(), state.path(), &own, 1 << 20)
                .await
                .unwrap(),
        );
        assert!(!disks.path().join("before-reboot").exists());
        assert!(!pod_lock::path(state.path(), "before-reboot").exists());
        assert!(!own.exists());
        assert!(disks.path().join("running").join(ROOT_DISK).exists());
        assert!(disks.path().join("being-made").join(ROOT_DISK).exists());
        assert!(foreign.exists());
        drop(held);
        // Let go without a state directory (a teardown that could not remove the disk):
        // removed.
        let found = reclaim_orphans(disks.path(), state.path());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "being-made");
        assert!(!disks.path().join("being-made").exists());
        assert!(disks.path().join("running").exists());
    }
}
