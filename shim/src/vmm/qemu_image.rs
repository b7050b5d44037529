//! A VM image's devices on the command line of the QEMU the shim starts itself
//! (`launcher = "direct"`, [`crate::vmm::qemu_command`]): what libvirt makes of the
//! domain's `<disk>`s, its `<os>` firmware and its guest agent `<channel>` under the other
//! launcher ([`crate::vmm::domain`]). Every disk and flash image reaches QEMU as a
//! descriptor the shim opened ([`ImageFds`], `-add-fd`; QEMU opens `/dev/fdset/N`): QEMU
//! opens none by path, needs no view of the node's disk directory or `/dev`, and the
//! overlay's backing file is the one the shim names, whatever the overlay's header says.
//!
//! Where each device sits: on the root bus itself, in the slots below vmlet's
//! ([`crate::vmm::pci_slots`]), where libvirt would put a root port for each (so the guest
//! sees another PCI layout under each launcher; its disks keep their names, `vda` first):
//!
//! | slot | device                                                                  |
//! |------|-------------------------------------------------------------------------|
//! | 0x2  | the root disk (`virtio-blk-pci`), or the `virtio-scsi-pci` it is on      |
//! | 0x3  | the cloud-init seed (`virtio-blk-pci`, read-only)                        |
//! | 0x4  | `virtio-serial-pci`, with the QEMU guest agent's port                    |
//!
//! A root disk on NVMe sits at its slot of vmlet's range, as under libvirt.

use std::os::fd::RawFd;

use serde_json::{json, Value};

use crate::vm_mode::vm_disk::DiskFormat;
use crate::vmm::pci_slots::hex;
use crate::vmm::vm_spec::{ImageDisks, RootBus};

/// The slots of the table above.
const ROOT_SLOT: usize = 0x2;
const SEED_SLOT: usize = 0x3;
const SERIAL_SLOT: usize = 0x4;
/// The node names of the root disk, the seed and the firmware's flash images.
const ROOT: &str = "vmlet-root";
const SEED: &str = "vmlet-seed";
const FLASH_CODE: &str = "vmlet-flash-code";
const FLASH_VARS: &str = "vmlet-flash-vars";
/// The root disk's SCSI controller (not the hot-plugged disks' own, `vmlet-scsi`).
const ROOT_SCSI: &str = "vmlet-root-scsi";

/// The descriptors QEMU inherits for a VM image, each opened by the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFds {
    /// The root disk, read-write: the overlay (qcow2), or the root volume's block device.
    pub root: RawFd,
    /// The image's disk, the overlay's backing file, read-only (none with a root volume).
    pub backing: Option<RawFd>,
    /// The cloud-init seed, read-only.
    pub seed: RawFd,
    /// OVMF: its code (read-only) and the pod's copy of its variable store (read-write).
    pub uefi: Option<UefiFds>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UefiFds {
    pub code: RawFd,
    pub vars: RawFd,
}

/// A VM image's part of the command line: what `-machine` gets beside its type (the
/// firmware's flash), and the arguments.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ImageArgs {
    pub machine: String,
    pub args: Vec<String>,
}

/// The fd sets of `-add-fd`, numbered from 1 (the console's is 0).
struct FdSets {
    next: u32,
    args: Vec<String>,
}

impl FdSets {
    /// `fd` in a set of its own: the file name QEMU opens it by.
    fn add(&mut self, fd: RawFd, what: &str) -> String {
        let set = self.next;
        self.next += 1;
        self.args.push("-add-fd".into());
        self.args
            .push(format!("set={set},fd={fd},opaque=vmlet-{what}"));
        format!("/dev/fdset/{set}")
    }
}

/// A protocol node on `filename`, read-only or not.
fn file(driver: &str, filename: String, read_only: bool) -> Value {
    json!({"driver": driver, "filename": filename, "read-only": read_only})
}

