//! What the VM runs ([`GuestBoot`]): vmlet's guest (kernel and initrd, the agent over
//! vsock, the containers' files over virtio-fs) or a VM image's disks under firmware; and
//! where its serial console goes ([`ConsoleTarget`]).

use vmlet_config::Firmware;

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

/// vmlet's guest kernel's command line, its share under `share_tag`, with the pod's own
/// `extra` parameters. memhp_default_state: the guest onlines what virtio-mem plugs.
/// swiotlb=noforce: a hot-plug region above 4 GiB would make the kernel reserve 64 MiB of
/// bounce buffers, which the guest's devices (virtio without an IOMMU) never use.
/// fuse.keep_unchanged_cache: an open keeps an unchanged file's pages (the lean kernel's
/// `fuse-keep-unchanged-cache.patch`), so an exec does not read its binary again; Debian's
/// cloud kernel ignores it.
pub fn agent_cmdline(share_tag: &str, extra: &str) -> String {
    format!(
        "console=ttyS0 panic=-1 quiet memhp_default_state=online swiotlb=noforce \
         fuse.keep_unchanged_cache=1 vmlet.share={share_tag} {extra}"
    )
    .trim_end()
    .to_owned()
}

#[derive(Debug, Clone)]
pub struct AgentBoot {
    pub kernel: String,
    pub initrd: String,
    pub cmdline: String,
    /// The node's virtiofsd (a template's identity names it).
    pub virtiofsd: String,
    /// The pod's share: what its virtiofsd exports, and the socket it serves.
    pub share_dir: String,
    pub share_socket: String,
    pub share_tag: String,
    pub vsock: VsockDevice,
    /// The file QEMU reads the agent's key from, into the fw_cfg entry the agent reads
    /// ([`vmlet_protocol::auth::FW_CFG_NAME`]).
    pub key_file: String,
}

#[derive(Debug, Clone)]
pub struct ImageDisks {
    /// The qcow2 overlay the VM writes (none with a `root_volume`).
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
    /// The shim's socket the VM's QEMU guest agent channel
    /// ([`crate::guest::guest_agent::PORT_NAME`]) connects to.
    pub guest_agent_socket: String,
    /// The container's filesystem volumes' share, when it has any.
    pub volumes: Option<VolumeShare>,
    /// The root on a block volume (persistent root), in place of the overlay.
    pub root_volume: Option<RootVolume>,
}

/// A persistent root ([`crate::vm_mode::persistent_root`]): `size` bytes of the host's block
/// device `device` from `offset` on, raw.
#[derive(Debug, Clone)]
pub struct RootVolume {
    pub device: String,
    /// The device's number (`major:minor`), as the pod's spec named it and the shim checked
    /// the node against it: whoever opens `device` again checks it is still that device.
    pub rdev: (u32, u32),
    pub offset: u64,
    pub size: u64,
}

/// A VM image's volumes over virtio-fs ([`crate::vm_mode::volumes`]): the directory the pod's
/// virtiofsd exports under the tag [`crate::vm_mode::volumes::TAG`], and its socket.
#[derive(Debug, Clone)]
pub struct VolumeShare {
    pub dir: String,
    pub socket: String,
}

/// A directory the VM reaches over virtio-fs: what the pod's virtiofsd exports (`dir`), the
/// socket it serves QEMU on, and the tag the guest mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share<'a> {
    pub dir: &'a str,
    pub socket: &'a str,
    pub tag: &'a str,
}

impl GuestBoot {
    /// vmlet's guest's share, or a VM image's volumes' (none: the VM has no virtio-fs).
    pub fn share(&self) -> Option<Share<'_>> {
        match self {
            GuestBoot::Agent(a) => Some(Share {
                dir: &a.share_dir,
                socket: &a.share_socket,
                tag: &a.share_tag,
            }),
            GuestBoot::Image(ImageDisks {
                volumes: Some(v), ..
            }) => Some(Share {
                dir: &v.dir,
                socket: &v.socket,
                tag: crate::vm_mode::volumes::TAG,
            }),
            GuestBoot::Image(_) => None,
        }
    }
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

/// Where the serial console (the guest's `ttyS0`) goes.
#[derive(Debug, Clone)]
pub enum ConsoleTarget {
    /// A file (written by libvirt's virtlogd): vmlet's guest, whose console only the shim
    /// and `vmletctl console` read.
    File(String),
    /// A Unix socket the shim listens on and QEMU connects: a VM image's console, which is
    /// its task's stdout and stdin ([`crate::vm_mode::serial_console`]).
    Socket(String),
}

/// How the guest's vsock device is provided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VsockDevice {
    /// Kernel vhost-vsock, CID chosen by libvirt.
    Vhost,
    /// `vhost-user-vsock-pci` connected to a `vhost-device-vsock` socket.
    VhostUser {
        socket: String,
        /// The shim's connection to `socket`, as QEMU inherits it (QEMU the shim starts:
        /// a template start hands it over the monitor instead); none: QEMU connects
        /// `socket` itself (libvirt's).
        connection: Option<i32>,
    },
}
