//! A VM image's root on a block volume (docs/vm-mode.md, "Persistent root"): the pod names
//! one of its block volumes with `vmlet.io/root-volume`, and its VM boots from that volume
//! instead of an overlay on the node's disk.
//!
//! The volume's first MiB is vmlet's: a header line that says the image was copied. The
//! first pod finds none, checks that the volume holds the image, copies the image's disk
//! onto it after that MiB (`qemu-img convert`, the image's checked format in, raw out) and
//! then writes the header; every later pod finds the header and boots the volume as it is,
//! whatever image it names. A copy cut short leaves no header, and the next pod copies again.
//! The guest sees the volume from the MiB on as a raw disk: nothing on it is ever read as a
//! format (a qcow2 header the pod's user wrote there names no host file), and the guest
//! cannot reach the header. The image's own disk is only read.
//!
//! `qemu-img`, which parses the image (the pod author's bytes), runs as the pod's own user
//! in the pod's cgroup, in a view of the node's files of its own
//! ([`crate::host::qemu_view`]): the pod's directory (where the image's disk is bound) and,
//! in a `/dev` of its own, a node of the volume alone, the pod user's; every mount read-only.
//! It opens no other disk of the node, and nothing of another pod.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::devices::block_devices::BlockDevice;
use crate::host::host_command::{self, ToolConfinement};
use crate::vm_mode::vm_disk::DiskImage;
use crate::Error;

/// Where the guest's disk starts on the volume.
pub const OFFSET: u64 = 1 << 20;
/// The header of a volume that holds a copied image.
const HEADER: &[u8] = b"vmlet persistent root v1\n";
/// How long copying the image may take.
const COPY_DEADLINE: Duration = Duration::from_secs(600);
/// How long reading or writing the header (and the device's size) may take.
const DEVICE_DEADLINE: Duration = Duration::from_secs(30);
const SECTOR: u64 = 512;
/// The volume's node in `qemu-img`'s view (its `/dev`).
const VOLUME_NODE: &str = "vmlet-root-volume";

/// The volume, ready to boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The host's device node.
    pub device: PathBuf,
    /// The guest's disk: the volume from [`OFFSET`] on.
    pub size: u64,
    /// Whether this pod copied the image onto it.
    pub copied: bool,
}

/// Fails a copy of the image's disk `disk` that the pod's own user could not read: a disk
/// that is not world-readable.
fn check_copyable(disk: &DiskImage) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::metadata(&disk.path)
        .map_err(|e| Error::io(format!("stat {}", disk.path.display()), e))?
        .mode();
    match mode & 0o004 {
        0 => Err(Error::FailedPrecondition(format!(
            "vmlet.io/root-volume: the image's disk under /disk is mode {:04o}: it is copied \
             onto the volume as the pod's own user, so it must be readable by others (e.g. \
             0644)",
            mode & 0o7777
        ))),
        _ => Ok(()),
    }
}

/// Makes `volume` a root for `disk`: copies the image unless the volume says it holds one,
/// `qemu-img` confined by `copy_as` (whose view gets the volume's node).
pub async fn prepare(
    volume: &BlockDevice,
    disk: &DiskImage,
    copy_as: ToolConfinement,
) -> Result<Prepared, Error> {
    let (device, fd) = crate::devices::block_devices::open_host_node(volume)?;
    let what = format!("the root volume {} ({})", volume.path, device.display());
    let file = File::from(fd);
    let rdev = nix::sys::stat::fstat(&file)
        .map_err(|e| Error::io(format!("stat {what}"), e.into()))?
        .st_rdev;
    // Whole sectors: QEMU's raw driver takes no other size.
    let image = disk.virtual_size.div_ceil(SECTOR) * SECTOR;
    let (file, end, has_header) = on_device(&what, move || {
        let mut file = file;
        let end = file.seek(SeekFrom::End(0))?;
        let mut header = vec![0u8; HEADER.len()];
        file.read_exact_at(&mut header, 0)?;
        Ok((file, end, header == HEADER))
    })
    .await?;
    let Some(size) = end.checked_sub(OFFSET).filter(|s| *s > 0) else {
        return Err(too_small(&what, end, image));
    };
    if has_header {
        return Ok(Prepared {
            device,
            size,
            copied: false,
        });
    }
    if size < image {
        return Err(too_small(&what, end, image));
    }
    check_copyable(disk)?;
    let copy_as = ToolConfinement {
        view: copy_as
            .view
            .with_block_device(VOLUME_NODE, rdev, copy_as.uid)?,
        ..copy_as
    };
    copy(disk, image, &what, copy_as).await?;
    on_device(&what, move || {
        file.write_all_at(HEADER, 0)?;
        file.sync_all()
    })
    .await?;
    Ok(Prepared {
        device,
        size,
        copied: true,
    })
}

/// `work` on the device, on a thread of its own, within [`DEVICE_DEADLINE`] (a device that
/// hangs fails the start instead of holding the shim).
async fn on_device<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    match tokio::time::timeout(DEVICE_DEADLINE, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(Ok(done))) => Ok(done),
        Ok(Ok(Err(e))) => Err(Error::io(format!("read or write {what}"), e)),
        Ok(Err(e)) => Err(Error::Internal(format!("{what}: {e}"))),
        Err(_) => Err(Error::Timeout(format!(
            "{what} did not answer within {DEVICE_DEADLINE:?}"
        ))),
    }
}

fn too_small(what: &str, end: u64, image: u64) -> Error {
    Error::FailedPrecondition(format!(
        "{what} holds {end} bytes: the image's disk ({image} bytes) and vmlet's first MiB need {}",
        image.saturating_add(OFFSET)
    ))
}

/// The image's disk, as the guest sees it, onto the volume (`/dev/VOLUME_NODE` in
/// `copy_as`'s view) from [`OFFSET`] on.
async fn copy(
    disk: &DiskImage,
    size: u64,
    what: &str,
    copy_as: ToolConfinement,
) -> Result<(), Error> {
    let target = format!(
        "driver=raw,offset={OFFSET},size={size},file.driver=host_device,file.filename=/dev/{VOLUME_NODE}"
    );
    let args: Vec<&OsStr> = vec![
        OsStr::new("convert"),
        OsStr::new("-q"),
        OsStr::new("-f"),
        OsStr::new(disk.format.as_str()),
        OsStr::new("-n"),
        disk.path.as_os_str(),
        OsStr::new("--target-image-opts"),
        OsStr::new(&target),
    ];
    host_command::run_confined_tool(
        "qemu-img",
        &args,
        COPY_DEADLINE,
        &format!("copy the image onto {what}"),
        copy_as,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm_mode::vm_disk::DiskFormat;

    #[test]
    fn a_disk_only_root_reads_is_refused_by_its_mode_before_a_copy() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let disk = DiskImage {
            path: dir.path().join("disk.img"),
            format: DiskFormat::Raw,
            virtual_size: 512,
        };
        std::fs::write(&disk.path, [0u8; 512]).unwrap();
        let chmod = |mode| {
            std::fs::set_permissions(&disk.path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        chmod(0o600);
        let err = check_copyable(&disk).unwrap_err();
        assert!(
            matches!(err, Error::FailedPrecondition(_)) && err.message().contains("mode 0600"),
            "{err}"
        );
        chmod(0o644);
        check_copyable(&disk).unwrap();
    }
}
