//! The pod's shared directory, laid out so that nothing the guest writes steers a host path
//! operation (the split Kata makes between its `rw` and `ro` directories):
//!
//! ```text
//! <pod dir>/            0711: QEMU's user reaches its sockets, nobody lists it
//!   mounts/             0700, a mount of its own (shared): the shim makes mount points here
//!     <container>/rootfs          and mounts into them, by file descriptor
//!     <container>/mounts/<n>
//!   share/              a read-only, nosuid, nodev copy of mounts/ that receives its mounts
//!                       (slave): what virtiofsd exports to the guest
//! ```
//!
//! The guest sees the top levels of the share read-only: it cannot plant a symlink, rename a
//! directory or fill the host's state directory there. It writes only inside the container
//! rootfs and read-write volumes mounted in it, and the shim never resolves a path inside
//! those: mount points are made with `openat2` beneath `mounts/` without symlinks or mount
//! crossings ([`crate::host::fd_mount`]), binds are attached by fd with their flags already set,
//! unmounts follow no symlink, and removal stops at a mount point instead of descending.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use containerd_shim_protos::api::Mount as RootfsMount;

use crate::host::fd_mount::{self, Propagation};
use crate::spec::HostBind;
use crate::Error;

/// Where the shim mounts, below the pod directory.
pub const MOUNTS_DIR: &str = "mounts";
/// What virtiofsd exports, below the pod directory.
pub const SHARE_DIR: &str = "share";
/// Mode of the pod directory: others may reach the sockets QEMU's user is given, not list.
pub const POD_DIR_MODE: u32 = 0o711;
/// Mode of everything the shim makes below `mounts/`.
const PRIVATE_MODE: u32 = 0o700;

/// Where a container's rootfs comes from.
pub enum RootfsSource {
    /// Mounts from containerd's CreateTask request (usually one overlay).
    Mounts(Vec<RootfsMount>),
    /// A directory already prepared in the bundle.
    Dir(PathBuf),
}

