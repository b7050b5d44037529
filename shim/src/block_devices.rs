//! Raw block devices of the OCI spec (`linux.devices` of type `b`, as Kubernetes
//! `volumeDevices` produce), hot-plugged into the pod's VM with the pod's disk driver.
//!
//! The shim opens the host device itself (QEMU runs as an unprivileged user that may not)
//! and hands the fd to QEMU over vmlet's QMP monitor ([`crate::qmp`]): `add-fd`, a
//! `host_device` block node on `/dev/fdset/N`, then the device: `virtio-blk-pci` (`vdX`)
//! or `nvme` (`nvmeXn1`) on one of the domain's hot-plug root ports, or `scsi-hd` (`sdX`)
//! behind one `virtio-scsi-pci` controller, itself plugged when the first SCSI disk comes.
//! Each device gets a serial by which the agent finds it in the guest. The same path serves
//! the pod's first container and containers created later in the running pod.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType, Spec};
use serde_json::{json, Value};
use vmlet_config::DiskDriver;

use crate::qmp::Qmp;
use crate::Error;

/// Hot-plug root ports each VM gets (each PCI disk takes one; SCSI disks share one).
pub const HOTPLUG_PORTS: usize = 4;
/// PCI slot of the first hot-plug port on pcie.0 (vsock is at 0x10, NICs at 0x12-0x19).
const FIRST_PORT_SLOT: usize = 0x1a;
/// The SCSI controller's id (its bus is `<id>.0`).
const SCSI_CONTROLLER: &str = "vmlet-scsi";
/// How long the guest may take to release an unplugged device.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(10);

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
            "pcie-root-port,id={},bus=pcie.0,addr={:#x},chassis={},port={:#x}",
            port_id(i),
            FIRST_PORT_SLOT + i,
            200 + i,
            0x20 + i
        ));
    }
    args
}

fn port_id(i: usize) -> String {
    format!("vmlet-hp{i}")
}

/// What one attached device holds.
#[derive(Debug)]
struct Attached {
    device_id: String,
    node: String,
    port: Option<usize>,
}

/// The hot-plug state of one VM: its QMP monitor, which ports are taken, what each
/// container has attached.
pub struct Hotplug {
    qmp: Qmp,
    driver: DiskDriver,
    ports: [bool; HOTPLUG_PORTS],
    scsi_port: Option<usize>,
    next: u32,
    attached: HashMap<String, Vec<Attached>>,
}

impl Hotplug {
    pub fn new(qmp: Qmp, driver: DiskDriver) -> Self {
        Hotplug {
            qmp,
            driver,
            ports: [false; HOTPLUG_PORTS],
            scsi_port: None,
            next: 0,
            attached: HashMap::new(),
        }
    }

    /// The monitor, for what else goes through it (growing the VM's memory).
    pub fn qmp(&mut self) -> &mut Qmp {
        &mut self.qmp
    }

    /// Attaches `devices` (with their opened `fds`) for `container_id` and returns what the
    /// agent needs to find them. On failure what this call attached is detached again.
    pub fn attach(
        &mut self,
        container_id: &str,
        devices: &[BlockDevice],
        fds: Vec<OwnedFd>,
    ) -> Result<Vec<vmlet_protocol::agent::BlockDevice>, Error> {
        let mut found = Vec::new();
        for (device, fd) in devices.iter().zip(fds) {
            match self.attach_one(container_id, device, fd) {
                Ok(d) => found.push(d),
                Err(e) => {
                    if let Err(cleanup) = self.detach(container_id) {
                        log::error!(
                            "detach after failed attach for {container_id}: {}",
                            cleanup.message()
                        );
                    }
                    return Err(e);
                }
            }
        }
        Ok(found)
    }

