//! Where the helper programs of the node config's `[helpers]` are.

use std::path::PathBuf;

use serde::Deserialize;

/// Paths of the helper programs the shim and libvirt start.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HelperPaths {
    /// The QEMU binary `vmlet-vmwrapper` executes.
    pub qemu: PathBuf,
    /// `vmlet-vmwrapper`, the domain's `<emulator>`.
    pub vmwrapper: PathBuf,
    /// `vmlet-libvirt`, which makes the shim's libvirt calls (one process per call).
    pub libvirt: PathBuf,
    /// `virtiofsd`, started by libvirt for the shared directory.
    pub virtiofsd: PathBuf,
    /// `vhost-device-vsock`, started by the shim for the vhost-user vsock transport.
    pub vhost_device_vsock: PathBuf,
    /// AppArmor's `apparmor_parser`, with which the shim loads the profile of each pod's
    /// QEMU it starts itself (the direct launcher, which `auto` chooses only where it is
    /// there) on a node where AppArmor is on.
    pub apparmor_parser: PathBuf,
}

impl Default for HelperPaths {
    fn default() -> Self {
        Self {
            qemu: PathBuf::from("/usr/bin/qemu-system-x86_64"),
            vmwrapper: PathBuf::from("/usr/local/bin/vmlet-vmwrapper"),
            libvirt: PathBuf::from("/usr/local/bin/vmlet-libvirt"),
            virtiofsd: PathBuf::from("/usr/local/bin/virtiofsd"),
            vhost_device_vsock: PathBuf::from("/usr/local/bin/vhost-device-vsock"),
            apparmor_parser: PathBuf::from("/usr/sbin/apparmor_parser"),
        }
    }
}
