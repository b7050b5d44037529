//! What the VM runs ([`GuestBoot`]): vmlet's guest (kernel and initrd, the agent over
//! vsock, the containers' files over virtio-fs) or a VM image's disks under firmware, and
//! the domain's OS, disks, filesystems and controllers each takes.

use vmlet_config::Firmware;

use super::*;

/// What the VM runs, and the devices that takes.
#[derive(Debug, Clone)]
pub enum GuestBoot {
    /// vmlet's guest: its kernel and initrd booted directly, the agent over vsock, the
    /// containers' files over virtio-fs.
    Agent(AgentBoot),
    /// A VM image (docs/vm-mode.md): firmware boots the overlay of the image's disk; the
    /// cloud-init seed is a read-only disk beside it.
    Image(ImageDisks),
}

#[derive(Debug, Clone)]
pub struct AgentBoot {
    pub kernel: String,
    pub initrd: String,
    pub cmdline: String,
    pub virtiofsd: String,
    pub share_dir: String,
    pub share_tag: String,
    pub vsock: VsockDevice,
    /// The file QEMU reads the agent's key from, into the fw_cfg entry the agent reads
    /// ([`vmlet_protocol::auth::FW_CFG_NAME`]).
    pub key_file: String,
}

#[derive(Debug, Clone)]
pub struct ImageDisks {
    /// The qcow2 overlay the VM writes.
    pub overlay: String,
    /// The image's disk, the overlay's backing file, and its format.
    pub backing: String,
    pub backing_format: crate::vm_mode::vm_disk::DiskFormat,
    /// The NoCloud seed (ISO 9660).
    pub seed: String,
    /// How the root disk (the overlay) is attached.
    pub root_bus: RootBus,
    /// SeaBIOS (QEMU's default) or OVMF.
    pub firmware: Firmware,
}

/// The bus a VM image's root disk is on: the pod's disk driver (`vmlet.io/disk-driver`), else
/// virtio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RootBus {
    /// virtio-blk: `vda`, what cloud images expect.
    #[default]
    Virtio,
    /// virtio-scsi: `sda`.
    Scsi,
    /// NVMe: `nvme0n1`. libvirt 9.0 has no NVMe disk bus: QEMU's own `nvme` device, given
    /// on its command line, at the head of the boot order.
    Nvme,
}

impl RootBus {
    pub fn of(driver: Option<vmlet_config::DiskDriver>) -> Self {
        match driver {
            None | Some(vmlet_config::DiskDriver::Virtio) => RootBus::Virtio,
            Some(vmlet_config::DiskDriver::Scsi) => RootBus::Scsi,
            Some(vmlet_config::DiskDriver::Nvme) => RootBus::Nvme,
        }
    }

    /// The root disk's name and bus as libvirt's disk (the guest names it as its driver
    /// does); none for NVMe, which is QEMU's own device.
    fn target(self) -> Option<DiskTarget> {
        match self {
            RootBus::Virtio => Some(DiskTarget {
                dev: "vda",
                bus: "virtio",
            }),
            RootBus::Scsi => Some(DiskTarget {
                dev: "sda",
                bus: "scsi",
            }),
            RootBus::Nvme => None,
        }
    }
}

/// The node name of a VM image's NVMe root disk in QEMU.
const ROOT_NVME_NODE: &str = "vmlet-root";

impl ImageDisks {
    /// QEMU's arguments for a root disk on NVMe: the overlay (QEMU opens its backing file,
    /// with the format, as the overlay's header names them: the checked image disk), and
    /// the `nvme` device, first in the boot order.
    pub(crate) fn nvme_root_args(&self, slot: usize) -> Vec<String> {
        if self.root_bus != RootBus::Nvme {
            return Vec::new();
        }
        let blockdev = serde_json::json!({
            "driver": "qcow2",
            "node-name": ROOT_NVME_NODE,
            "file": {"driver": "file", "filename": self.overlay},
        });
        vec![
            "-blockdev".into(),
            blockdev.to_string(),
            "-device".into(),
            format!(
                "nvme,id={ROOT_NVME_NODE}-nvme,serial={ROOT_NVME_NODE},drive={ROOT_NVME_NODE},bootindex=1,bus=pcie.0,addr={}",
                crate::vmm::pci_slots::hex(slot)
            ),
        ]
    }
}

impl GuestBoot {
    pub(super) fn os(&self, kind: OsType) -> Os {
        match self {
            GuestBoot::Agent(a) => Os {
                firmware_kind: None,
                kind,
                firmware: None,
                kernel: Some(a.kernel.clone()),
                initrd: Some(a.initrd.clone()),
                cmdline: Some(a.cmdline.clone()),
                boot: None,
            },
            GuestBoot::Image(image) => Os {
                firmware_kind: (image.firmware == Firmware::Uefi).then_some("efi"),
                kind,
                // OVMF without secure boot: an image's own boot loader need not be signed
                // (and secure boot would want SMM, which TCG runs slowly).
                firmware: (image.firmware == Firmware::Uefi).then(|| FirmwareFeatures {
                    feature: ["secure-boot", "enrolled-keys"]
                        .into_iter()
                        .map(|name| FirmwareFeature {
                            enabled: "no",
                            name,
                        })
                        .collect(),
                }),
                kernel: None,
                initrd: None,
                cmdline: None,
                // A root disk on NVMe heads the boot order itself (libvirt takes either
                // `<os><boot>` or each device's order, not both).
                boot: (image.root_bus != RootBus::Nvme).then_some(BootDev { dev: "hd" }),
            },
        }
    }

    pub(super) fn disks(&self) -> Vec<Disk> {
        let GuestBoot::Image(image) = self else {
            return Vec::new();
        };
        let root = image.root_bus.target().map(|target| Disk {
            kind: "file",
            device: "disk",
            driver: DiskDriver {
                name: "qemu",
                format: "qcow2",
            },
            source: FileAttr {
                file: image.overlay.clone(),
            },
            backing_store: BackingStore::file(image.backing.clone(), image.backing_format.as_str()),
            target,
            boot: None,
            readonly: None,
        });
        let seed = Disk {
            kind: "file",
            device: "disk",
            driver: DiskDriver {
                name: "qemu",
                format: "raw",
            },
            source: FileAttr {
                file: image.seed.clone(),
            },
            backing_store: BackingStore::none(),
            target: DiskTarget {
                dev: "vdb",
                bus: "virtio",
            },
            // After the NVMe root disk, which is first.
            boot: root.is_none().then_some(BootOrder { order: 2 }),
            readonly: Some(Empty {}),
        };
        root.into_iter().chain([seed]).collect()
    }

    /// The controllers: none on USB, and a virtio-scsi one for a root disk on SCSI.
    pub(super) fn controllers(&self) -> Vec<Controller> {
        let mut controllers = vec![Controller {
            kind: "usb",
            model: "none",
        }];
        if matches!(self, GuestBoot::Image(i) if i.root_bus == RootBus::Scsi) {
            controllers.push(Controller {
                kind: "scsi",
                model: "virtio-scsi",
            });
        }
        controllers
    }

    pub(super) fn filesystems(&self) -> Vec<Filesystem> {
        let GuestBoot::Agent(a) = self else {
            return Vec::new();
        };
        vec![Filesystem {
            kind: "mount",
            accessmode: "passthrough",
            driver: TypeAttr {
                kind: "virtiofs".into(),
            },
            binary: PathAttr {
                path: a.virtiofsd.clone(),
            },
            source: DirAttr {
                dir: a.share_dir.clone(),
            },
            target: DirAttr {
                dir: a.share_tag.clone(),
            },
        }]
    }
}
