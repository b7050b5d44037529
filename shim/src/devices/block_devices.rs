//! Raw block devices of the OCI spec (`linux.devices` of type `b`, as Kubernetes
//! `volumeDevices` produce), hot-plugged into the pod's VM with the pod's disk driver.
//!
//! The shim opens the host device itself (QEMU runs as an unprivileged user that may not)
//! and [`crate::devices::hotplug`] hands the fd to QEMU: `virtio-blk-pci` (`vdX`) or `nvme`
//! (`nvmeXn1`) on one of the domain's hot-plug root ports (made here, [`qemu_args`]), or
//! `scsi-hd` (`sdX`) behind one `virtio-scsi-pci` controller. Each device gets a serial by
//! which the agent finds it in the guest. The same path serves the pod's first container
//! and containers created later in the running pod.

use std::os::fd::OwnedFd;
use std::path::Path;

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType, Spec};

use crate::Error;

use crate::devices::pci_layout::{FIRST_HOTPLUG_PORT, HOTPLUG_PORTS};

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
}

/// The spec's block devices (character devices are the guest's own business).
///
/// A privileged container's spec lists every host device and allows them all (one device
/// cgroup rule allowing everything: `ctr run --privileged`, or CRI without
/// `privileged_without_host_devices`). Those are not attached: the VM is the pod's boundary,
/// and hot-plugging the node's own disks into it is never what a privileged pod means. Its
/// block devices are then none (the shim logs how many it left out).
pub fn from_spec(spec: &Spec) -> Result<Vec<BlockDevice>, Error> {
    let Some(linux) = spec.linux() else {
        return Ok(Vec::new());
    };
    let rules = device_rules(spec);
    if rules.iter().any(allows_every_device) {
        let left_out = linux
            .devices()
            .iter()
            .flatten()
            .filter(|d| d.typ() == LinuxDeviceType::B)
            .count();
        if left_out > 0 {
            log::info!(
                "privileged container (every device allowed): its {left_out} host block \
                 devices are not attached to the VM"
            );
        }
        return Ok(Vec::new());
    }
    let mut devices = Vec::new();
    for d in linux.devices().iter().flatten() {
        if d.typ() != LinuxDeviceType::B {
            continue;
        }
        let path = d.path().to_string_lossy().into_owned();
        let number = |n: i64, what: &str| {
            u32::try_from(n).map_err(|_| {
                Error::InvalidArgument(format!(
                    "block device {path}: {what} number {n} is out of range"
                ))
            })
        };
        if !path.starts_with('/') {
            return Err(Error::InvalidArgument(format!(
                "block device path {path:?} is not absolute"
            )));
        }
        let (major, minor) = (number(d.major(), "major")?, number(d.minor(), "minor")?);
        devices.push(BlockDevice {
            readonly: writes_denied(&rules, major, minor),
            path,
            major,
            minor,
            file_mode: d.file_mode().unwrap_or(0),
            uid: d.uid().unwrap_or(0),
            gid: d.gid().unwrap_or(0),
        });
    }
    Ok(devices)
}

/// Whether the spec is a privileged container's: a device cgroup rule allows every device.
/// Its container then gets every device node of the guest, as runc gives a privileged
/// container the host's.
pub fn every_device_allowed(spec: &Spec) -> bool {
    device_rules(spec).iter().any(allows_every_device)
}

fn device_rules(spec: &Spec) -> Vec<LinuxDeviceCgroup> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.devices().clone())
        .unwrap_or_default()
}

/// The rule privileged specs carry: allow every device, all access.
fn allows_every_device(rule: &LinuxDeviceCgroup) -> bool {
    rule.allow()
        && matches!(rule.typ(), None | Some(LinuxDeviceType::A))
        && rule.major().is_none()
        && rule.minor().is_none()
        && rule.access().as_deref().is_none_or(|a| a.contains("rwm"))
}

/// Whether the device cgroup rules (the last matching one wins, as in runc) deny writing
/// to block device `major:minor`. Without a rule about writes the device is writable.
fn writes_denied(rules: &[LinuxDeviceCgroup], major: u32, minor: u32) -> bool {
    let mut allowed = None;
    for rule in rules {
        let typ_matches = matches!(
            rule.typ(),
            None | Some(LinuxDeviceType::A) | Some(LinuxDeviceType::B)
        );
        let number_matches =
            |n: Option<i64>, ours: u32| n.is_none_or(|n| n < 0 || n == i64::from(ours));
        let writes = rule.access().as_deref().is_none_or(|a| a.contains('w'));
        if typ_matches
            && number_matches(rule.major(), major)
            && number_matches(rule.minor(), minor)
            && writes
        {
            allowed = Some(rule.allow());
        }
    }
    allowed == Some(false)
}