    fn attach_one(
        &mut self,
        container_id: &str,
        device: &BlockDevice,
        fd: OwnedFd,
    ) -> Result<vmlet_protocol::agent::BlockDevice, Error> {
        let n = self.next;
        self.next += 1;
        let (serial, node, device_id) = (
            format!("vmlet{n}"),
            format!("vmlet-blk{n}"),
            format!("vmlet-disk{n}"),
        );
        let what = format!("{} for {}", self.driver.as_str(), device.path);
        let added = self.qmp.execute(
            "add-fd",
            json!({"opaque": format!("{container_id} {}", device.path)}),
            &[fd.as_raw_fd()],
        )?;
        drop(fd);
        let fdset = added["fdset-id"]
            .as_u64()
            .ok_or_else(|| Error::Internal(format!("add-fd answered {added} (no fdset-id)")))?;
        let node_added = self.qmp.execute(
            "blockdev-add",
            json!({
                "driver": "host_device",
                "node-name": node,
                "filename": format!("/dev/fdset/{fdset}"),
                "read-only": device.readonly,
            }),
            &[],
        );
        // The block node holds its own duplicate: the set's copy is not needed any more.
        let removed = self
            .qmp
            .execute("remove-fd", json!({"fdset-id": fdset}), &[]);
        node_added.map_err(|e| Error::Internal(format!("{what}: {}", e.message())))?;
        if let Err(e) = removed {
            log::warn!("{container_id}: {what}: {}", e.message());
        }

        let mut props = match self.driver {
            DiskDriver::Virtio => json!({"driver": "virtio-blk-pci"}),
            DiskDriver::Nvme => json!({"driver": "nvme"}),
            DiskDriver::Scsi => json!({"driver": "scsi-hd", "bus": format!("{SCSI_CONTROLLER}.0")}),
        };
        props["id"] = json!(device_id);
        props["drive"] = json!(node);
        props["serial"] = json!(serial);
        let port = match self.plug_disk(&what, props) {
            Ok(port) => port,
            Err(e) => {
                let _ = self
                    .qmp
                    .execute("blockdev-del", json!({"node-name": node}), &[]);
                return Err(e);
            }
        };
        log::info!(
            "{container_id}: attached {what} as {device_id} (serial {serial}{})",
            if device.readonly { ", read-only" } else { "" }
        );
        self.attached
            .entry(container_id.to_owned())
            .or_default()
            .push(Attached {
                device_id,
                node,
                port,
            });
        Ok(vmlet_protocol::agent::BlockDevice {
            serial,
            driver: self.driver.as_str().into(),
            path: device.path.clone(),
            file_mode: device.file_mode,
            uid: device.uid,
            gid: device.gid,
            ..Default::default()
        })
    }

    /// Plugs a disk device with `props` (its block node added): a PCI disk on a port of
    /// its own, returned; a SCSI disk on the controller, plugged with the first one. On
    /// failure the ports are as they were.
    fn plug_disk(&mut self, what: &str, mut props: Value) -> Result<Option<usize>, Error> {
        let port = match self.driver {
            DiskDriver::Scsi => {
                self.ensure_scsi_controller(what)?;
                None
            }
            DiskDriver::Virtio | DiskDriver::Nvme => {
                let p = self.take_port(what)?;
                props["bus"] = json!(port_id(p));
                Some(p)
            }
        };
        if let Err(e) = self.qmp.execute("device_add", props, &[]) {
            if let Some(p) = port {
                self.ports[p] = false;
            }
            return Err(Error::Internal(format!("{what}: {}", e.message())));
        }
        Ok(port)
    }

    /// The pod's one SCSI controller, plugged into a port when the first SCSI disk comes.
    fn ensure_scsi_controller(&mut self, what: &str) -> Result<(), Error> {
        if self.scsi_port.is_some() {
            return Ok(());
        }
        let p = self.take_port(what)?;
        let controller =
            json!({"driver": "virtio-scsi-pci", "id": SCSI_CONTROLLER, "bus": port_id(p)});
        if let Err(e) = self.qmp.execute("device_add", controller, &[]) {
            self.ports[p] = false;
            return Err(Error::Internal(format!("{what}: {}", e.message())));
        }
        self.scsi_port = Some(p);
        Ok(())
    }

    /// Takes a free hot-plug port.
    fn take_port(&mut self, what: &str) -> Result<usize, Error> {
        let p = self.ports.iter().position(|taken| !taken).ok_or_else(|| {
            Error::ResourceExhausted(format!(
                "{what}: all {HOTPLUG_PORTS} hot-plug ports of the pod's VM are taken"
            ))
        })?;
        self.ports[p] = true;
        Ok(p)
    }

