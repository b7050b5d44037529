//! Paths of a container's rootfs as the container will see them, before the init moves
//! into it. The image and the spec name them (mount destinations, masked and read-only
//! paths, device nodes), and the image may hold symlinks on the way (`/etc -> /`,
//! `/dev -> /run`): each path is resolved beneath the rootfs with `openat2(2)` and
//! `RESOLVE_IN_ROOT` (a link is followed as the container would follow it, never out of
//! the rootfs), and what the init then does with it goes through the descriptor it got
//! (`/proc/self/fd/N` for `mount(2)`, `*at` calls with the parent's descriptor), never
//! through the joined path again. runc does the same with its secure join.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// The rootfs, open.
pub struct Rootfs {
    fd: OwnedFd,
}

/// How every path is resolved: beneath the rootfs, no magic links (`/proc/self/root`).
fn in_root() -> ResolveFlag {
    ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// The spec's `path` as the parts below the root: `.` dropped, `..` taken back (never
/// above the root), as the kernel resolves them beneath it.
fn parts(path: &str) -> Vec<&OsStr> {
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(name) => parts.push(name),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    parts
}

fn joined(parts: &[&OsStr]) -> PathBuf {
    if parts.is_empty() {
        PathBuf::from(".")
    } else {
        parts.iter().collect()
    }
}

/// Where `mount(2)` and other path calls reach the file an `O_PATH` descriptor holds.
pub fn proc_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

impl Rootfs {
    pub fn open(path: &Path) -> Result<Self, Errno> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Rootfs { fd })
    }

    fn resolve(&self, parts: &[&OsStr], flags: OFlag) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(in_root());
        openat2(self.fd.as_fd(), joined(parts).as_path(), how)
    }

    /// `path` resolved beneath the rootfs (an `O_PATH` descriptor), or `None` when it does
    /// not exist there.
    pub fn find(&self, path: &str) -> Result<Option<OwnedFd>, Errno> {
        match self.resolve(&parts(path), OFlag::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `path` as a directory beneath the rootfs, made with its parents where missing
    /// (mode 0755).
    pub fn make_dir(&self, path: &str) -> Result<OwnedFd, Errno> {
        self.make_dir_as(path, None)
    }

    /// As [`Rootfs::make_dir`], each directory it makes given exactly `mode` (past the
    /// umask, through its descriptor), as the kubelet makes a subPath's: the mode of the
    /// volume's root.
    pub fn make_dir_with_mode(&self, path: &str, mode: Mode) -> Result<OwnedFd, Errno> {
        self.make_dir_as(path, Some(mode))
    }

    fn make_dir_as(&self, path: &str, exact: Option<Mode>) -> Result<OwnedFd, Errno> {
        let parts = parts(path);
        let mut dir = self.resolve(&[], OFlag::O_DIRECTORY)?;
        for i in 0..parts.len() {
            dir = match self.resolve(&parts[..=i], OFlag::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    // `dir` is the resolved parent: the new name is made in it, whatever
                    // links led there.
                    let mode = exact.unwrap_or(Mode::from_bits_truncate(0o755));
                    let made = match nix::sys::stat::mkdirat(dir.as_fd(), parts[i], mode) {
                        Ok(()) => true,
                        Err(Errno::EEXIST) => false,
                        Err(e) => return Err(e),
                    };
                    let fd = self.resolve(&parts[..=i], OFlag::O_DIRECTORY)?;
                    if let (true, Some(mode)) = (made, exact) {
                        use std::os::unix::fs::PermissionsExt;
                        // The new directory itself, through its descriptor's magic link.
                        std::fs::set_permissions(
                            proc_path(&fd),
                            std::fs::Permissions::from_mode(mode.bits()),
                        )
                        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
                    }
                    fd
                }
                Err(e) => return Err(e),
            };
        }
        Ok(dir)
    }

    /// The directory that holds `path` (made where missing) and the name in it; `None` for
    /// the root itself.
    pub fn parent_of<'a>(&self, path: &'a str) -> Result<Option<(OwnedFd, &'a OsStr)>, Errno> {
        let parts = parts(path);
        let Some((name, parents)) = parts.split_last() else {
            return Ok(None);
        };
        let parent = self.make_dir(&joined(parents).to_string_lossy())?;
        Ok(Some((parent, name)))
    }

    /// `path` beneath the rootfs, an empty file (mode 0644) made where nothing is (and its
    /// parents); what is there already is taken as it is.
    pub fn make_file(&self, path: &str) -> Result<OwnedFd, Errno> {
        if let Some(fd) = self.find(path)? {
            return Ok(fd);
        }
        let Some((parent, name)) = self.parent_of(path)? else {
            return self.resolve(&[], OFlag::empty());
        };
        match nix::fcntl::openat(
            parent.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        ) {
            Ok(_) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
        self.resolve(&parts(path), OFlag::empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A rootfs whose image points `/etc` at the guest's `/` and `/dev` at `/tmp` by
    /// absolute links, and `/run` at `../..` by a relative one.
    fn hostile_rootfs() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        symlink("/", root.join("etc")).unwrap();
        symlink("/tmp", root.join("dev")).unwrap();
        symlink("../..", root.join("run")).unwrap();
        (dir, root)
    }

    fn real(fd: &OwnedFd) -> PathBuf {
        std::fs::read_link(proc_path(fd)).unwrap()
    }

    #[test]
    fn links_are_followed_inside_the_rootfs_only() {
        let (_dir, root) = hostile_rootfs();
        let rootfs = Rootfs::open(&root).unwrap();
        // /etc -> / is the rootfs's own root.
        assert_eq!(real(&rootfs.find("/etc").unwrap().unwrap()), root);
        assert_eq!(real(&rootfs.find("/run").unwrap().unwrap()), root);
        assert_eq!(
            real(&rootfs.find("/dev").unwrap().unwrap()),
            root.join("tmp")
        );
        assert!(rootfs.find("/etc/hostname-nowhere").unwrap().is_none());
        assert_eq!(real(&rootfs.find("/../../..").unwrap().unwrap()), root);
    }

    #[test]
    fn what_is_made_is_made_beneath_the_rootfs() {
        let (dir, root) = hostile_rootfs();
        let rootfs = Rootfs::open(&root).unwrap();
        let made = rootfs.make_dir("/etc/vmlet-test/a").unwrap();
        assert_eq!(real(&made), root.join("vmlet-test/a"));
        let file = rootfs.make_file("/run/x/y/mountpoint").unwrap();
        assert_eq!(real(&file), root.join("x/y/mountpoint"));
        let (parent, name) = rootfs.parent_of("/dev/sda").unwrap().unwrap();
        assert_eq!((real(&parent), name), (root.join("tmp"), OsStr::new("sda")));
        // Nothing outside: the temporary directory holds only the rootfs.
        let outside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(outside, vec![std::ffi::OsString::from("rootfs")]);
    }

    #[test]
    fn directories_made_with_a_mode_get_exactly_it_and_what_is_there_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, root) = hostile_rootfs();
        std::fs::create_dir(root.join("tmp/kept")).unwrap();
        std::fs::set_permissions(root.join("tmp/kept"), PermissionsExt::from_mode(0o700)).unwrap();
        let rootfs = Rootfs::open(&root).unwrap();
        // Past any umask (0022 at least where the tests run).
        let made = rootfs
            .make_dir_with_mode("/dev/kept/a/b", Mode::from_bits_truncate(0o777))
            .unwrap();
        assert_eq!(real(&made), root.join("tmp/kept/a/b"));
        let mode = |p: &str| {
            std::fs::metadata(root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(
            (mode("tmp/kept"), mode("tmp/kept/a"), mode("tmp/kept/a/b")),
            (0o700, 0o777, 0o777)
        );
    }

    #[test]
    fn a_file_in_the_way_of_a_directory_is_an_error() {
        let (_dir, root) = hostile_rootfs();
        std::fs::write(root.join("tmp/file"), "x").unwrap();
        let rootfs = Rootfs::open(&root).unwrap();
        assert_eq!(rootfs.make_dir("/dev/file/sub").err(), Some(Errno::ENOTDIR));
    }
}
