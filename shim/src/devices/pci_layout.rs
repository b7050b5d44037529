//! Every slot vmlet gives a device on the VM's root bus (`pcie.0`), in one place. libvirt
//! places its own devices (its root ports, controllers, the virtio-fs and serial devices)
//! from slot 1 up and never reaches 0x10 with vmlet's domains; vmlet's devices sit above:
//!
//! | slots       | device                                                       |
//! |-------------|--------------------------------------------------------------|
//! | 0x10        | `vhost-user-vsock-pci` (when the vsock is vhost-user); a VM   |
//! |             | image's NVMe root disk (a VM image has no vsock)             |
//! | 0x11        | the `virtio-mem` device the VM grows by                      |
//! | 0x12 - 0x19 | one `virtio-net-pci` per tap ([`MAX_NICS`])                  |
//! | 0x1a - 0x1d | `pcie-root-port`s for hot-plugged disks ([`HOTPLUG_PORTS`]) |
//! | 0x1e        | the `virtio-balloon` (with `guest.free_page_reporting` only)  |
//!
//! (0x1f is the q35 chipset's.)

/// The vhost-user vsock device.
pub const VSOCK: usize = 0x10;
/// A VM image's root disk on NVMe: the vsock's slot, which a VM image does not use.
pub const IMAGE_ROOT_NVME: usize = VSOCK;
/// The virtio-mem device.
pub const MEMORY_DEVICE: usize = 0x11;
/// The first NIC; the others follow.
pub const FIRST_NIC: usize = 0x12;
/// Most NICs (taps) one VM gets.
pub const MAX_NICS: usize = 8;
/// The first hot-plug root port; the others follow.
pub const FIRST_HOTPLUG_PORT: usize = 0x1a;
/// Hot-plug root ports each VM gets (each PCI disk takes one; SCSI disks share one).
pub const HOTPLUG_PORTS: usize = 4;
/// The balloon (free page reporting only, when the node turns it on).
pub const BALLOON: usize = 0x1e;
/// Slots on one PCI bus; the last is the chipset's (LPC, SATA, SMBus on q35).
const SLOTS: usize = 31;

const _: () = assert!(VSOCK < MEMORY_DEVICE && MEMORY_DEVICE < FIRST_NIC);
const _: () = assert!(FIRST_NIC + MAX_NICS <= FIRST_HOTPLUG_PORT);
const _: () = assert!(FIRST_HOTPLUG_PORT + HOTPLUG_PORTS <= BALLOON && BALLOON < SLOTS);

/// A slot as libvirt and QEMU write it (`0x12`).
pub fn hex(slot: usize) -> String {
    format!("{slot:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_devices_share_a_slot() {
        let mut taken = vec![VSOCK, MEMORY_DEVICE, BALLOON];
        taken.extend(FIRST_NIC..FIRST_NIC + MAX_NICS);
        taken.extend(FIRST_HOTPLUG_PORT..FIRST_HOTPLUG_PORT + HOTPLUG_PORTS);
        let mut unique = taken.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), taken.len());
        assert!(taken.iter().all(|s| (0x10..SLOTS).contains(s)));
        assert_eq!(hex(FIRST_NIC), "0x12");
    }
}