    /// Unplugs what `container_id` attached (the guest must release each device) and frees
    /// its ports. Goes on past failures and returns the first.
    pub fn detach(&mut self, container_id: &str) -> Result<(), Error> {
        let mut first = None;
        for a in self.attached.remove(container_id).unwrap_or_default() {
            let unplugged = self
                .qmp
                .execute("device_del", json!({"id": a.device_id}), &[])
                .and_then(|_| {
                    let id = a.device_id.clone();
                    self.qmp.wait_event(
                        "DEVICE_DELETED",
                        move |data| data["device"].as_str() == Some(id.as_str()),
                        UNPLUG_TIMEOUT,
                    )
                })
                .and_then(|()| {
                    self.qmp
                        .execute("blockdev-del", json!({"node-name": a.node}), &[])
                });
            match unplugged {
                Ok(_) => {
                    if let Some(p) = a.port {
                        self.ports[p] = false;
                    }
                    log::info!("{container_id}: detached {}", a.device_id);
                }
                Err(e) => {
                    first.get_or_insert(Error::Internal(format!(
                        "unplug {} of {container_id}: {}",
                        a.device_id,
                        e.message()
                    )));
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::tests::fake_qemu;

    fn device(path: &str, readonly: bool) -> BlockDevice {
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

    fn null_fds(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect()
    }

    /// A QEMU that accepts everything (add-fd gives set 1, device_del is followed by its
    /// event) except device_add of `refused`.
    fn qemu(refused: &'static str) -> (Qmp, std::thread::JoinHandle<Vec<(Value, usize)>>) {
        let (stream, server) = fake_qemu(move |c| match c["execute"].as_str().unwrap() {
            "add-fd" => vec![json!({"return": {"fdset-id": 1, "fd": 30}})],
            "device_add" if c["arguments"]["driver"] == refused => {
                vec![json!({"error": {"class": "GenericError", "desc": "no"}})]
            }
            "device_del" => vec![
                json!({"return": {}}),
                json!({"event": "DEVICE_DELETED", "data": {"device": c["arguments"]["id"]}}),
            ],
            _ => vec![json!({"return": {}})],
        });
        (Qmp::handshake(stream).unwrap(), server)
    }

    fn commands(seen: &[(Value, usize)]) -> Vec<String> {
        seen.iter()
            .skip(1)
            .map(|(c, _)| {
                let a = &c["arguments"];
                let detail = a["driver"]
                    .as_str()
                    .or(a["bus"].as_str())
                    .or(a["id"].as_str())
                    .or(a["node-name"].as_str())
                    .unwrap_or("");
                format!("{} {detail}", c["execute"].as_str().unwrap())
            })
            .collect()
    }

    #[test]
    fn scsi_disks_share_one_controller_on_one_port() {
        let (qmp, server) = qemu("");
        let mut hp = Hotplug::new(qmp, DiskDriver::Scsi);
        let found = hp
            .attach(
                "c1",
                &[device("/dev/xvda", false), device("/dev/xvdb", true)],
                null_fds(2),
            )
            .unwrap();
        assert_eq!(found[0].serial, "vmlet0");
        assert_eq!(found[1].serial, "vmlet1");
        assert_eq!(found[1].driver, "scsi");
        assert_eq!(found[1].path, "/dev/xvdb");
        assert_eq!(hp.ports, [true, false, false, false]);
        hp.detach("c1").unwrap();
        drop(hp);
        let seen = server.join().unwrap();
        assert_eq!(
            commands(&seen),
            [
                "add-fd ",
                "blockdev-add host_device",
                "remove-fd ",
                "device_add virtio-scsi-pci",
                "device_add scsi-hd",
                "add-fd ",
                "blockdev-add host_device",
                "remove-fd ",
                "device_add scsi-hd",
                "device_del vmlet-disk0",
                "blockdev-del vmlet-blk0",
                "device_del vmlet-disk1",
                "blockdev-del vmlet-blk1",
            ]
        );
        assert_eq!(seen[1].1, 1, "the device's fd goes with add-fd");
        assert_eq!(seen[7].0["arguments"]["read-only"], true);
        assert_eq!(seen[5].0["arguments"]["bus"], "vmlet-scsi.0");
    }

    #[test]
    fn pci_disks_take_a_port_each_and_free_it_when_detached() {
        for (driver, qemu_driver) in [
            (DiskDriver::Virtio, "virtio-blk-pci"),
            (DiskDriver::Nvme, "nvme"),
        ] {
            let (qmp, server) = qemu("");
            let mut hp = Hotplug::new(qmp, driver);
            hp.attach("c1", &[device("/dev/a", false)], null_fds(1))
                .unwrap();
            hp.attach("c2", &[device("/dev/b", false)], null_fds(1))
                .unwrap();
            assert_eq!(hp.ports, [true, true, false, false]);
            hp.detach("c1").unwrap();
            assert_eq!(hp.ports, [false, true, false, false]);
            drop(hp);
            let seen = server.join().unwrap();
            let add = &seen[4].0["arguments"];
            assert_eq!(add["driver"], qemu_driver);
            assert_eq!(add["bus"], "vmlet-hp0");
            assert_eq!(add["serial"], "vmlet0");
            assert_eq!(seen[8].0["arguments"]["bus"], "vmlet-hp1");
        }
    }

    #[test]
    fn a_refused_device_is_undone_and_its_port_freed() {
        let (qmp, server) = qemu("nvme");
        let mut hp = Hotplug::new(qmp, DiskDriver::Nvme);
        let err = hp
            .attach("c1", &[device("/dev/a", false)], null_fds(1))
            .unwrap_err();
        assert_eq!(
            err.message(),
            "nvme for /dev/a: QEMU refused device_add: no"
        );
        assert_eq!(hp.ports, [false; HOTPLUG_PORTS]);
        drop(hp);
        let seen = server.join().unwrap();
        assert_eq!(commands(&seen).last().unwrap(), "blockdev-del vmlet-blk0");
    }

    #[test]
    fn running_out_of_ports_is_resource_exhausted() {
        let (qmp, _server) = qemu("");
        let mut hp = Hotplug::new(qmp, DiskDriver::Virtio);
        let four: Vec<_> = (0..4)
            .map(|i| device(&format!("/dev/d{i}"), false))
            .collect();
        hp.attach("c1", &four, null_fds(4)).unwrap();
        let err = hp
            .attach("c2", &[device("/dev/e", false)], null_fds(1))
            .unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::RESOURCE_EXHAUSTED);
        assert!(err.message().contains("/dev/e"), "{}", err.message());
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
