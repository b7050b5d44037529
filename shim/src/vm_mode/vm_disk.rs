//! A VM-mode pod's root disk (`vmlet.io/image-type: vm`): the one disk image under `/disk/`
//! of the container's image (KubeVirt's containerDisk convention), checked before QEMU sees
//! it, and the copy-on-write overlay in the pod's state directory that the VM boots from,
//! so that the image is never written.
//!
//! The image is the pod author's: nothing in it may name another host file. So:
//! - `/disk` and the file in it are opened without following a symlink, and a symlink or
//!   anything but one regular file there is an error that names it;
//! - the format is read from the file's first bytes by [`classify`] here, not probed by
//!   QEMU: a qcow2 header (magic `QFI\xfb`) is a qcow2 disk and must name no backing file
//!   and no external data file (either would be a host path the image chose); anything
//!   else is a raw disk. The format is then given to `qemu-img` and libvirt explicitly;
//! - the file's name is plain (`[A-Za-z0-9._-]`, no leading dot), so the overlay's backing
//!   path cannot be read as a QEMU protocol (`nbd:`, `json:`) or an option.

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::host::host_command;
use crate::Error;

/// Where the disk image must be, in the container's image.
pub const DISK_DIR: &str = "disk";
/// At most this many entries are looked at in `/disk/`.
const MAX_ENTRIES: usize = 64;
/// How long `qemu-img create` may take.
const QEMU_IMG_DEADLINE: Duration = Duration::from_secs(30);

/// A disk image's format, as vmlet hands it to QEMU (never probed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFormat {
    Qcow2,
    Raw,
}

impl DiskFormat {
    /// The name `qemu-img` and libvirt use.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        }
    }
}

impl fmt::Display for DiskFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The image's disk, found and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskImage {
    /// Its path on the host (beneath the container's root file system).
    pub path: PathBuf,
    pub format: DiskFormat,
    /// The size the guest sees (bytes).
    pub virtual_size: u64,
}

/// What [`classify`] makes of a disk image's first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    Qcow2 { virtual_size: u64 },
    Raw,
}

