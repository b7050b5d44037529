//! The pod's volumes in the guest's memory ([`PodVolumes`]). A Kubernetes emptyDir of
//! medium Memory is a tmpfs on the node, whose pages a container under runc pays for out
//! of its memory limit; in a VM the same volume is a tmpfs of the guest's, sized as the
//! node sized it. It is made the first time a container of the pod mounts it and kept for
//! the VM's life (a restarted container finds its files, as with an emptyDir), so that its
//! files are charged where the containers' memory is, are seen as a tmpfs, and never pass
//! through the share.

use std::collections::HashSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{mount, MsFlags};
use vmlet_protocol::agent::PodVolume;

use crate::Error;

/// Where the guest mounts the pod's volumes, one directory each.
pub const POD_VOLUMES_DIR: &str = "/run/vmlet/pod-volumes";

/// The longest volume name (a DNS label, as Kubernetes names volumes).
const MAX_NAME_LEN: usize = 63;

/// The pod's volumes mounted so far, by name.
pub struct PodVolumes {
    dir: PathBuf,
    mounted: Mutex<HashSet<String>>,
}

/// A volume's name, checked: a DNS label, so that it is one plain path component.
pub fn checked_name(name: &str) -> Result<&str, Error> {
    let label = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if label {
        Ok(name)
    } else {
        Err(Error::InvalidRequest(format!(
            "pod volume name {name:?} is not a DNS label (a-z, 0-9 and '-', at most {MAX_NAME_LEN} characters)"
        )))
    }
}

/// The tmpfs' options: its size and its root's permission bits and owner.
fn tmpfs_options(volume: &PodVolume) -> Result<String, Error> {
    if volume.size_bytes == 0 {
        return Err(Error::InvalidRequest(format!(
            "pod volume {} has no size",
            volume.name
        )));
    }
    if volume.mode & !0o7777 != 0 {
        return Err(Error::InvalidRequest(format!(
            "pod volume {} has mode {:o}, more than permission bits",
            volume.name, volume.mode
        )));
    }
    Ok(format!(
        "size={},mode={:o},uid={},gid={}",
        volume.size_bytes, volume.mode, volume.uid, volume.gid
    ))
}

impl PodVolumes {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            mounted: Mutex::new(HashSet::new()),
        }
    }

    /// The directory of the volume `name` (checked), mounted or not.
    pub fn path_of(&self, name: &str) -> Result<PathBuf, Error> {
        Ok(self.dir.join(checked_name(name)?))
    }

    /// Mounts the volume's tmpfs unless a container mounted it before.
    pub fn ensure(&self, volume: &PodVolume) -> Result<(), Error> {
        let path = self.path_of(&volume.name)?;
        let options = tmpfs_options(volume)?;
        let mut mounted = self.mounted.lock().unwrap_or_else(|e| e.into_inner());
        if mounted.contains(&volume.name) {
            return Ok(());
        }
        make_dir(&self.dir)?;
        make_dir(&path)?;
        mount(
            Some("tmpfs"),
            &path,
            Some("tmpfs"),
            MsFlags::empty(),
            Some(options.as_str()),
        )
        .map_err(|e| {
            Error::io(
                format!("mount the tmpfs of pod volume {}", volume.name),
                e.into(),
            )
        })?;
        mounted.insert(volume.name.clone());
        Ok(())
    }
}

/// A directory only the agent uses (mode 0700); one already there is taken.
fn make_dir(path: &Path) -> Result<(), Error> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(Error::io(format!("mkdir {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for good in ["cache", "a", "data-1", &"x".repeat(63)] {
            assert_eq!(checked_name(good).unwrap(), good);
        }
        for bad in [
            "",
            "..",
            "a/b",
            "A",
            "-a",
            "a-",
            "a.b",
            &"x".repeat(64),
            "a\0",
        ] {
            let err = checked_name(bad).unwrap_err().to_string();
            assert!(err.contains("not a DNS label"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_tmpfs_takes_the_nodes_size_mode_and_owner() {
        let volume = PodVolume {
            name: "cache".into(),
            size_bytes: 64 << 20,
            mode: 0o2777,
            uid: 0,
            gid: 2000,
            ..Default::default()
        };
        assert_eq!(
            tmpfs_options(&volume).unwrap(),
            "size=67108864,mode=2777,uid=0,gid=2000"
        );
        let sizeless = PodVolume {
            size_bytes: 0,
            ..volume.clone()
        };
        assert!(tmpfs_options(&sizeless)
            .unwrap_err()
            .to_string()
            .contains("has no size"));
        let typed = PodVolume {
            mode: 0o40777,
            ..volume
        };
        assert!(tmpfs_options(&typed)
            .unwrap_err()
            .to_string()
            .contains("more than permission bits"));
    }

    #[test]
    fn paths_stay_in_the_volumes_directory() {
        let volumes = PodVolumes::new(POD_VOLUMES_DIR);
        assert_eq!(
            volumes.path_of("cache").unwrap(),
            Path::new("/run/vmlet/pod-volumes/cache")
        );
        assert!(volumes.path_of("../etc").is_err());
    }
}