/// QEMU's arguments for `image`'s disks, firmware and guest agent port on `fds`.
pub fn image_args(image: &ImageDisks, fds: &ImageFds, nvme_slot: usize) -> ImageArgs {
    let mut sets = FdSets {
        next: 1,
        args: Vec::new(),
    };
    let mut args = Vec::new();
    let mut blockdev = |node: Value| {
        args.extend(["-blockdev".to_string(), node.to_string()]);
    };
    let root_file = sets.add(fds.root, "root");
    let root = match (&image.root_volume, fds.backing) {
        // Raw, whatever its bytes say: the volume's content is the pod's.
        (Some(volume), _) => json!({
            "driver": "raw",
            "node-name": ROOT,
            "offset": volume.offset,
            "size": volume.size,
            "file": file("host_device", root_file, false),
        }),
        // The overlay's backing file is the descriptor's, never what its header names (none
        // at all without one).
        (None, backing) => json!({
            "driver": "qcow2",
            "node-name": ROOT,
            "file": file("file", root_file, false),
            "backing": backing.map_or(Value::Null, |fd| {
                let mut base = json!({
                    "driver": image.backing_format.as_str(),
                    "read-only": true,
                    "file": file("file", sets.add(fd, "backing"), true),
                });
                // The image's disk has no backing file of its own (a qcow2 one that named
                // one would have QEMU open a node's file).
                if image.backing_format == DiskFormat::Qcow2 {
                    base["backing"] = Value::Null;
                }
                base
            }),
        }),
    };
    blockdev(root);
    blockdev(json!({
        "driver": "raw",
        "node-name": SEED,
        "read-only": true,
        "file": file("file", sets.add(fds.seed, "seed"), true),
    }));
    let mut machine = String::new();
    if let Some(uefi) = fds.uefi {
        for (node, fd, read_only, what) in [
            (FLASH_CODE, uefi.code, true, "flash-code"),
            (FLASH_VARS, uefi.vars, false, "flash-vars"),
        ] {
            blockdev(json!({
                "driver": "raw",
                "node-name": node,
                "read-only": read_only,
                "file": file("file", sets.add(fd, what), read_only),
            }));
        }
        machine = format!(",pflash0={FLASH_CODE},pflash1={FLASH_VARS}");
    }
    let mut device = |value: String| args.extend(["-device".to_string(), value]);
    let boot = format!("drive={ROOT},id={ROOT}-disk,bootindex=1");
    match image.root_bus {
        RootBus::Virtio => device(format!(
            "virtio-blk-pci,{boot},bus=pcie.0,addr={}",
            hex(ROOT_SLOT)
        )),
        RootBus::Scsi => {
            device(format!(
                "virtio-scsi-pci,id={ROOT_SCSI},bus=pcie.0,addr={}",
                hex(ROOT_SLOT)
            ));
            device(format!("scsi-hd,{boot},bus={ROOT_SCSI}.0"));
        }
        RootBus::Nvme => device(format!(
            "nvme,{boot},serial={ROOT},bus=pcie.0,addr={}",
            hex(nvme_slot)
        )),
    }
    device(format!(
        "virtio-blk-pci,drive={SEED},id={SEED}-disk,bus=pcie.0,addr={}",
        hex(SEED_SLOT)
    ));
    device(format!(
        "virtio-serial-pci,id=vmlet-serial,bus=pcie.0,addr={}",
        hex(SERIAL_SLOT)
    ));
    device(format!(
        "virtserialport,bus=vmlet-serial.0,nr=1,chardev=vmlet-ga,id=vmlet-ga-port,name={}",
        crate::guest::guest_agent::PORT_NAME
    ));
    args.extend([
        "-chardev".to_string(),
        format!("socket,id=vmlet-ga,path={}", image.guest_agent_socket),
    ]);
    sets.args.extend(args);
    ImageArgs {
        machine,
        args: sets.args,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::vmm::vm_spec::RootVolume;

    pub(crate) fn image() -> ImageDisks {
        ImageDisks {
            overlay: "/var/lib/vmlet/disks/t1/root.qcow2".into(),
            backing: "/run/vmlet/t1/image-disk".into(),
            backing_format: DiskFormat::Qcow2,
            seed: "/run/vmlet/t1/seed.iso".into(),
            root_bus: RootBus::Virtio,
            firmware: vmlet_config::Firmware::Bios,
            guest_agent_socket: "/run/vmlet/t1/guest-agent.sock".into(),
            volumes: None,
            root_volume: None,
        }
    }

    pub(crate) fn fds() -> ImageFds {
        ImageFds {
            root: 20,
            backing: Some(21),
            seed: 22,
            uefi: None,
        }
    }

    fn values<'a>(args: &'a [String], option: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == option)
            .map(|w| w[1].as_str())
            .collect()
    }

    fn blockdevs(args: &[String]) -> Vec<Value> {
        values(args, "-blockdev")
            .into_iter()
            .map(|b| serde_json::from_str(b).unwrap())
            .collect()
    }

    #[test]
    fn the_overlay_and_its_backing_file_are_descriptors_and_nothing_is_opened_by_path() {
        let made = image_args(&image(), &fds(), 0x10);
        assert_eq!(
            values(&made.args, "-add-fd"),
            [
                "set=1,fd=20,opaque=vmlet-root",
                "set=2,fd=21,opaque=vmlet-backing",
                "set=3,fd=22,opaque=vmlet-seed"
            ]
        );
        let nodes = blockdevs(&made.args);
        assert_eq!(nodes[0]["node-name"], ROOT);
        assert_eq!(nodes[0]["file"]["filename"], "/dev/fdset/1");
        assert_eq!(nodes[0]["backing"]["file"]["filename"], "/dev/fdset/2");
        assert_eq!(nodes[0]["backing"]["read-only"], true);
        assert_eq!(nodes[0]["backing"]["backing"], Value::Null);
        assert_eq!(nodes[1]["read-only"], true);
        assert_eq!(nodes[1]["file"]["read-only"], true);
        let joined = made.args.join(" ");
        for path in ["root.qcow2", "image-disk", "seed.iso"] {
            assert!(!joined.contains(path), "{path} in {joined}");
        }
        assert!(made.machine.is_empty());
        let devices = values(&made.args, "-device");
        assert_eq!(
            devices[0],
            "virtio-blk-pci,drive=vmlet-root,id=vmlet-root-disk,bootindex=1,bus=pcie.0,addr=0x2"
        );
        assert!(devices[1].starts_with("virtio-blk-pci,drive=vmlet-seed,"));
        assert!(devices
            .iter()
            .any(|d| d.ends_with("name=org.qemu.guest_agent.0")));
        assert_eq!(
            values(&made.args, "-chardev"),
            ["socket,id=vmlet-ga,path=/run/vmlet/t1/guest-agent.sock"]
        );
    }

    #[test]
    fn a_raw_image_has_no_backing_entry_of_its_own() {
        let mut raw = image();
        raw.backing_format = DiskFormat::Raw;
        let nodes = blockdevs(&image_args(&raw, &fds(), 0x10).args);
        assert_eq!(nodes[0]["backing"]["driver"], "raw");
        assert!(nodes[0]["backing"].get("backing").is_none());
        // An overlay without a backing descriptor has none: not its header's.
        let mut fds = fds();
        fds.backing = None;
        let nodes = blockdevs(&image_args(&image(), &fds, 0x10).args);
        assert_eq!(nodes[0]["backing"], Value::Null);
    }

    #[test]
    fn a_root_volume_is_a_raw_slice_of_its_device() {
        let mut on_volume = image();
        on_volume.root_volume = Some(RootVolume {
            rdev: (7, 7),
            device: "/dev/loop7".into(),
            offset: 1 << 20,
            size: 8 << 30,
        });
        let mut fds = fds();
        fds.backing = None;
        let made = image_args(&on_volume, &fds, 0x10);
        let nodes = blockdevs(&made.args);
        assert_eq!(nodes[0]["driver"], "raw");
        assert_eq!(nodes[0]["offset"], 1 << 20);
        assert_eq!(nodes[0]["size"], 8u64 << 30);
        assert_eq!(nodes[0]["file"]["driver"], "host_device");
        assert!(!made.args.join(" ").contains("/dev/loop7"));
    }

    #[test]
    fn each_root_bus_and_uefi_flash() {
        let mut scsi = image();
        scsi.root_bus = RootBus::Scsi;
        let mut fds = fds();
        fds.uefi = Some(UefiFds { code: 23, vars: 24 });
        let made = image_args(&scsi, &fds, 0x10);
        let devices = values(&made.args, "-device");
        assert!(devices[0].starts_with("virtio-scsi-pci,id=vmlet-root-scsi,"));
        assert!(devices[1].starts_with("scsi-hd,drive=vmlet-root,"));
        assert!(devices[1].ends_with("bus=vmlet-root-scsi.0"));
        assert_eq!(
            made.machine,
            ",pflash0=vmlet-flash-code,pflash1=vmlet-flash-vars"
        );
        let nodes = blockdevs(&made.args);
        assert_eq!(nodes[2]["node-name"], FLASH_CODE);
        assert_eq!(nodes[2]["read-only"], true);
        assert_eq!(nodes[3]["node-name"], FLASH_VARS);
        assert_eq!(nodes[3]["file"]["read-only"], false);

        let mut nvme = image();
        nvme.root_bus = RootBus::Nvme;
        let devices = image_args(&nvme, &self::fds(), 0x10).args;
        assert!(values(&devices, "-device")[0].starts_with("nvme,drive=vmlet-root,"));
        assert!(values(&devices, "-device")[0].ends_with("addr=0x10"));
    }
}