/// The qcow2 header fields vmlet reads (QEMU's `docs/interop/qcow2.txt`): big-endian
/// `magic` at 0, `version` at 4, `backing_file_offset` at 8, `size` at 24 and, from
/// version 3, `incompatible_features` at 72.
const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";
/// Bytes [`classify`] needs.
pub const HEADER_LEN: usize = 80;
/// `incompatible_features` bit 2: the guest data lives in an external data file.
const QCOW2_EXTERNAL_DATA_FILE: u64 = 1 << 2;

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Classifies a disk image by its first bytes (`header`, at most [`HEADER_LEN`] of them;
/// fewer for a short file). A qcow2 header that names a backing file or an external data
/// file, or that is cut short or of an unknown version, is refused with the reason.
pub fn classify(header: &[u8]) -> Result<Classified, String> {
    if header.len() < 4 || &header[..4] != QCOW2_MAGIC {
        return Ok(Classified::Raw);
    }
    if header.len() < 32 {
        return Err("a qcow2 header cut short".into());
    }
    let version = be_u32(header, 4);
    if version != 2 && version != 3 {
        return Err(format!("qcow2 version {version} (vmlet reads 2 and 3)"));
    }
    if be_u64(header, 8) != 0 {
        return Err("a qcow2 disk with a backing file (the image's disk must stand alone)".into());
    }
    if version == 3 {
        if header.len() < HEADER_LEN {
            return Err("a qcow2 version 3 header cut short".into());
        }
        if be_u64(header, 72) & QCOW2_EXTERNAL_DATA_FILE != 0 {
            return Err(
                "a qcow2 disk with an external data file (the image's disk must stand alone)"
                    .into(),
            );
        }
    }
    Ok(Classified::Qcow2 {
        virtual_size: be_u64(header, 24),
    })
}

/// Whether a file name under `/disk/` is one vmlet hands to QEMU as part of a path.
fn plain_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name[0] != b'.'
        && name
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

fn refused(what: impl fmt::Display) -> Error {
    Error::InvalidArgument(format!(
        "vmlet.io/image-type: vm: {what}; a VM-mode image carries exactly one qcow2 or raw disk image (a regular file) under /{DISK_DIR}/"
    ))
}

/// Finds and checks the disk image under `/disk/` of `rootfs` (the container's root file
/// system on the host); returns it with the file, open (read-only), that was checked.
pub fn find(rootfs: &Path) -> Result<(DiskImage, File), Error> {
    let root = crate::host::fd_mount::open_dir(rootfs)
        .map_err(|e| Error::io(format!("open {}", rootfs.display()), e))?;
    let dir = match nix::fcntl::openat(
        &root,
        DISK_DIR,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => {
            return Err(refused(format!("the image has no /{DISK_DIR}/ directory")))
        }
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
            return Err(refused(format!(
                "/{DISK_DIR} in the image is not a directory"
            )))
        }
        Err(e) => {
            return Err(Error::io(
                format!("open /{DISK_DIR} in the image"),
                e.into(),
            ))
        }
    };
    let name = the_one_file(&dir)?;
    let name_str = String::from_utf8_lossy(name.as_bytes()).into_owned();
    let fd = nix::fcntl::openat(
        &dir,
        name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| {
        Error::io(
            format!("open /{DISK_DIR}/{name_str} in the image"),
            e.into(),
        )
    })?;
    let mut file = File::from(fd);
    let stat = nix::sys::stat::fstat(file.as_fd())
        .map_err(|e| Error::io(format!("stat /{DISK_DIR}/{name_str}"), e.into()))?;
    if !is_regular(&stat) {
        return Err(refused(format!(
            "/{DISK_DIR}/{name_str} is not a regular file"
        )));
    }
    let mut header = Vec::with_capacity(HEADER_LEN);
    (&mut file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut header)
        .map_err(|e| Error::io(format!("read /{DISK_DIR}/{name_str}"), e))?;
    let (format, virtual_size) = match classify(&header)
        .map_err(|why| refused(format!("/{DISK_DIR}/{name_str} is {why}")))?
    {
        Classified::Qcow2 { virtual_size } => (DiskFormat::Qcow2, virtual_size),
        Classified::Raw => (DiskFormat::Raw, stat.st_size as u64),
    };
    if virtual_size == 0 {
        return Err(refused(format!("/{DISK_DIR}/{name_str} is empty")));
    }
    Ok((
        DiskImage {
            path: rootfs.join(DISK_DIR).join(&name),
            format,
            virtual_size,
        },
        file,
    ))
}

/// Binds the checked disk `file` read-only onto `name` in the pod's directory `pod_dir`
/// (which QEMU's user may traverse, unlike the container's mounts) and returns that path,
/// the backing file QEMU opens: the file that was checked, whatever happens to the path it
/// was found at. `record` persists the mount point before the mount.
pub fn bind_for_qemu(
    file: &File,
    pod_dir: &Path,
    name: &str,
    record: &dyn Fn(&Path) -> Result<(), Error>,
) -> Result<PathBuf, Error> {
    let target_path = pod_dir.join(name);
    let failed = |e| {
        Error::io(
            format!("bind the image's disk to {}", target_path.display()),
            e,
        )
    };
    let dir = crate::host::fd_mount::open_dir(pod_dir).map_err(failed)?;
    let target = crate::host::fd_mount::create_file_beneath(dir.as_fd(), OsStr::new(name))
        .map_err(failed)?;
    record(&target_path)?;
    crate::host::fd_mount::bind(
        file.as_fd(),
        target.as_fd(),
        true,
        crate::host::fd_mount::Propagation::Private,
    )
    .map_err(failed)?;
    Ok(target_path)
}

fn is_regular(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
}

