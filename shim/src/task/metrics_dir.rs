//! What the shims publish for the node's metrics, in `STATE_DIR/.metrics`: each running
//! pod's figures socket (`<pod id>.sock`, mode 0660, [`crate::task::pod_metrics`]) and a copy
//! of the node's counters (`node-counters.json`, 0640, [`crate::task::node_counters`]).
//! The directory is root's, of the node config's `metrics_gid`, mode 2750: what is made in
//! it takes that group, so a user of that group alone (`vmletctl metrics` in the
//! DaemonSet's metrics container) reads the figures and reaches nothing else of vmlet's:
//! not the pods' state directories, keys or other sockets.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// The directory's name in the state directory (a dot name: no pod's).
pub const DIR: &str = ".metrics";
/// The node's counters' copy in it.
pub const COUNTERS: &str = "node-counters.json";
/// The directory's mode: set-group-ID, so that its files take its group.
const DIR_MODE: u32 = 0o2750;

/// `STATE_DIR/.metrics`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR)
}

/// Where pod `pod_id`'s shim serves its figures.
pub fn socket(state_dir: &Path, pod_id: &str) -> PathBuf {
    path(state_dir).join(format!("{pod_id}.sock"))
}

/// The directory, made if missing and given to root and `gid` with [`DIR_MODE`] (again each
/// time: the kubelet may have made it for the metrics container's mount). Anything but a
/// directory there (a link) is refused.
pub fn prepare(state_dir: &Path, gid: u32) -> Result<PathBuf, Error> {
    let dir = path(state_dir);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(Error::io(format!("make {}", dir.display()), e))
        }
        _ => {}
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&dir)
        .map_err(|e| Error::io(format!("open {} (not a directory?)", dir.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", dir.display()), e))?;
    if meta.uid() != 0 || meta.gid() != gid {
        std::os::unix::fs::fchown(&file, Some(0), Some(gid))
            .map_err(|e| Error::io(format!("chown {}", dir.display()), e))?;
    }
    if meta.mode() & 0o7777 != DIR_MODE {
        file.set_permissions(std::fs::Permissions::from_mode(DIR_MODE))
            .map_err(|e| Error::io(format!("chmod {}", dir.display()), e))?;
    }
    Ok(dir)
}

/// Writes `bytes` as the directory's `name` (0640, through a new file renamed over the old
/// one, never through a link), where the directory exists: a shim made it for a pod's
/// figures; until one has, nothing is published.
pub fn publish(state_dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Error> {
    let dir = path(state_dir);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        _ => return Ok(()),
    }
    let (tmp, target) = (dir.join(format!(".{name}.tmp")), dir.join(name));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
    // The shim's umask (077) took the group's read.
    file.set_permissions(std::fs::Permissions::from_mode(0o640))
        .and_then(|()| file.write_all(bytes))
        .map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &target).map_err(|e| Error::io(format!("rename {}", target.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_is_roots_of_the_group_and_its_files_take_the_group() {
        let state = tempfile::tempdir().unwrap();
        // Nothing published before a shim made the directory.
        publish(state.path(), COUNTERS, b"{}").unwrap();
        assert!(!path(state.path()).exists());
        let gid = 4242;
        let dir = prepare(state.path(), gid).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Again: the mode is put right.
        prepare(state.path(), gid).unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, gid, DIR_MODE)
        );
        publish(state.path(), COUNTERS, b"{\"version\":1}").unwrap();
        let counters = std::fs::metadata(dir.join(COUNTERS)).unwrap();
        assert_eq!((counters.gid(), counters.mode() & 0o777), (gid, 0o640));
        assert_eq!(socket(state.path(), "p1"), dir.join("p1.sock"));
    }

    #[test]
    fn a_link_in_its_place_is_refused() {
        let state = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), path(state.path())).unwrap();
        let e = prepare(state.path(), 4242).unwrap_err();
        assert!(e.message().contains(".metrics"), "{e}");
        publish(state.path(), COUNTERS, b"{}").unwrap();
        assert!(!elsewhere.path().join(COUNTERS).exists());
    }
}
