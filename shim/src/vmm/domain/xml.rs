//! The domain XML's elements as typed structs, one per element libvirt reads; serde +
//! quick-xml render them ([`super::Domain::to_xml`]). What goes into them is
//! [`super::Domain::new`]'s.

use serde::Serialize;

use super::attrs::{DirAttr, Empty, ModeAttr, NameAttr, SocketAttr, TypeAttr};
use super::disk_xml::{Disk, Seclabel};

#[derive(Debug, Serialize)]
#[serde(rename = "domain")]
pub struct Domain {
    #[serde(rename = "@type")]
    pub kind: String,
    #[serde(rename = "@xmlns:qemu")]
    pub qemu_ns: &'static str,
    pub name: String,
    pub metadata: Metadata,
    /// Set when the VM can grow ([`MemoryDevice`]): the boot memory plus the device's region.
    #[serde(rename = "maxMemory", skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<MaxMemory>,
    pub memory: Memory,
    pub vcpu: u32,
    #[serde(rename = "memoryBacking")]
    pub memory_backing: MemoryBacking,
    pub os: Os,
    pub features: Features,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    pub on_poweroff: &'static str,
    pub on_reboot: &'static str,
    pub on_crash: &'static str,
    pub devices: Devices,
    /// The pod's own user for its QEMU ([`Seclabel::pod_user`]).
    pub seclabel: Seclabel,
    #[serde(rename = "qemu:commandline")]
    pub qemu_commandline: QemuCommandline,
}

#[derive(Debug, Serialize)]
pub struct Metadata {
    #[serde(rename = "vmlet:pod")]
    pub pod: VmletPod,
}

#[derive(Debug, Serialize)]
pub struct VmletPod {
    #[serde(rename = "@xmlns:vmlet")]
    pub ns: &'static str,
    #[serde(rename = "@id")]
    pub id: String,
}

#[derive(Debug, Serialize)]
pub struct Memory {
    #[serde(rename = "@unit")]
    pub unit: &'static str,
    #[serde(rename = "$text")]
    pub value: u64,
}

#[derive(Debug, Serialize)]
pub struct MaxMemory {
    #[serde(rename = "@slots")]
    pub slots: u32,
    #[serde(rename = "@unit")]
    pub unit: &'static str,
    #[serde(rename = "$text")]
    pub value: u64,
}

#[derive(Debug, Serialize)]
pub struct MemoryBacking {
    pub source: TypeAttr,
    pub access: ModeAttr,
}

/// `<os>`: the machine (vmlet's guest boots its kernel directly: [`super::qemu_commandline`]),
/// and the firmware that boots the first disk of a VM image.
#[derive(Debug, Serialize)]
pub struct Os {
    /// `efi`: libvirt picks UEFI firmware (OVMF) that has what `firmware` asks.
    #[serde(rename = "@firmware", skip_serializing_if = "Option::is_none")]
    pub firmware_kind: Option<&'static str>,
    #[serde(rename = "type")]
    pub kind: OsType,
    #[serde(rename = "firmware", skip_serializing_if = "Option::is_none")]
    pub firmware: Option<FirmwareFeatures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootDev>,
}

/// Firmware features libvirt's choice must have (or not have).
#[derive(Debug, Serialize)]
pub struct FirmwareFeatures {
    pub feature: Vec<FirmwareFeature>,
}

#[derive(Debug, Serialize)]
pub struct FirmwareFeature {
    #[serde(rename = "@enabled")]
    pub enabled: &'static str,
    #[serde(rename = "@name")]
    pub name: &'static str,
}

#[derive(Debug, Serialize)]
pub struct BootDev {
    #[serde(rename = "@dev")]
    pub dev: &'static str,
}