fn io_error(what: String) -> impl FnOnce(io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Makes `mounts/` and its read-only copy `share/` in a new pod directory. `record` is
/// called with each mount point before it is mounted (for teardown after a crash).
pub fn prepare(pod_dir: &Path, record: &dyn Fn(&Path) -> Result<(), Error>) -> Result<(), Error> {
    let what = |p: &str| format!("prepare {}", pod_dir.join(p).display());
    let pod = fd_mount::open_dir(pod_dir).map_err(io_error(what(".")))?;
    let mounts = fd_mount::mkdirs_beneath(pod.as_fd(), Path::new(MOUNTS_DIR), PRIVATE_MODE)
        .map_err(io_error(what(MOUNTS_DIR)))?;
    record(&pod_dir.join(MOUNTS_DIR))?;
    fd_mount::bind(mounts.as_fd(), mounts.as_fd(), false, Propagation::Private)
        .map_err(io_error(what(MOUNTS_DIR)))?;
    let root = fd_mount::open_beneath(pod.as_fd(), Path::new(MOUNTS_DIR), true)
        .map_err(io_error(what(MOUNTS_DIR)))?;
    fd_mount::set_propagation(root.as_fd(), Propagation::Shared)
        .map_err(io_error(what(MOUNTS_DIR)))?;
    let share = fd_mount::mkdirs_beneath(pod.as_fd(), Path::new(SHARE_DIR), PRIVATE_MODE)
        .map_err(io_error(what(SHARE_DIR)))?;
    record(&pod_dir.join(SHARE_DIR))?;
    fd_mount::bind(root.as_fd(), share.as_fd(), true, Propagation::Slave)
        .map_err(io_error(what(SHARE_DIR)))
}

/// The root of the pod's `mounts/` mount.
fn mounts_root(pod_dir: &Path) -> Result<OwnedFd, Error> {
    let what = format!("open {}", pod_dir.join(MOUNTS_DIR).display());
    let pod = fd_mount::open_dir(pod_dir).map_err(io_error(what.clone()))?;
    fd_mount::open_beneath(pod.as_fd(), Path::new(MOUNTS_DIR), true).map_err(io_error(what))
}

/// A container id as one plain path component (containerd's ids are; checked anyway).
fn component(container_id: &str) -> Result<&Path, Error> {
    let plain = !container_id.is_empty()
        && !container_id.contains('/')
        && container_id != "."
        && container_id != "..";
    if plain {
        Ok(Path::new(container_id))
    } else {
        Err(Error::InvalidArgument(format!(
            "container id {container_id:?} cannot name a directory"
        )))
    }
}

/// Where [`mount_container`] mounts a container's rootfs.
pub fn container_rootfs(pod_dir: &Path, container_id: &str) -> Result<PathBuf, Error> {
    Ok(pod_dir
        .join(MOUNTS_DIR)
        .join(component(container_id)?)
        .join("rootfs"))
}

/// Mounts a container's rootfs at `mounts/<id>/rootfs` and its binds at
/// `mounts/<id>/mounts/<n>` (the guest sees them at the same paths below the share);
/// `record` persists each mount point before it is mounted.
pub fn mount_container(
    pod_dir: &Path,
    container_id: &str,
    rootfs: &RootfsSource,
    binds: &[HostBind],
    record: &dyn Fn(&Path) -> Result<(), Error>,
) -> Result<(), Error> {
    let id = component(container_id)?;
    let root = mounts_root(pod_dir)?;
    let base = pod_dir.join(MOUNTS_DIR);
    let rel = id.join("rootfs");
    let target = fd_mount::mkdirs_beneath(root.as_fd(), &rel, PRIVATE_MODE)
        .map_err(io_error(format!("create {}", base.join(&rel).display())))?;
    record(&base.join(&rel))?;
    mount_rootfs(rootfs, &target)?;
    for bind in binds {
        let rel = Path::new(&bind.share_path);
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(Error::Internal(format!("bad share path {rel:?}")));
        };
        let created = format!("create {}", base.join(rel).display());
        let dir = fd_mount::mkdirs_beneath(root.as_fd(), parent, PRIVATE_MODE)
            .map_err(io_error(created.clone()))?;
        let source = fd_mount::open_host(&bind.source).map_err(io_error(format!(
            "open bind source {}",
            bind.source.display()
        )))?;
        let point = if bind.source.is_dir() {
            fd_mount::mkdirs_beneath(dir.as_fd(), Path::new(name), PRIVATE_MODE)
        } else {
            fd_mount::create_file_beneath(dir.as_fd(), name)
        }
        .map_err(io_error(created))?;
        record(&base.join(rel))?;
        fd_mount::bind(
            source.as_fd(),
            point.as_fd(),
            bind.readonly,
            Propagation::Private,
        )
        .map_err(io_error(format!(
            "bind {} to the share",
            bind.source.display()
        )))?;
    }
    Ok(())
}

/// Mounts the rootfs onto the mount point `target` (reached through its fd, never by path):
/// always nosuid and nodev on the host (the guest's own mount decides what runs inside it).
fn mount_rootfs(rootfs: &RootfsSource, target: &OwnedFd) -> Result<(), Error> {
    match rootfs {
        RootfsSource::Dir(dir) => {
            let source = fd_mount::open_host(dir)
                .map_err(io_error(format!("open rootfs {}", dir.display())))?;
            fd_mount::bind(source.as_fd(), target.as_fd(), false, Propagation::Private)
                .map_err(io_error(format!("bind {} to the share", dir.display())))
        }
        RootfsSource::Mounts(mounts) => {
            if mounts.len() != 1 {
                return Err(Error::Unimplemented(format!(
                    "a rootfs of {} mounts",
                    mounts.len()
                )));
            }
            let m = &mounts[0];
            let mut options = m.options.clone();
            options.extend(["nosuid".to_owned(), "nodev".to_owned()]);
            containerd_shim::mount::mount_rootfs(
                Some(m.type_.as_str()),
                Some(m.source.as_str()),
                &options,
                fd_mount::proc_path(target.as_fd()),
            )
            .map_err(|e| Error::Internal(format!("mount rootfs: {e}")))
        }
    }
}

