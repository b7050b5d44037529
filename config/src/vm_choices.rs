//! The typed choices a pod's annotations make of its VM (disk driver, CPU model, image
//! type, cloud-init's network and data source, firmware): what [`crate::PodAnnotations`]
//! holds once [`crate::annotations`] has parsed them.

use crate::cpu_setting::CpuSetting;

/// How a pod's block devices are attached to its VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiskDriver {
    /// virtio-blk: `/dev/vdX` in the guest.
    Virtio,
    /// virtio-scsi behind one controller: `/dev/sdX` (the seeds' default).
    #[default]
    Scsi,
    /// NVMe: `/dev/nvmeXn1`.
    Nvme,
}

impl DiskDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskDriver::Virtio => "virtio",
            DiskDriver::Scsi => "scsi",
            DiskDriver::Nvme => "nvme",
        }
    }
}

/// The guest CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuModel {
    /// libvirt `host-passthrough` (KVM only).
    HostPassthrough,
    /// libvirt `host-model` (KVM only).
    HostModel,
    /// A named libvirt/QEMU CPU model (`Skylake-Client`, `qemu64`, ...).
    Named(String),
    /// libvirt's `<cpu>` spelled out (`VirtletLibvirtCPUSetting`).
    Libvirt(CpuSetting),
}

impl CpuModel {
    /// libvirt's mode name of a host CPU model (`host-model`, `host-passthrough`), which
    /// needs KVM; `None` for a named model.
    pub fn host_mode(&self) -> Option<&'static str> {
        match self {
            CpuModel::HostPassthrough => Some("host-passthrough"),
            CpuModel::HostModel => Some("host-model"),
            CpuModel::Named(_) => None,
            CpuModel::Libvirt(setting) => setting.host_mode(),
        }
    }
}

/// What a pod's container image is (`vmlet.io/image-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageType {
    /// A container image: its root file system is the container's.
    #[default]
    Container,
    /// A carrier of a VM disk image (one `qcow2` or raw file under `/disk/`, KubeVirt's
    /// containerDisk convention) that the pod boots as a whole VM.
    Vm,
}

/// What a VM-mode pod's cloud-init seed says of the network
/// (`vmlet.io/cloud-init-network-config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloudInitNetwork {
    /// A network-config (version 2) with the pod's addresses, routes and DNS.
    #[default]
    V2,
    /// No network-config: the image configures its network itself (cloud-init's fallback is
    /// DHCP on the first interface), and vmlet's DHCP responder gives it the pod's address.
    None,
}

/// The data source a VM-mode pod's seed is made for (`VirtletCloudInitImageType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeedSource {
    /// cloud-init's NoCloud: `meta-data`, `user-data`, `network-config` on a volume
    /// labelled `cidata`.
    #[default]
    NoCloud,
    /// OpenStack's config drive: `openstack/latest/` on a volume labelled `config-2`.
    ConfigDrive,
}

/// The firmware that boots a VM-mode pod's disk (`vmlet.io/firmware`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Firmware {
    /// SeaBIOS: the disk's boot sector.
    #[default]
    Bios,
    /// OVMF (UEFI, without secure boot): the EFI system partition's boot loader.
    Uefi,
}