/// Opens the host's block device `major:minor` (found through sysfs), read-only or not.
pub fn open_host(device: &BlockDevice) -> Result<OwnedFd, Error> {
    open_host_in(Path::new("/sys/dev/block"), Path::new("/dev"), device)
}

fn open_host_in(sys: &Path, dev: &Path, device: &BlockDevice) -> Result<OwnedFd, Error> {
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
    Ok(OwnedFd::from(file))
}

/// QEMU arguments for vmlet's QMP monitor (a client of `qmp_socket`) and the hot-plug
/// root ports.
pub fn qemu_args(qmp_socket: &str) -> Vec<String> {
    let mut args = vec![
        "-chardev".to_string(),
        format!("socket,id=vmlet-qmp,path={qmp_socket}"),
        "-mon".to_string(),
        "chardev=vmlet-qmp,mode=control".to_string(),
    ];
    for i in 0..HOTPLUG_PORTS {
        args.push("-device".into());
        args.push(format!(
            "pcie-root-port,id={},bus=pcie.0,addr={},chassis={},port={:#x}",
            port_id(i),
            crate::devices::pci_layout::hex(FIRST_HOTPLUG_PORT + i),
            200 + i,
            0x20 + i
        ));
    }
    args
}

/// The id of hot-plug root port `i`.
pub(crate) fn port_id(i: usize) -> String {
    format!("vmlet-hp{i}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

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
        }
    }

    #[test]
    fn spec_block_devices_with_their_cgroup_access() {
        let spec: Spec = serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "linux": {
                "devices": [
                    {"path": "/dev/xvda", "type": "b", "major": 7, "minor": 3, "fileMode": 432, "gid": 6},
                    {"path": "/dev/ro", "type": "b", "major": 7, "minor": 4},
                    {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}
                ],
                "resources": {"devices": [
                    {"allow": false, "access": "rwm"},
                    {"allow": true, "type": "b", "major": 7, "minor": 3, "access": "rwm"},
                    {"allow": true, "type": "b", "major": 7, "minor": 4, "access": "r"}
                ]}
            }
        }))
        .unwrap();
        let devices = from_spec(&spec).unwrap();
        assert_eq!(
            devices,
            [
                BlockDevice {
                    path: "/dev/xvda".into(),
                    major: 7,
                    minor: 3,
                    file_mode: 0o660,
                    uid: 0,
                    gid: 6,
                    readonly: false
                },
                BlockDevice {
                    path: "/dev/ro".into(),
                    major: 7,
                    minor: 4,
                    file_mode: 0,
                    uid: 0,
                    gid: 0,
                    readonly: true
                },
            ]
        );
    }

    #[test]
    fn a_privileged_spec_s_host_devices_are_not_attached() {
        let spec: Spec = serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "linux": {
                "devices": [
                    {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0},
                    {"path": "/dev/loop3", "type": "b", "major": 7, "minor": 3}
                ],
                "resources": {"devices": [{"allow": true, "access": "rwm"}]}
            }
        }))
        .unwrap();
        assert_eq!(from_spec(&spec).unwrap(), []);
        // A rule allowing one class of devices is no privileged spec.
        let spec: Spec = serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "linux": {
                "devices": [{"path": "/dev/loop3", "type": "b", "major": 7, "minor": 3}],
                "resources": {"devices": [{"allow": true, "type": "b", "access": "rwm"}]}
            }
        }))
        .unwrap();
        assert_eq!(from_spec(&spec).unwrap().len(), 1);
    }

    #[test]
    fn bad_spec_devices_are_named() {
        let spec: Spec = serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "linux": {"devices": [{"path": "/dev/x", "type": "b", "major": -2, "minor": 0}]}
        }))
        .unwrap();
        let err = from_spec(&spec).unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
        assert_eq!(
            err.message(),
            "block device /dev/x: major number -2 is out of range"
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