/// The name of the one regular file in `/disk/`; anything else there is an error.
fn the_one_file(dir: &OwnedFd) -> Result<std::ffi::OsString, Error> {
    let dup = dir
        .try_clone()
        .map_err(|e| Error::io(format!("dup /{DISK_DIR}"), e))?;
    let mut entries = nix::dir::Dir::from_fd(dup)
        .map_err(|e| Error::io(format!("read /{DISK_DIR}"), e.into()))?;
    let mut files = Vec::new();
    for (seen, entry) in entries.iter().enumerate() {
        if seen > MAX_ENTRIES + 2 {
            return Err(refused(format!(
                "/{DISK_DIR}/ has more than {MAX_ENTRIES} entries"
            )));
        }
        let entry = entry.map_err(|e| Error::io(format!("read /{DISK_DIR}"), e.into()))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let shown = String::from_utf8_lossy(name).into_owned();
        let stat = nix::sys::stat::fstatat(
            dir,
            entry.file_name(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| Error::io(format!("stat /{DISK_DIR}/{shown}"), e.into()))?;
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFLNK {
            return Err(refused(format!(
                "/{DISK_DIR}/{shown} is a symbolic link (vmlet follows none in an image)"
            )));
        }
        if kind != SFlag::S_IFREG {
            return Err(refused(format!(
                "/{DISK_DIR}/{shown} is not a regular file"
            )));
        }
        if !plain_name(name) {
            return Err(refused(format!(
                "/{DISK_DIR}/{shown}: a disk image's name is letters, digits, '.', '_' and '-', not starting with '.'"
            )));
        }
        files.push(OsStr::from_bytes(name).to_owned());
    }
    files.sort();
    match files.len() {
        0 => Err(refused(format!(
            "/{DISK_DIR}/ in the image holds no disk image"
        ))),
        1 => Ok(files.remove(0)),
        _ => Err(refused(format!(
            "/{DISK_DIR}/ in the image holds {} files ({})",
            files.len(),
            files
                .iter()
                .map(|f| f.to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The size (bytes) of the overlay for `disk`: the disk's own, or `root_volume_mib` when
/// given, which may not be smaller; neither may be larger than the node's
/// `vm_images.max_root_disk_mib` (`max_mib`): the guest writes its overlay up to that size.
pub fn overlay_size(
    disk: &DiskImage,
    root_volume_mib: Option<u64>,
    max_mib: u64,
) -> Result<u64, Error> {
    let max = max_mib.saturating_mul(1 << 20);
    let disk_mib = disk.virtual_size.div_ceil(1 << 20);
    if disk.virtual_size > max {
        return Err(Error::InvalidArgument(format!(
            "vmlet.io/image-type: vm: the image's disk is {disk_mib} MiB, more than this node allows a root disk (vm_images.max_root_disk_mib = {max_mib})"
        )));
    }
    let Some(mib) = root_volume_mib else {
        return Ok(disk.virtual_size);
    };
    let wanted = mib.checked_mul(1 << 20).ok_or_else(|| {
        Error::InvalidArgument(format!("vmlet.io/root-volume-size: {mib} MiB is too large"))
    })?;
    if wanted < disk.virtual_size {
        return Err(Error::InvalidArgument(format!(
            "vmlet.io/root-volume-size: {mib} MiB is smaller than the image's disk ({disk_mib} MiB); the root volume can grow the disk, not shrink it"
        )));
    }
    if wanted > max {
        return Err(Error::InvalidArgument(format!(
            "vmlet.io/root-volume-size: {mib} MiB is more than this node allows a root disk (vm_images.max_root_disk_mib = {max_mib})"
        )));
    }
    Ok(wanted)
}

/// Creates `overlay` (qcow2, `size` bytes) over `disk` with `qemu-img create`, which is
/// given the backing format and the size, so it neither probes nor opens the image.
pub async fn create_overlay(disk: &DiskImage, overlay: &Path, size: u64) -> Result<(), Error> {
    let size = size.to_string();
    let args: Vec<&OsStr> = vec![
        OsStr::new("create"),
        OsStr::new("-q"),
        OsStr::new("-u"),
        OsStr::new("-f"),
        OsStr::new("qcow2"),
        OsStr::new("-F"),
        OsStr::new(disk.format.as_str()),
        OsStr::new("-b"),
        disk.path.as_os_str(),
        overlay.as_os_str(),
        OsStr::new(&size),
    ];
    let what = format!("create {}", overlay.display());
    host_command::run_tool("qemu-img", &args, QEMU_IMG_DEADLINE, &what).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qcow2_header(version: u32, backing: u64, size: u64, incompatible: u64) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN];
        h[..4].copy_from_slice(QCOW2_MAGIC);
        h[4..8].copy_from_slice(&version.to_be_bytes());
        h[8..16].copy_from_slice(&backing.to_be_bytes());
        h[24..32].copy_from_slice(&size.to_be_bytes());
        h[72..80].copy_from_slice(&incompatible.to_be_bytes());
        h
    }

    #[test]
    fn qcow2_and_raw_are_told_apart() {
        assert_eq!(
            classify(&qcow2_header(3, 0, 1 << 30, 0)),
            Ok(Classified::Qcow2 {
                virtual_size: 1 << 30
            })
        );
        assert_eq!(
            classify(&qcow2_header(2, 0, 5 << 20, 0)[..72]),
            Ok(Classified::Qcow2 {
                virtual_size: 5 << 20
            })
        );
        assert_eq!(classify(b""), Ok(Classified::Raw));
        assert_eq!(classify(b"\xeb\x63\x90 a boot sector"), Ok(Classified::Raw));
    }

    #[test]
    fn a_qcow2_that_names_another_file_is_refused() {
        let err = classify(&qcow2_header(3, 0x200, 1 << 30, 0)).unwrap_err();
        assert!(err.contains("backing file"), "{err}");
        let err = classify(&qcow2_header(3, 0, 1 << 30, QCOW2_EXTERNAL_DATA_FILE)).unwrap_err();
        assert!(err.contains("external data file"), "{err}");
        let err = classify(&qcow2_header(4, 0, 1 << 30, 0)).unwrap_err();
        assert!(err.contains("version 4"), "{err}");
        let err = classify(&qcow2_header(3, 0, 1 << 30, 0)[..40]).unwrap_err();
        assert!(err.contains("cut short"), "{err}");
    }

    #[test]
    fn names_are_plain() {
        assert!(plain_name(b"debian-12.qcow2"));
        assert!(plain_name(b"disk_1.img"));
        for bad in [&b".hidden"[..], b"json:{}", b"a b", b"a,b", b""] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }

    fn rootfs_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(DISK_DIR)).unwrap();
        for (name, content) in files {
            std::fs::write(root.path().join(DISK_DIR).join(name), content).unwrap();
        }
        root
    }

    fn message(err: Error) -> String {
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        err.to_string()
    }

    #[test]
    fn the_one_disk_is_found() {
        let root = rootfs_with(&[("disk.qcow2", &qcow2_header(3, 0, 1 << 30, 0))]);
        let (disk, _) = find(root.path()).unwrap();
        assert_eq!(disk.path, root.path().join("disk/disk.qcow2"));
        assert_eq!(disk.format, DiskFormat::Qcow2);
        assert_eq!(disk.virtual_size, 1 << 30);
        let root = rootfs_with(&[("disk.img", &[0u8; 4096])]);
        let (disk, _) = find(root.path()).unwrap();
        assert_eq!((disk.format, disk.virtual_size), (DiskFormat::Raw, 4096));
    }

    #[test]
    fn no_disk_or_two_disks_are_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("has no /disk/ directory"), "{err}");
        let root = rootfs_with(&[]);
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("holds no disk image"), "{err}");
        let root = rootfs_with(&[("a.qcow2", b"x"), ("b.img", b"y")]);
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("holds 2 files (a.qcow2, b.img)"), "{err}");
        assert!(err.contains("exactly one qcow2 or raw disk image"), "{err}");
    }

    #[test]
    fn symlinks_and_odd_entries_are_refused() {
        let root = rootfs_with(&[]);
        std::os::unix::fs::symlink("/etc/shadow", root.path().join("disk/disk.img")).unwrap();
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("disk.img is a symbolic link"), "{err}");

        let root = tempfile::tempdir().unwrap();
        let elsewhere = rootfs_with(&[("disk.img", b"x")]);
        std::os::unix::fs::symlink(elsewhere.path().join(DISK_DIR), root.path().join(DISK_DIR))
            .unwrap();
        let err = message(find(root.path()).unwrap_err());
        assert!(
            err.contains("/disk in the image is not a directory"),
            "{err}"
        );

        let root = rootfs_with(&[]);
        std::fs::create_dir(root.path().join("disk/sub")).unwrap();
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("/disk/sub is not a regular file"), "{err}");

        let root = rootfs_with(&[("json:{}", b"x")]);
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("letters, digits"), "{err}");

        let root = rootfs_with(&[("disk.qcow2", &qcow2_header(3, 0x200, 1 << 30, 0))]);
        let err = message(find(root.path()).unwrap_err());
        assert!(
            err.contains("/disk/disk.qcow2 is a qcow2 disk with a backing file"),
            "{err}"
        );

        let root = rootfs_with(&[("disk.img", b"")]);
        let err = message(find(root.path()).unwrap_err());
        assert!(err.contains("is empty"), "{err}");
    }

    /// Needs root (as the shim): the checked file is what the pod's directory shows, read-only.
    #[test]
    fn the_checked_file_is_bound_read_only_for_qemu() {
        let root = rootfs_with(&[("disk.img", b"the disk")]);
        let (_, file) = find(root.path()).unwrap();
        let pod = tempfile::tempdir().unwrap();
        let recorded = std::cell::RefCell::new(Vec::new());
        let path = bind_for_qemu(&file, pod.path(), "image-disk", &|t| {
            recorded.borrow_mut().push(t.to_owned());
            Ok(())
        })
        .unwrap();
        assert_eq!(recorded.into_inner(), vec![path.clone()]);
        // The path it was found at changes; the bound file does not.
        std::fs::remove_file(root.path().join("disk/disk.img")).unwrap();
        std::fs::write(root.path().join("disk/disk.img"), b"another").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"the disk");
        let err = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        crate::host::fd_mount::unmount(&path).unwrap();
    }

    #[test]
    fn the_root_volume_grows_but_never_shrinks_the_disk() {
        let disk = DiskImage {
            path: "/x".into(),
            format: DiskFormat::Qcow2,
            virtual_size: 2 << 30,
        };
        let max = 8192;
        assert_eq!(overlay_size(&disk, None, max).unwrap(), 2 << 30);
        assert_eq!(overlay_size(&disk, Some(4096), max).unwrap(), 4 << 30);
        assert_eq!(overlay_size(&disk, Some(8192), max).unwrap(), 8 << 30);
        let err = overlay_size(&disk, Some(1024), max)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("1024 MiB is smaller than the image's disk (2048 MiB)"),
            "{err}"
        );
    }

    #[test]
    fn the_root_disk_is_capped_by_the_node() {
        let disk = DiskImage {
            path: "/x".into(),
            format: DiskFormat::Qcow2,
            virtual_size: 2 << 30,
        };
        let err = overlay_size(&disk, Some(8193), 8192).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(
            err.to_string().contains(
                "vmlet.io/root-volume-size: 8193 MiB is more than this node allows a root disk (vm_images.max_root_disk_mib = 8192)"
            ),
            "{err}"
        );
        let err = overlay_size(&disk, None, 1024).unwrap_err().to_string();
        assert!(
            err.contains("the image's disk is 2048 MiB, more than this node allows a root disk (vm_images.max_root_disk_mib = 1024)"),
            "{err}"
        );
    }

    /// With `qemu-img` (installed by scripts/install-deps): the overlay records the disk
    /// as its backing file and format, has the size asked for, and leaves the disk as it was.
    #[tokio::test]
    async fn the_overlay_is_backed_by_the_disk_and_leaves_it_alone() {
        let root = rootfs_with(&[("disk.img", &[7u8; 1 << 20])]);
        let (disk, _) = find(root.path()).unwrap();
        let overlay = root.path().join("overlay.qcow2");
        create_overlay(&disk, &overlay, 64 << 20).await.unwrap();
        let info = std::process::Command::new("qemu-img")
            .args(["info", "--output=json", "-U"])
            .arg(&overlay)
            .output()
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(info["format"], "qcow2");
        assert_eq!(info["virtual-size"], 64 << 20);
        assert_eq!(info["backing-filename"], disk.path.to_str().unwrap());
        assert_eq!(info["backing-filename-format"], "raw");
        assert_eq!(std::fs::read(&disk.path).unwrap(), vec![7u8; 1 << 20]);

        let err = create_overlay(&disk, &root.path().join("no/such/dir/o.qcow2"), 1 << 20)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("qemu-img create") && err.contains("exited with status"),
            "{err}"
        );
    }
}
