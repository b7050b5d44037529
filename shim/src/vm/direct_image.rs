//! A VM image's files opened by the shim for the QEMU it starts itself
//! ([`super::direct_start`]): the root disk (its overlay, or its root volume's block
//! device), the image's disk beneath the overlay, the cloud-init seed, and for
//! `vmlet.io/firmware: uefi` OVMF's code and the pod's own copy of its variable store
//! ([`crate::vmm::uefi_firmware`]). QEMU inherits each as a descriptor
//! ([`crate::vmm::qemu_image`]): it opens none by path, so its view of the node
//! ([`crate::host::qemu_view`]) needs neither the node's disk directory nor its `/dev`.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::host::pod_paths::PodPaths;
use crate::vmm::qemu_image::{ImageFds, UefiFds};
use crate::vmm::uefi_firmware;
use crate::vmm::vm_spec::ImageDisks;
use crate::Error;

/// The most bytes of a UEFI variable store copied for a pod (OVMF's are 128 KiB to
/// 4 MiB): the pod's directory is in `/run`.
const MAX_VARS: u64 = 16 << 20;

/// The descriptors of `image`'s files (for a VM of `machine`), and the files that hold them
/// open until QEMU has its copies.
pub(super) fn open(
    image: &ImageDisks,
    machine: &str,
    paths: &PodPaths,
) -> Result<(ImageFds, Vec<OwnedFd>), Error> {
    let root = match &image.root_volume {
        Some(volume) => open_block_device(Path::new(&volume.device), volume.rdev)?,
        None => open_file(Path::new(&image.overlay), true)?,
    };
    let backing = match image.root_volume {
        Some(_) => None,
        None => Some(open_file(Path::new(&image.backing), false)?),
    };
    let seed = open_file(Path::new(&image.seed), false)?;
    let uefi = match image.firmware {
        vmlet_config::Firmware::Bios => None,
        vmlet_config::Firmware::Uefi => {
            let dirs = uefi_firmware::DESCRIPTOR_DIRS.map(Path::new);
            let firmware = uefi_firmware::find(&dirs, machine)?;
            log::debug!(
                "OVMF from {}: {}",
                firmware.descriptor.display(),
                firmware.code.display()
            );
            let named = |e: Error| {
                e.within(&format!(
                    "vmlet.io/firmware: uefi: OVMF as {} names it",
                    firmware.descriptor.display()
                ))
            };
            let code = open_node_file(&firmware.code).map_err(named)?;
            let vars = copy_vars(&firmware.vars_template, &paths.uefi_vars).map_err(named)?;
            Some((code, vars))
        }
    };
    let fds = ImageFds {
        root: root.as_raw_fd(),
        backing: backing.as_ref().map(AsRawFd::as_raw_fd),
        seed: seed.as_raw_fd(),
        uefi: uefi.as_ref().map(|(code, vars)| UefiFds {
            code: code.as_raw_fd(),
            vars: vars.as_raw_fd(),
        }),
    };
    let mut files: Vec<OwnedFd> = vec![root.into(), seed.into()];
    files.extend(backing.map(OwnedFd::from));
    if let Some((code, vars)) = uefi {
        files.extend([OwnedFd::from(code), OwnedFd::from(vars)]);
    }
    Ok((fds, files))
}

/// The regular file at `path` (in the pod's directories), read-write or read-only; never
/// through a link.
fn open_file(path: &Path, write: bool) -> Result<File, Error> {
    regular(path, write, libc::O_NOFOLLOW)
}

/// The node's regular file at `path` (a firmware image a descriptor names, which a
/// distribution may keep behind a link), read-only.
fn open_node_file(path: &Path) -> Result<File, Error> {
    regular(path, false, 0)
}

/// The regular file at `path`, opened with `flags` besides; nothing else (a FIFO or a device
/// at the path does not block the open, and is refused).
fn regular(path: &Path, write: bool, flags: i32) -> Result<File, Error> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let is_file = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
        .is_file();
    if !is_file {
        return Err(Error::FailedPrecondition(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// The root volume's device node, read-write: the device `rdev` (`major:minor`) still.
fn open_block_device(path: &Path, rdev: (u32, u32)) -> Result<File, Error> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(format!("open the root volume {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    let (major, minor) = rdev;
    if !meta.file_type().is_block_device() || meta.rdev() != libc::makedev(major, minor) {
        return Err(Error::FailedPrecondition(format!(
            "the root volume {} is no longer the block device {major}:{minor} the pod names",
            path.display()
        )));
    }
    Ok(file)
}

/// A new copy of the variable store `template` at `to` (root's, 0600), open read-write.
fn copy_vars(template: &Path, to: &Path) -> Result<File, Error> {
    let mut source = open_node_file(template)?;
    let mut copy = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(to)
        .map_err(|e| Error::io(format!("create {}", to.display()), e))?;
    let copied = std::io::copy(&mut (&mut source).take(MAX_VARS + 1), &mut copy).map_err(|e| {
        Error::io(
            format!("copy {} to {}", template.display(), to.display()),
            e,
        )
    })?;
    if copied > MAX_VARS {
        return Err(Error::FailedPrecondition(format!(
            "the UEFI variable store {} is larger than {} MiB",
            template.display(),
            MAX_VARS >> 20
        )));
    }
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_store_is_a_private_copy_and_a_link_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let template = dir.path().join("VARS.fd");
        std::fs::write(&template, vec![7u8; 4096]).unwrap();
        let to = dir.path().join("uefi-vars.fd");
        copy_vars(&template, &to).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), vec![7u8; 4096]);
        let mode = std::fs::metadata(&to).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Made anew: a file (or a link) already there is refused.
        assert!(copy_vars(&template, &to).is_err());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&template, &link).unwrap();
        assert!(open_file(&link, false).is_err());
        assert!(open_file(dir.path(), false).is_err());
        assert!(open_block_device(&template, (7, 0)).is_err());
        // A FIFO is refused, without blocking.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(open_file(&fifo, false).is_err());
        // A node's firmware behind a link is followed.
        assert!(open_node_file(&link).is_ok());
    }
}