#[derive(Debug, Serialize)]
pub struct OsType {
    #[serde(rename = "@arch")]
    pub arch: &'static str,
    #[serde(rename = "@machine")]
    pub machine: String,
    #[serde(rename = "$text")]
    pub value: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Features {
    pub acpi: Empty,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcg: Option<Tcg>,
}

/// TCG's settings (a domain of type `qemu` only).
#[derive(Debug, Serialize)]
pub struct Tcg {
    #[serde(rename = "tb-cache")]
    pub tb_cache: Memory,
}

#[derive(Debug, Serialize, PartialEq, Eq, Default)]
pub struct Cpu {
    #[serde(rename = "@mode", skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(rename = "@match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<String>,
    #[serde(rename = "@check", skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<CpuModelXml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    #[serde(rename = "feature")]
    pub features: Vec<CpuFeatureXml>,
    /// One NUMA cell holding every vCPU and the boot memory: libvirt wants it for a
    /// virtio-mem device (whose memory goes to that node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<Numa>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Numa {
    pub cell: NumaCell,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct NumaCell {
    #[serde(rename = "@id")]
    pub id: u32,
    #[serde(rename = "@cpus")]
    pub cpus: String,
    #[serde(rename = "@memory")]
    pub memory: u64,
    #[serde(rename = "@unit")]
    pub unit: &'static str,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct CpuModelXml {
    #[serde(rename = "@fallback", skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    #[serde(rename = "$text")]
    pub name: String,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct CpuFeatureXml {
    #[serde(rename = "@policy")]
    pub policy: String,
    #[serde(rename = "@name")]
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct Devices {
    pub emulator: String,
    pub disk: Vec<Disk>,
    pub filesystem: Vec<Filesystem>,
    pub serial: Serial,
    pub channel: Vec<Channel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsock: Option<Vsock>,
    pub controller: Vec<Controller>,
    pub memballoon: Memballoon,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryDevice>,
}

/// The VM's balloon: none (libvirt would add one unless told `none`), or a virtio balloon
/// that only reports the guest's free pages, so that the host takes them back (it is never
/// inflated).
#[derive(Debug, Serialize)]
pub struct Memballoon {
    #[serde(rename = "@model")]
    pub model: &'static str,
    #[serde(rename = "@freePageReporting", skip_serializing_if = "Option::is_none")]
    pub free_page_reporting: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<PciAddress>,
}

impl Memballoon {
    /// No balloon device.
    pub fn none() -> Self {
        Self {
            model: "none",
            free_page_reporting: None,
            address: None,
        }
    }

    /// A virtio balloon at `slot` with free page reporting on.
    pub fn reporting_free_pages(slot: usize) -> Self {
        Self {
            model: "virtio",
            free_page_reporting: Some("on"),
            address: Some(PciAddress::root_bus(slot)),
        }
    }
}

/// A virtio-mem device: a region the shim plugs into the running guest block by block
/// (`requested`, through vmlet's QMP monitor) when the pod's containers need more memory
/// than the VM booted with (`crate::devices::memory`).
#[derive(Debug, Serialize)]
pub struct MemoryDevice {
    #[serde(rename = "@model")]
    pub model: &'static str,
    pub target: MemoryTarget,
    pub alias: NameAttr,
    pub address: PciAddress,
}

#[derive(Debug, Serialize)]
pub struct MemoryTarget {
    pub size: Memory,
    pub node: u32,
    pub block: Memory,
    pub requested: Memory,
}

#[derive(Debug, Serialize)]
pub struct PciAddress {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    #[serde(rename = "@domain")]
    pub domain: &'static str,
    #[serde(rename = "@bus")]
    pub bus: &'static str,
    #[serde(rename = "@slot")]
    pub slot: String,
    #[serde(rename = "@function")]
    pub function: &'static str,
}

impl PciAddress {
    /// Function 0 of `slot` on the root bus (`pcie.0`), where [`crate::vmm::pci_slots`] places
    /// vmlet's devices.
    pub fn root_bus(slot: usize) -> Self {
        Self {
            kind: "pci",
            domain: "0x0000",
            bus: "0x00",
            slot: crate::vmm::pci_slots::hex(slot),
            function: "0x0",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Filesystem {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    pub driver: TypeAttr,
    pub source: SocketAttr,
    pub target: DirAttr,
}

#[derive(Debug, Serialize)]
pub struct Serial {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    pub source: SerialSource,
}

/// A serial port's file, or the socket QEMU connects (`mode="connect"`).
#[derive(Debug, Serialize)]
pub struct SerialSource {
    #[serde(rename = "@mode", skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    #[serde(rename = "@path")]
    pub path: String,
}

/// A virtio-serial port whose other end is a socket QEMU connects (libvirt adds the
/// virtio-serial controller).
#[derive(Debug, Serialize)]
pub struct Channel {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    pub source: SerialSource,
    pub target: ChannelTarget,
}

#[derive(Debug, Serialize)]
pub struct ChannelTarget {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    #[serde(rename = "@name")]
    pub name: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Vsock {
    #[serde(rename = "@model")]
    pub model: &'static str,
    pub cid: Cid,
}

#[derive(Debug, Serialize)]
pub struct Cid {
    #[serde(rename = "@auto")]
    pub auto: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Controller {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    #[serde(rename = "@model")]
    pub model: &'static str,
}

#[derive(Debug, Serialize, Default)]
pub struct QemuCommandline {
    #[serde(rename = "qemu:arg")]
    pub args: Vec<QemuArg>,
    #[serde(rename = "qemu:env")]
    pub env: Vec<QemuEnv>,
}

#[derive(Debug, Serialize)]
pub struct QemuArg {
    #[serde(rename = "@value")]
    pub value: String,
}

#[derive(Debug, Serialize)]
pub struct QemuEnv {
    #[serde(rename = "@name")]
    pub name: String,
    #[serde(rename = "@value")]
    pub value: String,
}
