//! Kubernetes emptyDirs of medium Memory. The kubelet mounts a tmpfs, sized by the volume's
//! sizeLimit and the pod's memory limit, at `<kubelet root>/pods/<uid>/volumes/
//! kubernetes.io~empty-dir/<name>` and binds that into each container, or for a `subPath`
//! a bind of a path inside it that it mounts at `<kubelet root>/pods/<uid>/volume-subpaths/
//! <name>/<container>/<index>`. Shared into the VM, it would be a FUSE file system whose
//! pages the node pays for; instead the guest mounts a tmpfs of the same size and mode that
//! the pod's containers share (the agent's pod volume), as runc's containers share the
//! node's, and a subPath is the same path inside the guest's tmpfs (the agent makes it a
//! directory when the pod's containers have not made it), so that what one container
//! writes through the whole volume another reads through its subPath. The node's tmpfs
//! stays empty.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::sys::statfs::{statfs, TMPFS_MAGIC};
use vmlet_protocol::agent::PodVolume;

use crate::Error;

/// The directory the kubelet's emptyDir plugin keeps a pod's volumes in.
const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";
/// The longest volume name (a DNS label, as Kubernetes names volumes).
const MAX_NAME_LEN: usize = 63;

/// A bind of a kubelet memory emptyDir: the pod volume, and the path inside it (empty for
/// the whole volume, a subPath's otherwise: relative, no `..`).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryVolumeBind {
    pub volume: PodVolume,
    pub subpath: String,
}

/// `path`'s last components, last first (`a/b/c` -> `c`, `b`, `a`).
fn names_back(path: &Path) -> impl Iterator<Item = &str> {
    path.components().rev().map_while(|c| match c {
        Component::Normal(name) => name.to_str(),
        _ => None,
    })
}

/// `(pod dir, volume name)` when `source` is `<pod dir>/volumes/kubernetes.io~empty-dir/NAME`
/// with `<pod dir>` in a `pods` directory.
fn whole_volume(source: &Path) -> Option<(PathBuf, String)> {
    let names: Vec<&str> = names_back(source).take(5).collect();
    match names[..] {
        [name, EMPTY_DIR_PLUGIN, "volumes", _uid, "pods"] => {
            Some((source.ancestors().nth(3)?.to_owned(), name.to_owned()))
        }
        _ => None,
    }
}

/// `(pod dir, volume name)` when `source` is `<pod dir>/volume-subpaths/NAME/CONTAINER/INDEX`
/// with `<pod dir>` in a `pods` directory.
fn subpath_volume(source: &Path) -> Option<(PathBuf, String)> {
    let names: Vec<&str> = names_back(source).take(6).collect();
    match names[..] {
        [_index, _container, name, "volume-subpaths", _uid, "pods"] => {
            Some((source.ancestors().nth(4)?.to_owned(), name.to_owned()))
        }
        _ => None,
    }
}

/// Whether the kubelet's `pod_dir` (`<kubelet root>/pods/<uid>`) is the pod `pod_uid`'s
/// (any pod's when the spec does not name it, as containerd 1.6 does not).
fn of_pod(pod_dir: &Path, pod_uid: Option<&str>) -> bool {
    pod_uid.is_none_or(|uid| pod_dir.file_name() == Some(std::ffi::OsStr::new(uid)))
}

/// Whether `dir` is a directory with a tmpfs mounted on it (its device is not its parent's).
fn is_tmpfs_mount(dir: &Path) -> Result<bool, Error> {
    let what = || format!("the emptyDir volume at {}", dir.display());
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(false);
    };
    let parent = std::fs::metadata(dir.join(".."))
        .map_err(|e| Error::io(format!("stat the directory above {}", what()), e))?;
    if !meta.is_dir() || meta.dev() == parent.dev() {
        return Ok(false);
    }
    let fs = statfs(dir).map_err(|e| Error::io(format!("statfs {}", what()), e.into()))?;
    Ok(fs.filesystem_type() == TMPFS_MAGIC)
}

