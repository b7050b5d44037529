//! Hot-plugging a container's block devices into the running VM over vmlet's QMP monitor
//! ([`crate::devices::qmp`]): `add-fd` with the host device's fd, a `host_device` block node
//! on `/dev/fdset/N`, then the device, `virtio-blk-pci` or `nvme` on a hot-plug root port of
//! its own (the ports the VM's description makes,
//! [`crate::vmm::vm_spec::VmSpec::hotplug_ports`]), or `scsi-hd` behind the pod's one
//! `virtio-scsi-pci` controller (plugged with the first SCSI disk). Unplugging waits for the guest to release
//! each device (`DEVICE_DELETED`). Containers attach and detach side by side: the port
//! table is locked only between QMP calls, never across one.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use vmlet_config::DiskDriver;

use crate::devices::block_devices::BlockDevice;
use crate::devices::qmp::Qmp;
use crate::Error;

/// The SCSI controller's id (its bus is `<id>.0`).
const SCSI_CONTROLLER: &str = "vmlet-scsi";
/// How long the guest may take to release an unplugged device.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(10);

/// What one attached device holds.
#[derive(Debug)]
struct Attached {
    device_id: String,
    node: String,
    port: Option<usize>,
}

/// Which hot-plug ports are taken and what each container attached.
struct Table {
    /// Whether each port (of [`Hotplug::port_ids`]) is taken.
    ports: Vec<bool>,
    attached: HashMap<String, Vec<Attached>>,
}

/// The hot-plug state of one VM.
pub struct Hotplug {
    qmp: Qmp,
    driver: DiskDriver,
    /// The VM's hot-plug root ports.
    port_ids: Vec<String>,
    table: Mutex<Table>,
    /// The SCSI controller's port, once it is plugged (by the first SCSI disk; others
    /// arriving meanwhile wait for that one plug).
    scsi_port: tokio::sync::OnceCell<usize>,
    next: AtomicU32,
}

impl Hotplug {
    /// The hot-plug state of a VM with hot-plug root ports `port_ids`, none taken.
    pub fn new(qmp: Qmp, driver: DiskDriver, port_ids: Vec<String>) -> Self {
        Hotplug {
            qmp,
            driver,
            table: Mutex::new(Table {
                ports: vec![false; port_ids.len()],
                attached: HashMap::new(),
            }),
            port_ids,
            scsi_port: tokio::sync::OnceCell::new(),
            next: AtomicU32::new(0),
        }
    }

    /// The monitor, for what else goes through it (growing the VM's memory).
    pub fn qmp(&self) -> &Qmp {
        &self.qmp
    }

