//! The slots vmlet's devices take on the VM's root bus (`pcie.0`), handed out by a small
//! allocator. libvirt places its own devices (its root ports, controllers, the virtio-fs
//! and serial devices) from slot 1 up and never reaches [`FIRST`] with vmlet's domains;
//! vmlet's sit above, each kind in a range of its own whatever else the VM has, so that a
//! device keeps its address (and the guest its name for it, `enp0s18`) from pod to pod:
//!
//! | slots       | device                                                        |
//! |-------------|---------------------------------------------------------------|
//! | 0x10        | `vhost-user-vsock-pci` (when the vsock is vhost-user), or a VM |
//! |             | image's NVMe root disk (a VM image has no vsock)              |
//! | 0x11        | the `virtio-mem` device the VM grows by                       |
//! | 0x12 - 0x19 | one `virtio-net-pci` per tap ([`MAX_NICS`])                   |
//! | 0x1a - 0x1d | `pcie-root-port`s for hot-plugged disks ([`HOTPLUG_PORTS`])   |
//! | 0x1e        | the `virtio-balloon` (with `guest.free_page_reporting` only)   |
//!
//! (0x1f is the q35 chipset's.) A VM of a template start has a `pcie-root-port` at the slot
//! of its vsock device and of each NIC instead, and the device behind it on the port's bus
//! (plugged in after the load): the same slot from pod to pod, another address than a cold
//! boot's. [`PciSlots::assign`] is the one place this order is made;
//! [`crate::vmm::vm_spec::VmSpec`] carries the result to everything that names a slot.

use std::ops::Range;

/// The first slot vmlet gives.
pub const FIRST: usize = 0x10;
/// Slots on one PCI bus; the last is the chipset's (LPC, SATA, SMBus on q35).
const END: usize = 0x1f;
/// Most NICs (taps) one VM gets.
pub const MAX_NICS: usize = 8;
/// Hot-plug root ports each VM gets (each PCI disk takes one; SCSI disks share one).
pub const HOTPLUG_PORTS: usize = 4;

/// Hands out consecutive slots from [`FIRST`]; never the chipset's (0x1f).
struct Allocator {
    next: usize,
}

impl Allocator {
    /// The next `n` slots. The bus has room for every kind vmlet makes (a compile-time
    /// fact of [`PciSlots::assign`], checked by its test); running out is a bug.
    const fn take(&mut self, n: usize) -> Range<usize> {
        let start = self.next;
        self.next += n;
        assert!(self.next <= END, "vmlet's devices fill the root bus");
        start..self.next
    }
}

/// The slot of each of vmlet's devices in one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciSlots {
    /// The vhost-user vsock device, or a VM image's root disk on NVMe (a VM image has no
    /// vsock).
    pub vsock_or_root: usize,
    /// The virtio-mem device.
    pub memory: usize,
    /// One per NIC, in the NICs' order.
    pub nics: Range<usize>,
    /// The hot-plug root ports.
    pub hotplug_ports: Range<usize>,
    /// The balloon (free page reporting only, when the node turns it on).
    pub balloon: usize,
}

impl PciSlots {
    /// Every kind's slots, in the order of the module's table. A guest names its devices by
    /// slot: a new kind of device is taken after the others, never between them.
    pub const fn assign() -> Self {
        let mut slots = Allocator { next: FIRST };
        let vsock_or_root = slots.take(1).start;
        let memory = slots.take(1).start;
        let nics = slots.take(MAX_NICS);
        let hotplug_ports = slots.take(HOTPLUG_PORTS);
        let balloon = slots.take(1).start;
        PciSlots {
            vsock_or_root,
            memory,
            nics,
            hotplug_ports,
            balloon,
        }
    }
}

/// A compile-time check that the layout fits the bus.
const _: PciSlots = PciSlots::assign();

/// A slot as libvirt and QEMU write it (`0x12`).
pub fn hex(slot: usize) -> String {
    format!("{slot:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_devices_share_a_slot_and_each_kind_keeps_its_own() {
        let s = PciSlots::assign();
        let mut taken = vec![s.vsock_or_root, s.memory, s.balloon];
        taken.extend(s.nics.clone());
        taken.extend(s.hotplug_ports.clone());
        let mut unique = taken.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), taken.len());
        assert!(taken.iter().all(|s| (FIRST..END).contains(s)));
        assert_eq!(
            (
                s.vsock_or_root,
                s.memory,
                s.nics.start,
                s.hotplug_ports.start,
                s.balloon
            ),
            (0x10, 0x11, 0x12, 0x1a, 0x1e),
            "a device's slot is its address in every guest: it never moves"
        );
        assert_eq!(hex(s.nics.start), "0x12");
    }

    #[test]
    #[should_panic(expected = "fill the root bus")]
    fn the_allocator_never_hands_out_the_chipsets_slot() {
        Allocator { next: FIRST }.take(END - FIRST + 1);
    }
}
