//! File system operations by file descriptor, for directories that hold what the guest can
//! write: nothing here follows a symlink, leaves the directory it starts from, or crosses
//! into a mount it did not expect.
//!
//! - [`open_beneath`] / [`mkdirs_beneath`] / [`create_file_beneath`]: `openat2` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`;
//! - [`bind`]: a detached copy of a host tree (`open_tree`) gets its flags and propagation
//!   (`mount_setattr`) before it is attached to a mount point given as an fd (`move_mount`),
//!   so it is never visible, nor copied into another mount namespace (virtiofsd's), without
//!   them (a bind followed by a read-only remount is writable in the copies made meanwhile);
//! - [`unmount`]: `umount2` with `UMOUNT_NOFOLLOW`;
//! - [`remove_tree`]: removal that unlinks symlinks instead of following them and stops,
//!   with an error, at a mount point instead of descending into it.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

/// Resolution for everything below a directory the shim owns: stay beneath it, follow no
/// symlink (magic or not) and cross no mount.
const STRICT: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// Mount propagation for [`bind`] and [`set_propagation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Private,
    Shared,
    /// Receives mounts from the peer group it was copied from, sends none.
    Slave,
}

impl Propagation {
    fn flag(self) -> u64 {
        match self {
            Propagation::Private => libc::MS_PRIVATE,
            Propagation::Shared => libc::MS_SHARED,
            Propagation::Slave => libc::MS_SLAVE,
        }
    }
}

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

/// A syscall's return value as an owned descriptor.
fn fd_result(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as libc::c_int) })
}

fn unit_result(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn openat2(
    dir: BorrowedFd,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode.into(),
        resolve,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a valid `open_how` of the size passed;
    // both outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    fd_result(ret)
}

/// Checks that `rel` is a relative path of plain names (no `..`, no root).
fn plain_relative(rel: &Path) -> io::Result<()> {
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if plain && rel.components().next().is_some() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a plain relative path", rel.display()),
        ))
    }
}

/// Opens `rel` beneath `dir` as an `O_PATH` descriptor without following a symlink; with
/// `cross_mounts` the path may pass into mounts (the shim's own, in a directory the guest
/// cannot write), else any mount on the way is an error (`EXDEV`).
pub fn open_beneath(dir: BorrowedFd, rel: &Path, cross_mounts: bool) -> io::Result<OwnedFd> {
    plain_relative(rel)?;
    let resolve = if cross_mounts {
        STRICT & !libc::RESOLVE_NO_XDEV
    } else {
        STRICT
    };
    // No O_NOFOLLOW: with it O_PATH would open a trailing symlink itself instead of
    // failing as RESOLVE_NO_SYMLINKS makes it.
    openat2(dir, rel, libc::O_PATH, 0, resolve)
}

/// Opens a host path from the spec (a bind's source) as an `O_PATH` descriptor, following
/// symlinks as runc does for a bind source: the path is the user's, not the guest's.
pub fn open_host(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    fd_result(fd.into())
}

/// Opens a directory the caller names by path (the shim's own state directory, which the
/// guest never sees) for the `*_beneath` calls.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    fd_result(fd.into())
}

/// Makes each missing directory of `rel` beneath `dir` with `mode`, never following a
/// symlink or crossing a mount, and returns the last one (`O_PATH`).
pub fn mkdirs_beneath(dir: BorrowedFd, rel: &Path, mode: u32) -> io::Result<OwnedFd> {
    plain_relative(rel)?;
    let mut current = openat2(dir, Path::new("."), libc::O_PATH, 0, STRICT)?;
    for name in rel.iter() {
        match nix::sys::stat::mkdirat(&current, name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = current.as_fd();
        current = openat2(
            fd,
            Path::new(name),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
            STRICT,
        )?;
    }
    Ok(current)
}

/// Makes an empty regular file `name` in `dir` (a mount point for a file bind) and returns
/// it; an existing regular file is reused, anything else (a symlink) is an error.
pub fn create_file_beneath(dir: BorrowedFd, name: &OsStr) -> io::Result<OwnedFd> {
    plain_relative(Path::new(name))?;
    openat2(
        dir,
        Path::new(name),
        libc::O_CREAT | libc::O_WRONLY | libc::O_NOFOLLOW,
        0o600,
        STRICT,
    )
}

/// Binds the host tree at `source` (recursively) onto the mount point `target`, nosuid and
/// nodev (and read-only with `readonly`), keeping the source's other flags (noexec), with
/// `propagation` (set on the copy, which starts out in the source's peer group when that is
/// shared: [`Propagation::Slave`] makes it receive the source's mounts). The flags are set
/// while the copy is detached.
pub fn bind(
    source: BorrowedFd,
    target: BorrowedFd,
    readonly: bool,
    propagation: Propagation,
) -> io::Result<()> {
    let empty = c_path(Path::new(""))?;
    // SAFETY: `empty` is NUL-terminated; `source` is an open descriptor.
    let tree = fd_result(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            source.as_raw_fd(),
            empty.as_ptr(),
            libc::OPEN_TREE_CLONE
                | libc::OPEN_TREE_CLOEXEC
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::AT_RECURSIVE as libc::c_uint,
        )
    })?;
    let mut set = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if readonly {
        set |= libc::MOUNT_ATTR_RDONLY;
    }
    setattr(tree.as_fd(), set, Some(propagation))?;
    // SAFETY: `empty` is NUL-terminated; both descriptors are open.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
}

