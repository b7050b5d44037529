//! Raw block devices of the OCI spec (`linux.devices` of type `b`, as Kubernetes
//! `volumeDevices` produce; read by [`crate::spec::devices`]), hot-plugged into the pod's VM
//! with the pod's disk driver.
//!
//! The shim opens the host device itself (QEMU runs as an unprivileged user that may not)
//! and [`crate::devices::hotplug`] hands the fd to QEMU: `virtio-blk-pci` (`vdX`) or `nvme`
//! (`nvmeXn1`) on one of the domain's hot-plug root ports (named here, [`port_id`]), or
//! `scsi-hd` (`sdX`) behind one `virtio-scsi-pci` controller. Each device gets a serial by
//! which the agent finds it in the guest. The same path serves the pod's first container
//! and containers created later in the running pod.

use std::os::fd::OwnedFd;
use std::path::Path;

use crate::Error;

/// One block device the container asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Where the node goes in the container.
    pub path: String,
    /// The host device's numbers.
    pub major: u32,
    pub minor: u32,
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The spec's device cgroup rules deny writes to it.
    pub readonly: bool,
    /// The serial the guest sees it by; none: vmlet's own (`vmletN`), which the agent
    /// looks for. A VM image's disks are named by their path ([`BlockDevice::named`]).
    pub serial: Option<String>,
}

/// The longest serial every disk driver carries whole (virtio-blk's and NVMe's 20 bytes).
pub const MAX_SERIAL: usize = 20;

impl BlockDevice {
    /// The device as a VM image's own disk (docs/vm-mode.md): its serial is the last part
    /// of its path in the container (a Kubernetes `volumeDevice`'s `devicePath`:
    /// `/dev/data` is `data`), which the guest finds under `/dev/disk/by-id/`. A name the
    /// serial cannot carry is INVALID_ARGUMENT, naming the path.
    pub fn named(mut self) -> Result<Self, Error> {
        let name = self.path.rsplit('/').next().unwrap_or_default();
        let plain = !name.is_empty()
            && !name.starts_with("vmlet")
            && name.len() <= MAX_SERIAL
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !plain {
            return Err(Error::InvalidArgument(format!(
                "block device {:?} of a VM-mode pod: the guest finds it by its path's last part, which must be 1 to {MAX_SERIAL} letters, digits, '.', '_' or '-' (not starting with '.', nor with vmlet, whose names are vmlet's own disks')",
                self.path
            )));
        }
        self.serial = Some(name.to_owned());
        Ok(self)
    }
}

/// [`BlockDevice::named`] for each of a VM image's devices; two with one name are
/// INVALID_ARGUMENT, naming both paths.
pub fn named(devices: &[BlockDevice]) -> Result<Vec<BlockDevice>, Error> {
    let mut named: Vec<BlockDevice> = Vec::new();
    for device in devices {
        let device = device.clone().named()?;
        if let Some(other) = named.iter().find(|d| d.serial == device.serial) {
            return Err(Error::InvalidArgument(format!(
                "block devices {:?} and {:?} of a VM-mode pod end in the same name, by which the guest would find both",
                other.path, device.path
            )));
        }
        named.push(device);
    }
    Ok(named)
}

/// Opens the host's block device `major:minor` (found through sysfs), read-only or not.
pub fn open_host(device: &BlockDevice) -> Result<OwnedFd, Error> {
    open_host_node(device).map(|(_, fd)| fd)
}

/// [`open_host`], with the device node's path on the host (`/dev/NAME`, checked to be
/// that device as it was opened).
pub fn open_host_node(device: &BlockDevice) -> Result<(std::path::PathBuf, OwnedFd), Error> {
    open_host_in(Path::new("/sys/dev/block"), Path::new("/dev"), device)
}

fn open_host_in(
    sys: &Path,
    dev: &Path,
    device: &BlockDevice,
) -> Result<(std::path::PathBuf, OwnedFd), Error> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let what = format!(
        "host block device {}:{} (for {} in the container)",
        device.major, device.minor, device.path
    );
    let uevent = sys
        .join(format!("{}:{}", device.major, device.minor))
        .join("uevent");
    let text = std::fs::read_to_string(&uevent).map_err(|_| Error::NotFound(what.clone()))?;
    let name = text
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .ok_or_else(|| Error::Internal(format!("{} names no DEVNAME", uevent.display())))?;
    let node = dev.join(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(!device.readonly)
        .custom_flags(libc::O_CLOEXEC)
        .open(&node)
        .map_err(|e| Error::io(format!("open {} ({what})", node.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", node.display()), e))?;
    let rdev = nix::sys::stat::makedev(device.major.into(), device.minor.into());
    if !meta.file_type().is_block_device() || meta.rdev() != rdev {
        return Err(Error::FailedPrecondition(format!(
            "{} is not {what}",
            node.display()
        )));
    }
    Ok((node, OwnedFd::from(file)))
}

/// The id of hot-plug root port `i`.
pub(crate) fn port_id(i: usize) -> String {
    format!("vmlet-hp{i}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A device of the spec (7:3, mode 0660, group 6) at `path`.
    pub(crate) fn device(path: &str, readonly: bool) -> BlockDevice {
        BlockDevice {
            path: path.into(),
            major: 7,
            minor: 3,
            file_mode: 0o660,
            uid: 0,
            gid: 6,
            readonly,
            serial: None,
        }
    }

    #[test]
    fn a_vm_images_device_is_named_by_its_paths_last_part() {
        let two = named(&[device("/dev/xvda", false), device("/dev/disk/data-1", true)]).unwrap();
        assert_eq!(two[0].serial.as_deref(), Some("xvda"));
        assert_eq!(two[1].serial.as_deref(), Some("data-1"));
        for bad in [
            "/dev/",
            "/dev/.hidden",
            "/dev/a b",
            "/dev/twenty-one-characters",
            "/dev/vmlet-root",
        ] {
            let err = device(bad, false).named().unwrap_err();
            assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        let err = named(&[device("/dev/a/data", false), device("/dev/b/data", false)]).unwrap_err();
        assert!(
            err.to_string()
                .contains("\"/dev/a/data\" and \"/dev/b/data\""),
            "{err}"
        );
    }

    #[test]
    fn a_device_missing_on_the_node_is_not_found() {
        let err = open_host_in(
            Path::new("/nonexistent"),
            Path::new("/dev"),
            &device("/dev/xvda", false),
        )
        .unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::NOT_FOUND);
        assert_eq!(
            err.message(),
            "host block device 7:3 (for /dev/xvda in the container) not found"
        );
    }

    #[test]
    fn the_node_found_must_be_the_device() {
        let sys = std::env::temp_dir().join(format!("vmlet-sysdev-{}", std::process::id()));
        std::fs::create_dir_all(sys.join("7:3")).unwrap();
        std::fs::write(sys.join("7:3/uevent"), "MAJOR=7\nMINOR=3\nDEVNAME=null\n").unwrap();
        let err = open_host_in(&sys, Path::new("/dev"), &device("/dev/xvda", true)).unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert_eq!(
            err.message(),
            "/dev/null is not host block device 7:3 (for /dev/xvda in the container)"
        );
        std::fs::remove_dir_all(&sys).unwrap();
    }
}