/// The pod volume the kubelet's tmpfs at `dir` stands for: its size, mode and owner (the
/// kubelet gives it the pod's fsGroup and the setgid bit).
fn describe(dir: &Path, name: &str) -> Result<PodVolume, Error> {
    let what = || format!("the emptyDir volume at {}", dir.display());
    let label = name.len() <= MAX_NAME_LEN
        && !name.is_empty()
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !label {
        return Err(Error::InvalidArgument(format!(
            "{}: its name is not a DNS label, as Kubernetes names volumes",
            what()
        )));
    }
    let fs = statfs(dir).map_err(|e| Error::io(format!("statfs {}", what()), e.into()))?;
    let meta = std::fs::metadata(dir).map_err(|e| Error::io(format!("stat {}", what()), e))?;
    let size_bytes = u64::try_from(fs.block_size())
        .ok()
        .and_then(|size| fs.blocks().checked_mul(size))
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| Error::InvalidArgument(format!("{} has no size", what())))?;
    Ok(PodVolume {
        name: name.into(),
        size_bytes,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        ..Default::default()
    })
}

/// What a bind of `source` stands for: `Some` when it is a kubelet emptyDir on a tmpfs
/// (medium Memory), whole or a subPath of it, of the pod `pod_uid` (when the spec names it);
/// `None` for any other path (a bind through the share), another pod's volume among them
/// (a hostPath to it: the node's directory, not this pod's tmpfs of the same name). The
/// path is taken as the kernel resolves it: a hostPath through a link (a `pods/<uid>` that
/// links to another pod's directory) is judged by where it leads.
pub fn memory_empty_dir(
    source: &Path,
    pod_uid: Option<&str>,
) -> Result<Option<MemoryVolumeBind>, Error> {
    let source = &std::fs::canonicalize(source)
        .map_err(|e| Error::io(format!("resolve {}", source.display()), e))?;
    let ours = |pod_dir: &Path| of_pod(pod_dir, pod_uid);
    if let Some((pod_dir, name)) = whole_volume(source) {
        if !ours(&pod_dir) || !is_tmpfs_mount(source)? {
            return Ok(None);
        }
        return Ok(Some(MemoryVolumeBind {
            volume: describe(source, &name)?,
            subpath: String::new(),
        }));
    }
    let Some((pod_dir, name)) = subpath_volume(source).filter(|(dir, _)| ours(dir)) else {
        return Ok(None);
    };
    let volume_dir = pod_dir.join("volumes").join(EMPTY_DIR_PLUGIN).join(&name);
    if !is_tmpfs_mount(&volume_dir)? {
        return Ok(None);
    }
    let mountinfo = crate::host::share::read_mountinfo()
        .map_err(|e| Error::io("read /proc/self/mountinfo", e))?;
    // As the kernel names them (a kubelet root behind a link is its target there): `source`
    // is resolved already, above.
    let volume_at = std::fs::canonicalize(&volume_dir)
        .map_err(|e| Error::io(format!("resolve {}", volume_dir.display()), e))?;
    let subpath = subpath_in(&mountinfo, source, &volume_at).ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "{}: a subPath of the memory emptyDir {name}, but no mount of a path inside {} is there",
            source.display(),
            volume_dir.display()
        ))
    })?;
    Ok(Some(MemoryVolumeBind {
        volume: describe(&volume_dir, &name)?,
        subpath,
    }))
}

