//! The domain's OS, disks, file systems and controllers each kind of guest
//! ([`GuestBoot`]) takes.

use vmlet_config::Firmware;

use super::*;
use crate::vmm::vm_spec::{GuestBoot, RootBus};

impl RootBus {
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

impl GuestBoot {
    /// The domain's `<os>`. vmlet's guest's kernel is QEMU's argument
    /// ([`VmSpec::kernel_args`]), not the domain's `<kernel>`: libvirt would give the node's
    /// kernel and initrd to the pod's QEMU's user while the pod runs (and one pod's QEMU
    /// could then rewrite what every later pod boots).
    pub(super) fn os(&self, kind: OsType) -> Os {
        match self {
            GuestBoot::Agent(_) => Os {
                firmware_kind: None,
                kind,
                firmware: None,
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
        let root = image
            .root_bus
            .target()
            .map(|target| match &image.root_volume {
                // Raw, whatever its bytes say: the volume's content is the pod's.
                Some(volume) => Disk {
                    kind: "block",
                    device: "disk",
                    driver: DiskDriver {
                        name: "qemu",
                        format: "raw",
                    },
                    source: DiskSource::block_slice(
                        volume.device.clone(),
                        volume.offset,
                        volume.size,
                    ),
                    backing_store: BackingStore::none(),
                    target,
                    boot: None,
                    readonly: None,
                },
                None => Disk {
                    kind: "file",
                    device: "disk",
                    driver: DiskDriver {
                        name: "qemu",
                        format: "qcow2",
                    },
                    source: DiskSource::file(image.overlay.clone()),
                    backing_store: BackingStore::file(
                        image.backing.clone(),
                        image.backing_format.as_str(),
                    ),
                    target,
                    boot: None,
                    readonly: None,
                },
            });
        let seed = Disk {
            kind: "file",
            device: "disk",
            driver: DiskDriver {
                name: "qemu",
                format: "raw",
            },
            source: DiskSource::file(image.seed.clone()),
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

    /// A VM image's QEMU guest agent port, connected to the shim's socket (vmlet's guest
    /// has its own agent on vsock).
    pub(super) fn channels(&self) -> Vec<Channel> {
        let GuestBoot::Image(image) = self else {
            return Vec::new();
        };
        vec![Channel {
            kind: "unix",
            source: SerialSource {
                mode: Some("connect"),
                path: image.guest_agent_socket.clone(),
            },
            target: ChannelTarget {
                kind: "virtio",
                name: crate::guest::guest_agent::PORT_NAME,
            },
        }]
    }

    /// vmlet's guest's share, or a VM image's volumes': served by the pod's virtiofsd,
    /// which the shim starts (not libvirt: its socket would be open to the group of every
    /// pod's QEMU), on the socket QEMU connects.
    pub(super) fn filesystems(&self) -> Vec<Filesystem> {
        self.share()
            .map(|share| Filesystem {
                kind: "mount",
                driver: TypeAttr {
                    kind: "virtiofs".into(),
                },
                source: SocketAttr {
                    socket: share.socket.to_owned(),
                },
                target: DirAttr {
                    dir: share.tag.to_owned(),
                },
            })
            .into_iter()
            .collect()
    }
}