    /// Attaches `devices` (with their opened `fds`) for `container_id` and returns what the
    /// agent needs to find them. On failure what this call attached is detached again.
    pub async fn attach(
        &self,
        container_id: &str,
        devices: &[BlockDevice],
        fds: Vec<OwnedFd>,
    ) -> Result<Vec<vmlet_protocol::agent::BlockDevice>, Error> {
        let mut found = Vec::new();
        for (device, fd) in devices.iter().zip(fds) {
            match self.attach_one(container_id, device, fd).await {
                Ok(d) => found.push(d),
                Err(e) => {
                    if let Err(cleanup) = self.detach(container_id).await {
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

    async fn attach_one(
        &self,
        container_id: &str,
        device: &BlockDevice,
        fd: OwnedFd,
    ) -> Result<vmlet_protocol::agent::BlockDevice, Error> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (serial, node, device_id) = (
            device.serial.clone().unwrap_or_else(|| format!("vmlet{n}")),
            format!("vmlet-blk{n}"),
            format!("vmlet-disk{n}"),
        );
        let what = format!("{} for {}", self.driver.as_str(), device.path);
        let added = self
            .qmp
            .execute(
                "add-fd",
                json!({"opaque": format!("{container_id} {}", device.path)}),
                vec![fd],
            )
            .await?;
        let fdset = added["fdset-id"]
            .as_u64()
            .ok_or_else(|| Error::Internal(format!("add-fd answered {added} (no fdset-id)")))?;
        let node_added = self
            .qmp
            .execute(
                "blockdev-add",
                json!({
                    "driver": "host_device",
                    "node-name": node,
                    "filename": format!("/dev/fdset/{fdset}"),
                    "read-only": device.readonly,
                }),
                Vec::new(),
            )
            .await;
        // The block node holds its own duplicate: the set's copy is not needed any more.
        let removed = self
            .qmp
            .execute("remove-fd", json!({"fdset-id": fdset}), Vec::new())
            .await;
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
        let port = match self.plug_disk(&what, props).await {
            Ok(port) => port,
            Err(e) => {
                let _ = self
                    .qmp
                    .execute("blockdev-del", json!({"node-name": node}), Vec::new())
                    .await;
                return Err(e);
            }
        };
        log::info!(
            "{container_id}: attached {what} as {device_id} (serial {serial}{})",
            if device.readonly { ", read-only" } else { "" }
        );
        self.table
            .lock()
            .unwrap()
            .attached
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
    async fn plug_disk(&self, what: &str, mut props: Value) -> Result<Option<usize>, Error> {
        let port = match self.driver {
            DiskDriver::Scsi => {
                self.scsi_controller(what).await?;
                None
            }
            DiskDriver::Virtio | DiskDriver::Nvme => {
                let p = self.take_port(what)?;
                props["bus"] = json!(self.port_ids[p]);
                Some(p)
            }
        };
        if let Err(e) = self.qmp.execute("device_add", props, Vec::new()).await {
            if let Some(p) = port {
                self.free_port(p);
            }
            return Err(Error::Internal(format!("{what}: {}", e.message())));
        }
        Ok(port)
    }

    /// The pod's one SCSI controller, plugged into a port when the first SCSI disk comes.
    async fn scsi_controller(&self, what: &str) -> Result<usize, Error> {
        let plug = || async {
            let p = self.take_port(what)?;
            let controller = json!({"driver": "virtio-scsi-pci", "id": SCSI_CONTROLLER, "bus": self.port_ids[p]});
            if let Err(e) = self.qmp.execute("device_add", controller, Vec::new()).await {
                self.free_port(p);
                return Err(Error::Internal(format!("{what}: {}", e.message())));
            }
            Ok(p)
        };
        self.scsi_port.get_or_try_init(plug).await.copied()
    }

    /// Takes a free hot-plug port.
    fn take_port(&self, what: &str) -> Result<usize, Error> {
        let mut table = self.table.lock().unwrap();
        let p = table.ports.iter().position(|taken| !taken).ok_or_else(|| {
            Error::ResourceExhausted(format!(
                "{what}: all {} hot-plug ports of the pod's VM are taken",
                self.port_ids.len()
            ))
        })?;
        table.ports[p] = true;
        Ok(p)
    }

    fn free_port(&self, p: usize) {
        self.table.lock().unwrap().ports[p] = false;
    }

    /// Unplugs what `container_id` attached (the guest must release each device) and frees
    /// its ports. Goes on past failures and returns the first.
    pub async fn detach(&self, container_id: &str) -> Result<(), Error> {
        let attached = self
            .table
            .lock()
            .unwrap()
            .attached
            .remove(container_id)
            .unwrap_or_default();
        let mut first = None;
        for a in attached {
            match self.unplug(&a).await {
                Ok(()) => {
                    if let Some(p) = a.port {
                        self.free_port(p);
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

    /// Unplugs one device and removes its block node.
    async fn unplug(&self, a: &Attached) -> Result<(), Error> {
        // Subscribed first: the event may come right after device_del's reply.
        let mut events = self.qmp.subscribe();
        self.qmp
            .execute("device_del", json!({"id": a.device_id}), Vec::new())
            .await?;
        let id = a.device_id.clone();
        events
            .wait_for(
                "DEVICE_DELETED",
                move |data| data["device"].as_str() == Some(id.as_str()),
                UNPLUG_TIMEOUT,
            )
            .await?;
        self.qmp
            .execute("blockdev-del", json!({"node-name": a.node}), Vec::new())
            .await?;
        Ok(())
    }

    /// Which ports are taken.
    #[cfg(test)]
    fn ports(&self) -> Vec<bool> {
        self.table.lock().unwrap().ports.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::block_devices::tests::device;
    use crate::devices::qmp::tests::fake_qemu;

    /// A VM's four hot-plug ports, as [`crate::vmm::vm_spec::VmSpec::hotplug_ports`] names them.
    fn port_ids() -> Vec<String> {
        (0..4).map(crate::devices::block_devices::port_id).collect()
    }

    fn null_fds(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect()
    }

    /// A QEMU that accepts everything (add-fd gives set 1, device_del is followed by its
    /// event) except device_add of `refused`.
    async fn qemu(refused: &'static str) -> (Qmp, std::thread::JoinHandle<Vec<(Value, usize)>>) {
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
        (Qmp::handshake(stream).await.unwrap(), server)
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

    #[tokio::test]
    async fn scsi_disks_share_one_controller_on_one_port() {
        let (qmp, server) = qemu("").await;
        let hp = Hotplug::new(qmp, DiskDriver::Scsi, port_ids());
        let found = hp
            .attach(
                "c1",
                &[device("/dev/xvda", false), device("/dev/xvdb", true)],
                null_fds(2),
            )
            .await
            .unwrap();
        assert_eq!(found[0].serial, "vmlet0");
        assert_eq!(found[1].serial, "vmlet1");
        assert_eq!(found[1].driver, "scsi");
        assert_eq!(found[1].path, "/dev/xvdb");
        assert_eq!(hp.ports(), [true, false, false, false]);
        hp.detach("c1").await.unwrap();
        drop(hp);
        let seen = crate::devices::qmp::tests::finished(server).await;
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

    #[tokio::test]
    async fn pci_disks_take_a_port_each_and_free_it_when_detached() {
        for (driver, qemu_driver) in [
            (DiskDriver::Virtio, "virtio-blk-pci"),
            (DiskDriver::Nvme, "nvme"),
        ] {
            let (qmp, server) = qemu("").await;
            let hp = Hotplug::new(qmp, driver, port_ids());
            hp.attach("c1", &[device("/dev/a", false)], null_fds(1))
                .await
                .unwrap();
            hp.attach("c2", &[device("/dev/b", false)], null_fds(1))
                .await
                .unwrap();
            assert_eq!(hp.ports(), [true, true, false, false]);
            hp.detach("c1").await.unwrap();
            assert_eq!(hp.ports(), [false, true, false, false]);
            drop(hp);
            let seen = crate::devices::qmp::tests::finished(server).await;
            let add = &seen[4].0["arguments"];
            assert_eq!(add["driver"], qemu_driver);
            assert_eq!(add["bus"], "vmlet-hp0");
            assert_eq!(add["serial"], "vmlet0");
            assert_eq!(seen[8].0["arguments"]["bus"], "vmlet-hp1");
        }
    }

    #[tokio::test]
    async fn a_refused_device_is_undone_and_its_port_freed() {
        let (qmp, server) = qemu("nvme").await;
        let hp = Hotplug::new(qmp, DiskDriver::Nvme, port_ids());
        let err = hp
            .attach("c1", &[device("/dev/a", false)], null_fds(1))
            .await
            .unwrap_err();
        assert_eq!(
            err.message(),
            "nvme for /dev/a: QEMU refused device_add: no"
        );
        assert_eq!(hp.ports(), [false; 4]);
        drop(hp);
        let seen = crate::devices::qmp::tests::finished(server).await;
        assert_eq!(commands(&seen).last().unwrap(), "blockdev-del vmlet-blk0");
    }

    #[tokio::test]
    async fn running_out_of_ports_is_resource_exhausted() {
        let (qmp, _server) = qemu("").await;
        let hp = Hotplug::new(qmp, DiskDriver::Virtio, port_ids());
        let four: Vec<_> = (0..4)
            .map(|i| device(&format!("/dev/d{i}"), false))
            .collect();
        hp.attach("c1", &four, null_fds(4)).await.unwrap();
        let err = hp
            .attach("c2", &[device("/dev/e", false)], null_fds(1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::RESOURCE_EXHAUSTED);
        assert!(err.message().contains("/dev/e"), "{}", err.message());
    }

    #[tokio::test]
    async fn scsi_disks_attached_side_by_side_share_one_controller() {
        let (qmp, server) = qemu("").await;
        let hp = Hotplug::new(qmp, DiskDriver::Scsi, port_ids());
        let (first, second) = ([device("/dev/a", false)], [device("/dev/b", false)]);
        let (a, b) = tokio::join!(
            hp.attach("c1", &first, null_fds(1)),
            hp.attach("c2", &second, null_fds(1)),
        );
        a.unwrap();
        b.unwrap();
        assert_eq!(hp.ports(), [true, false, false, false]);
        drop(hp);
        let seen = crate::devices::qmp::tests::finished(server).await;
        let controllers = commands(&seen)
            .iter()
            .filter(|c| c.as_str() == "device_add virtio-scsi-pci")
            .count();
        assert_eq!(controllers, 1);
    }
}
