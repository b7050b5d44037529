//! Kubernetes emptyDirs of medium Memory. The kubelet mounts a tmpfs, sized by the volume's
//! sizeLimit and the pod's memory limit, at `<kubelet root>/pods/<uid>/volumes/
//! kubernetes.io~empty-dir/<name>` and binds that into each container. Shared into the VM,
//! it would be a FUSE file system whose pages the node pays for; instead the guest mounts a
//! tmpfs of the same size and mode that the pod's containers share (the agent's pod
//! volume), as runc's containers share the node's. A subPath of such a volume is another
//! host path (the kubelet's volume-subpaths) and still goes through the share.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::sys::statfs::{statfs, TMPFS_MAGIC};
use vmlet_protocol::agent::PodVolume;

use crate::Error;

/// The directory the kubelet's emptyDir plugin keeps a pod's volumes in.
const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

/// The pod volume a bind of `source` stands for: `Some` when it is a kubelet emptyDir on a
/// tmpfs (medium Memory), `None` for any other path.
pub fn memory_empty_dir(source: &Path) -> Result<Option<PodVolume>, Error> {
    let in_plugin_dir = source
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == EMPTY_DIR_PLUGIN);
    let Some(name) = source.file_name().filter(|_| in_plugin_dir) else {
        return Ok(None);
    };
    let what = || format!("the emptyDir volume at {}", source.display());
    let fs = statfs(source).map_err(|e| Error::io(format!("statfs {}", what()), e.into()))?;
    if fs.filesystem_type() != TMPFS_MAGIC {
        return Ok(None);
    }
    let mode = std::fs::metadata(source)
        .map_err(|e| Error::io(format!("stat {}", what()), e))?
        .permissions()
        .mode()
        & 0o7777;
    let size_bytes = u64::try_from(fs.block_size())
        .ok()
        .and_then(|size| fs.blocks().checked_mul(size))
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| Error::InvalidArgument(format!("{} has no size", what())))?;
    let name = name
        .to_str()
        .ok_or_else(|| Error::InvalidArgument(format!("{}: its name is not UTF-8", what())))?;
    Ok(Some(PodVolume {
        name: name.into(),
        size_bytes,
        mode,
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory `<base>/<unique>/kubernetes.io~empty-dir/<name>`, removed on drop.
    struct EmptyDir(std::path::PathBuf);

    impl EmptyDir {
        fn under(base: &str, name: &str) -> Option<Self> {
            let base = Path::new(base);
            if !base.is_dir() {
                return None;
            }
            let top = base.join(format!("vmlet-test-{}-{name}", std::process::id()));
            let path = top.join(EMPTY_DIR_PLUGIN).join(name);
            std::fs::create_dir_all(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
            Some(Self(top))
        }

        fn volume(&self, name: &str) -> std::path::PathBuf {
            self.0.join(EMPTY_DIR_PLUGIN).join(name)
        }
    }

    impl Drop for EmptyDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_tmpfs_empty_dir_becomes_a_pod_volume_of_its_size_and_mode() {
        // /dev/shm is a tmpfs wherever the tests run.
        let dir = EmptyDir::under("/dev/shm", "cache").expect("/dev/shm");
        let fs = statfs(Path::new("/dev/shm")).unwrap();
        assert_eq!(
            fs.filesystem_type(),
            TMPFS_MAGIC,
            "/dev/shm is no tmpfs here"
        );
        let volume = memory_empty_dir(&dir.volume("cache")).unwrap().unwrap();
        assert_eq!(volume.name, "cache");
        assert_eq!(volume.mode, 0o777);
        assert_eq!(
            volume.size_bytes,
            fs.blocks() as u64 * fs.block_size() as u64
        );
    }

    #[test]
    fn other_paths_stay_binds() {
        // The checkout: on the node's disk, not a tmpfs.
        let dir = EmptyDir::under(env!("CARGO_MANIFEST_DIR"), "disk").unwrap();
        assert_eq!(memory_empty_dir(&dir.volume("disk")).unwrap(), None);
        let shm = EmptyDir::under("/dev/shm", "elsewhere").unwrap();
        // A tmpfs, but not where the kubelet keeps emptyDirs.
        assert_eq!(memory_empty_dir(&shm.0).unwrap(), None);
        assert_eq!(memory_empty_dir(Path::new("/")).unwrap(), None);
    }
}