/// Unmounts recorded mount points, last first. Each must lie beneath `pod_dir` and be
/// reached without a symlink; the unmount itself follows none. Goes on past failures and
/// returns the first.
pub fn unmount_recorded(pod_dir: &Path, targets: &[PathBuf]) -> Result<(), Error> {
    let mut first = None;
    for target in targets.iter().rev() {
        if let Err(e) = unmount_checked(pod_dir, target) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

fn unmount_checked(pod_dir: &Path, target: &Path) -> Result<(), Error> {
    let refused = |why: String| {
        Error::FailedPrecondition(format!("not unmounting {}: {why}", target.display()))
    };
    let rel = target
        .strip_prefix(pod_dir)
        .map_err(|_| refused(format!("outside {}", pod_dir.display())))?;
    let pod = match fd_mount::open_dir(pod_dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("open {}", pod_dir.display()), e)),
    };
    match fd_mount::open_beneath(pod.as_fd(), rel, true) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(refused(e.to_string())),
    }
    fd_mount::unmount(target).map_err(io_error(format!("unmount {}", target.display())))
}

/// Unmounts whatever is still mounted below `dir` (deepest first), e.g. after the state file
/// that listed it was lost, so that nothing stops its removal.
pub fn unmount_below(dir: &Path) -> Result<(), Error> {
    let info = read_mountinfo().map_err(io_error("read /proc/self/mountinfo".into()))?;
    let mut below: Vec<PathBuf> = mount_points(&info)
        .into_iter()
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    below.sort();
    below.dedup();
    unmount_recorded(dir, &below)
}

/// The mount points of a `/proc/self/mountinfo` text (field 5, octal escapes decoded).
fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|escaped| PathBuf::from(unescape(escaped)))
        .collect()
}

/// `/proc/self/mountinfo`'s text. Its paths are bytes, escaped only for space, tab, newline
/// and backslash: a mount anyone on the node made at a name that is not UTF-8 (a user's FUSE
/// mount) is taken lossily, instead of making every reader fail; the paths vmlet looks for
/// are its own and the kubelet's, UTF-8.
pub(crate) fn read_mountinfo() -> io::Result<String> {
    std::fs::read("/proc/self/mountinfo").map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// A `/proc/self/mountinfo` field with its octal escapes (`\040` for a space) decoded.
pub(crate) fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes a container's directory below `mounts/` (its mounts must be gone: a mount point
/// still there stops the removal with an error).
pub fn remove_container_dir(pod_dir: &Path, container_id: &str) -> Result<(), Error> {
    let dir = pod_dir.join(MOUNTS_DIR).join(component(container_id)?);
    fd_mount::remove_tree(&dir).map_err(io_error(format!("remove {}", dir.display())))
}

/// Removes the pod directory (after [`unmount_recorded`] and [`unmount_below`]).
pub fn remove_pod_dir(pod_dir: &Path) -> Result<(), Error> {
    fd_mount::remove_tree(pod_dir).map_err(io_error(format!("remove {}", pod_dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_name_one_directory() {
        assert!(component("c1").is_ok());
        for bad in ["", ".", "..", "a/b", "../etc"] {
            let err = component(bad).unwrap_err();
            assert!(err.message().contains("container id"), "{bad}");
        }
    }

    #[test]
    fn mount_points_from_mountinfo() {
        let info = "22 1 0:21 / /run rw,nosuid shared:5 - tmpfs tmpfs rw\n\
                    90 22 0:21 /x /run/vmlet/p\\0401/mounts rw shared:9 - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_points(info),
            [
                PathBuf::from("/run"),
                PathBuf::from("/run/vmlet/p 1/mounts")
            ]
        );
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }

    #[test]
    fn recorded_mounts_outside_the_pod_are_refused() {
        let err =
            unmount_recorded(Path::new("/run/vmlet/p1"), &[PathBuf::from("/etc")]).unwrap_err();
        assert!(
            err.message().contains("outside /run/vmlet/p1"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn recorded_mounts_behind_a_symlink_are_refused() {
        let dir = std::env::temp_dir().join(format!("vmlet-share-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(MOUNTS_DIR)).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join(MOUNTS_DIR).join("c1")).unwrap();
        let err = unmount_recorded(&dir, &[dir.join("mounts/c1/rootfs")]).unwrap_err();
        assert!(
            err.message().contains("not unmounting"),
            "{}",
            err.message()
        );
        // What is already gone is fine.
        unmount_recorded(&dir, &[dir.join("mounts/c2/rootfs")]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
