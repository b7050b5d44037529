//! The spec's devices: its raw block devices (`linux.devices` of type `b`) with the access
//! its device cgroup rules give them, and whether it is a privileged container's (a rule
//! allows every device). [`crate::devices::block_devices`] hot-plugs the block devices.

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType, Spec};

use crate::devices::block_devices::BlockDevice;
use crate::Error;

/// The spec's block devices (character devices are the guest's own business).
///
/// A privileged container's spec lists every host device and allows them all (one device
/// cgroup rule allowing everything: `ctr run --privileged`, or CRI without
/// `privileged_without_host_devices`). Those are not attached: the VM is the pod's boundary,
/// and hot-plugging the node's own disks into it is never what a privileged pod means. Its
/// block devices are then none (the shim logs how many it left out).
pub fn block_devices(spec: &Spec) -> Result<Vec<BlockDevice>, Error> {
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
            serial: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let devices = block_devices(&spec).unwrap();
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
                    readonly: false,
                    serial: None,
                },
                BlockDevice {
                    path: "/dev/ro".into(),
                    major: 7,
                    minor: 4,
                    file_mode: 0,
                    uid: 0,
                    gid: 0,
                    readonly: true,
                    serial: None,
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
        assert_eq!(block_devices(&spec).unwrap(), []);
        // A rule allowing one class of devices is no privileged spec.
        let spec: Spec = serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "linux": {
                "devices": [{"path": "/dev/loop3", "type": "b", "major": 7, "minor": 3}],
                "resources": {"devices": [{"allow": true, "type": "b", "access": "rwm"}]}
            }
        }))
        .unwrap();
        assert_eq!(block_devices(&spec).unwrap().len(), 1);
    }

    #[test]
    fn bad_spec_devices_are_named() {
        let spec: Spec = serde_json::from_value(json!({
            "ociVersion": "1.0.2",
            "linux": {"devices": [{"path": "/dev/x", "type": "b", "major": -2, "minor": 0}]}
        }))
        .unwrap();
        let err = block_devices(&spec).unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
        assert_eq!(
            err.message(),
            "block device /dev/x: major number -2 is out of range"
        );
    }
}
