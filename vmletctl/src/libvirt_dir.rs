//! libvirt's directory of its domains' state (`/var/lib/libvirt/qemu`). Each domain's QEMU
//! opens its master key there by path, and each pod's QEMU runs as a user of its own
//! (`pod_users`), not as libvirt's QEMU user: it must be able to pass through that
//! directory. Debian ships it `0750` and its QEMU user's; `vmletctl install` adds search
//! permission for others (`0751`: others still cannot list it, and each domain's own
//! directory stays `0750` and its QEMU's), records the mode it found, and `uninstall` gives
//! that mode back where the directory still has the one install gave it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vmlet_shim::Error;

/// libvirt's QEMU driver's state directory, relative to the root.
pub const DIR: &str = "var/lib/libvirt/qemu";

/// A mode install changed: the directory (relative to the root) and its mode before and
/// after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeChange {
    pub dir: PathBuf,
    pub before: u32,
    pub after: u32,
}

/// The permission bits of `path` (none: it is not a directory).
fn dir_mode(path: &Path) -> Result<Option<u32>, Error> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(Some(meta.permissions().mode() & 0o7777)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("stat {}", path.display()), e)),
    }
}

/// Whether every pod's QEMU can pass through libvirt's directory under `root` (true where
/// there is none: libvirt makes it so when it makes it).
pub fn passable(root: &Path) -> Result<bool, Error> {
    Ok(dir_mode(&root.join(DIR))?.is_none_or(|mode| mode & 0o001 != 0))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), Error> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {:o} {}", mode, path.display()), e))
}

/// Gives others search permission on libvirt's directory under `root`, where it lacks it;
/// what changed, for uninstall.
pub fn open_to_pods(root: &Path) -> Result<Option<ModeChange>, Error> {
    let path = root.join(DIR);
    let Some(before) = dir_mode(&path)? else {
        return Ok(None);
    };
    if before & 0o001 != 0 {
        return Ok(None);
    }
    let after = before | 0o001;
    set_mode(&path, after)?;
    Ok(Some(ModeChange {
        dir: DIR.into(),
        before,
        after,
    }))
}

/// Gives back the mode `change` found, where the directory still has the one install gave
/// it; a step for the user either way (none: the directory is gone).
pub fn restore(root: &Path, change: &ModeChange) -> Result<Option<String>, Error> {
    let path = root.join(&change.dir);
    match dir_mode(&path)? {
        None => Ok(None),
        Some(mode) if mode == change.after => {
            set_mode(&path, change.before)?;
            Ok(Some(format!(
                "gave /{} its mode {:04o} back",
                change.dir.display(),
                change.before
            )))
        }
        Some(mode) => Ok(Some(format!(
            "kept /{}'s mode {mode:04o} (changed since install made it {:04o})",
            change.dir.display(),
            change.after
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        dir_mode(path).unwrap().unwrap()
    }

    #[test]
    fn debians_mode_is_opened_for_search_and_given_back() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(DIR);
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&dir, 0o750).unwrap();
        assert!(!passable(root.path()).unwrap());
        let change = open_to_pods(root.path()).unwrap().unwrap();
        assert_eq!(
            (change.before, change.after, mode(&dir)),
            (0o750, 0o751, 0o751)
        );
        assert!(passable(root.path()).unwrap());
        // Twice: nothing more to change.
        assert_eq!(open_to_pods(root.path()).unwrap(), None);
        let step = restore(root.path(), &change).unwrap().unwrap();
        assert!(step.contains("0750 back"), "{step}");
        assert_eq!(mode(&dir), 0o750);
    }

    #[test]
    fn a_mode_changed_since_or_a_passable_or_missing_directory_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        assert!(passable(root.path()).unwrap());
        assert_eq!(open_to_pods(root.path()).unwrap(), None);
        let dir = root.path().join(DIR);
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&dir, 0o755).unwrap();
        assert_eq!(open_to_pods(root.path()).unwrap(), None);
        let change = ModeChange {
            dir: DIR.into(),
            before: 0o750,
            after: 0o751,
        };
        let step = restore(root.path(), &change).unwrap().unwrap();
        assert!(step.starts_with("kept"), "{step}");
        assert_eq!(mode(&dir), 0o755);
    }
}