/// The path inside the volume mounted at `volume_dir` that the bind at `source` shows, from
/// `/proc/self/mountinfo`'s text: the last mount at `source` of the volume's file system
/// (same device), its root below the volume's root. `None` when there is none.
fn subpath_in(mountinfo: &str, source: &Path, volume_dir: &Path) -> Option<String> {
    // (device, root in the file system) of the last mount at `point`.
    let last_at = |point: &Path| {
        mountinfo.lines().rev().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (dev, root, at) = (fields.get(2)?, fields.get(3)?, fields.get(4)?);
            (Path::new(&crate::host::share::unescape(at)) == point).then(|| {
                (
                    dev.to_string(),
                    PathBuf::from(crate::host::share::unescape(root)),
                )
            })
        })
    };
    let (volume_dev, volume_root) = last_at(volume_dir)?;
    let (dev, root) = last_at(source)?;
    if dev != volume_dev {
        return None;
    }
    let inside = root.strip_prefix(&volume_root).ok()?;
    let clean = inside
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    clean.then(|| inside.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_paths_name_the_volume() {
        let pod = Path::new("/var/lib/kubelet/pods/1234");
        assert_eq!(
            whole_volume(&pod.join("volumes/kubernetes.io~empty-dir/cache")),
            Some((pod.to_owned(), "cache".into()))
        );
        assert_eq!(
            subpath_volume(&pod.join("volume-subpaths/cache/app/0")),
            Some((pod.to_owned(), "cache".into()))
        );
        for other in [
            "/var/lib/kubelet/pods/1234/volumes/kubernetes.io~configmap/cache",
            "/data/kubernetes.io~empty-dir/cache",
            "/var/lib/kubelet/x/1234/volumes/kubernetes.io~empty-dir/cache",
            "/var/lib/kubelet/pods/1234/volume-subpaths/cache/app",
            "/",
        ] {
            assert_eq!(whole_volume(Path::new(other)), None, "{other}");
            assert_eq!(subpath_volume(Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_subpath_is_the_binds_root_below_the_volumes() {
        let volume = Path::new("/var/lib/kubelet/pods/1/volumes/kubernetes.io~empty-dir/cache");
        let source = Path::new("/var/lib/kubelet/pods/1/volume-subpaths/cache/app/0");
        let info = "\
30 1 8:1 / / rw - ext4 /dev/sda1 rw
90 30 0:55 / /var/lib/kubelet/pods/1/volumes/kubernetes.io~empty-dir/cache rw - tmpfs tmpfs rw
91 30 0:55 /conf/app\\040one.yaml /var/lib/kubelet/pods/1/volume-subpaths/cache/app/0 rw - tmpfs tmpfs rw
";
        assert_eq!(
            subpath_in(info, source, volume).as_deref(),
            Some("conf/app one.yaml")
        );
        // Another file system's mount there, or a root outside the volume's: none.
        let other = info.replace("91 30 0:55", "91 30 0:56");
        assert_eq!(subpath_in(&other, source, volume), None);
        let outside = "\
90 30 0:55 /vol / rw - tmpfs tmpfs rw
91 30 0:55 /elsewhere /x rw - tmpfs tmpfs rw
";
        assert_eq!(subpath_in(outside, Path::new("/x"), Path::new("/")), None);
    }

    /// A scratch `<base>/<unique>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`,
    /// removed on drop.
    struct PodDir(PathBuf);

    impl PodDir {
        fn under(base: &str, name: &str) -> Self {
            let top = Path::new(base).join(format!("vmlet-test-{}-{name}", std::process::id()));
            let volume = top
                .join("pods/uid/volumes")
                .join(EMPTY_DIR_PLUGIN)
                .join(name);
            std::fs::create_dir_all(&volume).unwrap();
            Self(top)
        }

        fn volume(&self, name: &str) -> PathBuf {
            self.0
                .join("pods/uid/volumes")
                .join(EMPTY_DIR_PLUGIN)
                .join(name)
        }
    }

    impl Drop for PodDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_tmpfs_mount_is_described_by_its_size_and_mode() {
        // /dev/shm is a tmpfs mount wherever the tests run.
        let shm = Path::new("/dev/shm");
        assert!(
            is_tmpfs_mount(shm).unwrap(),
            "/dev/shm is no tmpfs mount here"
        );
        let fs = statfs(shm).unwrap();
        let volume = describe(shm, "cache").unwrap();
        assert_eq!(volume.name, "cache");
        assert_eq!(volume.mode, 0o1777);
        assert_eq!((volume.uid, volume.gid), (0, 0));
        assert_eq!(
            volume.size_bytes,
            fs.blocks() as u64 * fs.block_size() as u64
        );
        let err = describe(shm, "Not_A_Label").unwrap_err().to_string();
        assert!(err.contains("not a DNS label"), "{err}");
    }

    #[test]
    fn only_the_pods_own_volumes_are_its_pod_volumes() {
        let pod = Path::new("/var/lib/kubelet/pods/1234");
        assert!(of_pod(pod, Some("1234")));
        assert!(of_pod(pod, None));
        assert!(!of_pod(pod, Some("5678")));
        assert!(!of_pod(pod, Some("")));
    }

    #[test]
    fn directories_that_are_not_tmpfs_mounts_stay_binds() {
        // A directory on a tmpfs but no mount of its own, and one on the checkout's disk.
        for base in ["/dev/shm", env!("CARGO_MANIFEST_DIR")] {
            let pod = PodDir::under(base, "plain");
            assert!(!is_tmpfs_mount(&pod.volume("plain")).unwrap(), "{base}");
            assert_eq!(memory_empty_dir(&pod.volume("plain"), None).unwrap(), None);
        }
        assert_eq!(memory_empty_dir(Path::new("/"), None).unwrap(), None);
    }
}