/// Changes the propagation of the mount whose root `mount` is (attached).
pub fn set_propagation(mount: BorrowedFd, propagation: Propagation) -> io::Result<()> {
    setattr(mount, 0, Some(propagation))
}

fn setattr(mount: BorrowedFd, set: u64, propagation: Option<Propagation>) -> io::Result<()> {
    let empty = c_path(Path::new(""))?;
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation: propagation.map_or(0, Propagation::flag),
        userns_fd: 0,
    };
    // SAFETY: `empty` is NUL-terminated, `attr` a valid `mount_attr` of the size passed;
    // both outlive the call.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            empty.as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })
}

/// The path through which `mount(2)` (old API) reaches exactly the file `fd` refers to.
pub fn proc_path(fd: BorrowedFd) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Detaches every mount stacked at `target`, without following a symlink there. A path that
/// is not (or no longer) a mount point is fine.
pub fn unmount(target: &Path) -> io::Result<()> {
    // Mounts may stack; detach until the path is no longer a mount point.
    for _ in 0..8 {
        match nix::mount::umount2(
            target,
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        ) {
            Ok(()) => continue,
            Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Removes `path` and everything below it on the same mount. Symlinks are removed, never
/// followed; a mount point below `path` stops the removal of its parents with an error
/// naming it (so nothing inside a mount that is still there is ever deleted). A missing
/// `path` is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot remove {}", path.display()),
        ));
    };
    let parent = match open_dir(parent) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    match remove_entry(parent.as_fd(), name, path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn remove_entry(dir: BorrowedFd, name: &OsStr, shown: &Path) -> io::Result<()> {
    let stat = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFDIR {
        // A file, symlink, socket or FIFO: unlinked (a file mount point is EBUSY).
        return unlink(dir, name, UnlinkatFlags::NoRemoveDir, shown);
    }
    let sub = match openat2(
        dir,
        Path::new(name),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
        STRICT,
    ) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            return Err(io::Error::other(format!(
                "{} is still a mount point; not removed",
                shown.display()
            )))
        }
        Err(e) => return Err(e),
    };
    let names = list(&sub)?;
    let mut first = None;
    for child in names {
        if let Err(e) = remove_entry(sub.as_fd(), &child, &shown.join(&child)) {
            first.get_or_insert(e);
        }
    }
    if let Some(e) = first {
        return Err(e);
    }
    unlink(dir, name, UnlinkatFlags::RemoveDir, shown)
}

fn unlink(dir: BorrowedFd, name: &OsStr, how: UnlinkatFlags, shown: &Path) -> io::Result<()> {
    nix::unistd::unlinkat(dir, name, how).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("remove {}: {e}", shown.display()),
        )
    })
}

/// The names in the directory `dir` (opened for reading), `.` and `..` left out.
fn list(dir: &OwnedFd) -> io::Result<Vec<std::ffi::OsString>> {
    let copy = dir.try_clone()?;
    let mut d = nix::dir::Dir::from_fd(copy)?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vmlet-fdmount-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn mkdirs_refuse_a_planted_symlink() {
        let dir = temp("mkdirs");
        let outside = temp("mkdirs-outside");
        std::os::unix::fs::symlink(&outside, dir.join("c2")).unwrap();
        let fd = open_dir(&dir).unwrap();
        let err = mkdirs_beneath(fd.as_fd(), Path::new("c2/rootfs"), 0o700).unwrap_err();
        assert!(
            [Some(libc::ELOOP), Some(libc::ENOTDIR)].contains(&err.raw_os_error()),
            "{err}"
        );
        assert!(!outside.join("rootfs").exists());
        mkdirs_beneath(fd.as_fd(), Path::new("c3/mounts"), 0o700).unwrap();
        assert!(dir.join("c3/mounts").is_dir());
        for bad in ["../x", "/abs", ""] {
            assert!(
                mkdirs_beneath(fd.as_fd(), Path::new(bad), 0o700).is_err(),
                "{bad}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn file_mount_points_are_not_created_through_symlinks() {
        let dir = temp("files");
        let outside = temp("files-outside");
        let victim = outside.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("0")).unwrap();
        let fd = open_dir(&dir).unwrap();
        assert!(create_file_beneath(fd.as_fd(), OsStr::new("0")).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        create_file_beneath(fd.as_fd(), OsStr::new("1")).unwrap();
        assert!(dir.join("1").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn remove_tree_unlinks_symlinks_without_following_them() {
        let dir = temp("remove");
        let outside = temp("remove-outside");
        std::fs::write(outside.join("canary"), b"keep").unwrap();
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.join("canary"), dir.join("a/b/file-link")).unwrap();
        remove_tree(&dir).unwrap();
        assert!(!dir.exists());
        assert_eq!(std::fs::read(outside.join("canary")).unwrap(), b"keep");
        remove_tree(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn open_beneath_stays_beneath() {
        let dir = temp("beneath");
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("a/etc")).unwrap();
        let fd = open_dir(&dir).unwrap();
        assert!(open_beneath(fd.as_fd(), Path::new("a"), false).is_ok());
        assert!(open_beneath(fd.as_fd(), Path::new("a/etc"), false).is_err());
        assert!(open_beneath(fd.as_fd(), Path::new("a/etc/passwd"), false).is_err());
        assert!(open_beneath(fd.as_fd(), Path::new("../"), false).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
