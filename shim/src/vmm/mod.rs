//! The VM as libvirt and QEMU are told it: its one description ([`vm_spec`], each device's
//! slot from [`pci_slots`]), rendered as domain XML ([`domain`]) with the pod's AppArmor
//! profile ([`pod_apparmor`]); and the VM manager seam that starts it: libvirt (the
//! `vmlet-libvirt` crate, which `vmletctl` and the `vmlet-libvirt` helper link; the shim goes
//! through that helper, see [`libvirt_helper`]), a fake in unit tests. Calls block; callers
//! run them on a blocking thread.

pub(crate) mod domain;
pub mod kvm_probe;
pub mod launcher_choice;
pub mod libvirt_daemon;
pub mod libvirt_helper;
pub mod libvirt_xml;
pub mod pci_slots;
pub mod pod_apparmor;
pub mod qemu_command;
pub mod qemu_image;
pub mod uefi_firmware;
pub mod vm_spec;

#[cfg(any(test, feature = "fakes"))]
use std::sync::Mutex;

use crate::Error;

pub trait VmManager: Send + Sync + 'static {
    /// Whether libvirt can run `machine` guests of this emulator with KVM here.
    fn kvm_usable(&self, emulator: &str, machine: &str) -> bool;
    /// Defines and starts a domain (with the pod's AppArmor profile, where libvirt confines
    /// QEMU with AppArmor); leaves nothing defined if the start fails.
    fn start(&self, domain: &StartDomain) -> Result<(), Error>;
    /// Stops (if running) and undefines the domain, with its UEFI variables; no such domain
    /// is not an error.
    fn remove(&self, name: &str) -> Result<(), Error>;
    /// The live XML of a running domain.
    fn live_xml(&self, name: &str) -> Result<String, Error>;
    /// Whether the domain is running; no such domain is "not running".
    fn is_active(&self, name: &str) -> Result<bool, Error>;
    /// Every domain (running or only defined) carrying vmlet's pod metadata: its name,
    /// pod id and whether it runs. Domains without the mark are not vmlet's.
    fn vmlet_domains(&self) -> Result<Vec<VmletDomain>, Error>;
    /// The file where libvirt keeps the PID of domain `name`'s QEMU once it started it
    /// (written before QEMU's program runs), as the shim reaches it: the connections the
    /// shim takes for that QEMU are pinned to that PID
    /// ([`crate::host::qemu_peer::QemuPid::InFile`]).
    fn qemu_pid_file(&self, name: &str) -> Result<std::path::PathBuf, Error>;
}

/// What starting a pod's domain takes ([`domain::start_request`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartDomain {
    pub pod_id: String,
    /// The domain XML.
    pub xml: String,
    /// What QEMU opens beside libvirt's model of the domain, for the pod's AppArmor profile.
    pub apparmor_files: Vec<pod_apparmor::PodFile>,
}

#[cfg(any(test, feature = "fakes"))]
impl StartDomain {
    /// A domain named `name` of pod `pod_id` with nothing else (for fakes, which read
    /// only its name).
    pub fn named(name: &str, pod_id: &str) -> Self {
        StartDomain {
            pod_id: pod_id.into(),
            xml: format!("<domain><name>{name}</name></domain>"),
            apparmor_files: Vec::new(),
        }
    }
}

/// A domain vmlet made (its metadata names the pod).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmletDomain {
    pub name: String,
    pub pod_id: String,
    pub active: bool,
}

/// An in-memory VM manager for unit tests: records what was started and removed.
#[cfg(any(test, feature = "fakes"))]
#[derive(Default)]
pub struct FakeVmm {
    pub running: Mutex<Vec<String>>,
}

#[cfg(any(test, feature = "fakes"))]
impl VmManager for FakeVmm {
    fn kvm_usable(&self, _: &str, _: &str) -> bool {
        false
    }

    fn start(&self, domain: &StartDomain) -> Result<(), Error> {
        let name = domain
            .xml
            .split("<name>")
            .nth(1)
            .and_then(|s| s.split("</name>").next())
            .unwrap_or_default()
            .to_owned();
        self.running.lock().unwrap().push(name);
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), Error> {
        self.running.lock().unwrap().retain(|n| n != name);
        Ok(())
    }

    fn live_xml(&self, name: &str) -> Result<String, Error> {
        Err(Error::NotFound(format!("domain {name}")))
    }

    fn is_active(&self, name: &str) -> Result<bool, Error> {
        Ok(self.running.lock().unwrap().iter().any(|n| n == name))
    }

    fn vmlet_domains(&self) -> Result<Vec<VmletDomain>, Error> {
        Ok(self
            .running
            .lock()
            .unwrap()
            .iter()
            .filter_map(|n| {
                Some(VmletDomain {
                    name: n.clone(),
                    pod_id: n.strip_prefix("vmlet-")?.to_owned(),
                    active: true,
                })
            })
            .collect())
    }

    /// The fake starts no QEMU: a file no one writes.
    fn qemu_pid_file(&self, name: &str) -> Result<std::path::PathBuf, Error> {
        Ok(std::path::Path::new("/nonexistent/vmlet-fake-vmm").join(format!("{name}.pid")))
    }
}
