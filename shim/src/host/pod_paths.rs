//! Where one pod's files live under the node's state directory, and its domain's name.

use std::path::{Path, PathBuf};

use crate::host::share;
use crate::Error;

/// Checks a pod id (given on the command line, or read as a name on the node) before it names a path: containerd's
/// identifier rules (letters and digits, single `.`, `_` or `-` between them, at most 76).
pub fn check_pod_id(id: &str) -> Result<(), Error> {
    let well_formed = !id.is_empty()
        && id.len() <= 76
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric())
        && !id
            .as_bytes()
            .windows(2)
            .any(|w| b"._-".contains(&w[0]) && b"._-".contains(&w[1]));
    if well_formed {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "pod id {id:?}: expected a containerd id (letters, digits and single '.', '_' \
             or '-' between them, at most 76 characters)"
        )))
    }
}

pub fn domain_name(pod_id: &str) -> String {
    format!("vmlet-{pod_id}")
}

/// The paths of one pod's state directory.
#[derive(Debug, Clone)]
pub struct PodPaths {
    pub dir: PathBuf,
    pub share: PathBuf,
    pub vhost_socket: PathBuf,
    pub vsock_uds: PathBuf,
    pub console: PathBuf,
    pub vsock_log: PathBuf,
    pub tap_socket: PathBuf,
    pub qmp_socket: PathBuf,
    /// The vhost-user socket of the pod's virtiofsd, which the shim starts.
    pub share_socket: PathBuf,
    /// QEMU's output under `launcher = "direct"`, and virtiofsd's, in the log tmpfs.
    pub qemu_log: PathBuf,
    pub virtiofsd_log: PathBuf,
    /// The agent's key, for QEMU to read as it starts (removed once it has).
    pub agent_key: PathBuf,
    /// A VM image's serial console, which QEMU connects.
    pub console_socket: PathBuf,
    /// Where the node's operator types into a VM image's console (`vmletctl console -i`).
    pub console_input: PathBuf,
    /// A VM image's QEMU guest agent port, which QEMU connects.
    pub guest_agent_socket: PathBuf,
    /// A VM image's disk (the overlay's backing file), bound read-only here, where QEMU's
    /// user can reach it.
    pub image_disk: PathBuf,
    /// A VM image's cloud-init seed: its files, and their ISO 9660 volume.
    pub seed_dir: PathBuf,
    pub seed_iso: PathBuf,
    /// A VM image's copy of OVMF's variable store, when the shim starts its QEMU itself
    /// (libvirt keeps its own).
    pub uefi_vars: PathBuf,
}

/// A VM image's root disk, the qcow2 overlay its guest writes, in the pod's directory under
/// the node's `vm_images.disk_dir` ([`disk_dir`]), never the state directory.
pub const ROOT_DISK: &str = "root.qcow2";

/// The directory of a VM-image pod's root disk under the node's `vm_images.disk_dir`.
pub fn disk_dir(disks: &Path, pod_id: &str) -> PathBuf {
    disks.join(pod_id)
}

/// The name of [`PodPaths::image_disk`] in the pod's directory.
pub const IMAGE_DISK: &str = "image-disk";

impl PodPaths {
    pub fn new(state_dir: &Path, pod_id: &str) -> Self {
        let dir = state_dir.join(pod_id);
        let log = crate::host::log_dir::path(&dir);
        Self {
            share: dir.join(share::SHARE_DIR),
            vhost_socket: dir.join("vhost-vsock.sock"),
            vsock_uds: dir.join("vsock.sock"),
            console: log.join("console.log"),
            vsock_log: log.join("vhost-device-vsock.log"),
            tap_socket: dir.join("taps.sock"),
            qmp_socket: dir.join("qmp.sock"),
            share_socket: dir.join("virtiofsd.sock"),
            qemu_log: log.join("qemu.log"),
            virtiofsd_log: log.join("virtiofsd.log"),
            agent_key: dir.join("agent.key"),
            console_socket: dir.join("console.sock"),
            console_input: dir.join("console-input.sock"),
            guest_agent_socket: dir.join("qga.sock"),
            image_disk: dir.join(IMAGE_DISK),
            seed_dir: dir.join("seed"),
            seed_iso: dir.join("seed.iso"),
            uefi_vars: dir.join("uefi-vars.fd"),
            dir,
        }
    }
}

/// Gives the state directory `dir` (root's) mode 0711 again where it has another: made
/// before any shim ran (by the kubelet for the metrics DaemonSet's mount, after a reboot
/// emptied `/run`), it would let every user list the pods. Never through a link; a
/// directory of another owner is refused (whoever owns it could change what the pods' paths
/// name).
pub fn close_state_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?;
    let meta = file.metadata()?;
    if meta.uid() != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("the state directory is uid {}'s, not root's", meta.uid()),
        ));
    }
    if meta.mode() & 0o7777 != 0o711 {
        file.set_permissions(std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

/// Makes `dir` and its missing parents, each new one root's with mode 0711 (whatever the
/// umask): every user may pass through them (to the sockets handed to a pod's QEMU), nobody
/// lists them. Directories already there are left as they are.
pub fn make_passable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))?,
            // Another shim made it meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes `dir` (mode 0700), or checks that the one there is a directory of the shim's
/// user closed to others.
pub fn make_private_dir(dir: &Path) -> Result<(), crate::Error> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(dir)
                .map_err(|e| crate::Error::io(format!("stat {}", dir.display()), e))?;
            if !meta.is_dir()
                || meta.uid() != nix::unistd::geteuid().as_raw()
                || meta.mode() & 0o077 != 0
            {
                return Err(crate::Error::FailedPrecondition(format!(
                    "{} must be a directory of the shim's user closed to others",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) => Err(crate::Error::io(format!("create {}", dir.display()), e)),
    }
}

#[cfg(test)]
mod passable_tests {
    #[test]
    fn the_state_directory_is_closed_again() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        super::close_state_dir(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o711);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(super::close_state_dir(&link).is_err());
    }

    #[test]
    fn new_directories_are_0711_whatever_the_umask_and_old_ones_are_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let old = mode(dir.path());
        let deep = dir.path().join("a/b");
        super::make_passable(&deep).unwrap();
        assert_eq!(mode(&dir.path().join("a")), 0o711);
        assert_eq!(mode(&deep), 0o711);
        assert_eq!(mode(dir.path()), old);
        super::make_passable(&deep).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ids_are_containerd_ids() {
        for good in ["a", "pod-1", "0f3c.a_b", &"x".repeat(76)] {
            check_pod_id(good).unwrap();
        }
        for bad in [
            "",
            "..",
            "a/b",
            "../x",
            "-a",
            "a-",
            "a..b",
            " a",
            &"x".repeat(77),
        ] {
            let err = check_pod_id(bad).unwrap_err().message();
            assert!(err.contains("pod id"), "{err}");
        }
    }
}
