//! vmlet's libvirt: the [`VmManager`] that calls libvirt through the `virt` crate, for the
//! `vmlet-libvirt` helper (the shim's one libvirt call at a time, `vmlet_shim::vmm::libvirt_helper`)
//! and for `vmletctl`. Only these two programs map libvirt's libraries: the shim crate does
//! not depend on `virt`.

use virt::connect::Connect;
use virt::domain::Domain;
use vmlet_shim::vmm::libvirt_xml;
use vmlet_shim::vmm::pod_apparmor::{self, ProfileDir};
use vmlet_shim::vmm::{StartDomain, VmManager, VmletDomain};
use vmlet_shim::Error;

pub mod cli;

/// An undefine removes the domain's UEFI variables too (a VM image booted with OVMF has a
/// file of them in libvirt's directory); a domain without any is undefined as before.
const UNDEFINE_WITH_NVRAM: virt::sys::virDomainUndefineFlagsValues =
    virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM;

/// libvirt through the `virt` crate; one connection per call, opened from the URI. Where
/// libvirt confines QEMU with AppArmor, each domain it starts gets the pod's own profile
/// ([`vmlet_shim::vmm::pod_apparmor`]), removed with the domain.
pub struct Libvirt {
    uri: String,
    profiles: ProfileDir,
}

impl Libvirt {
    pub fn new(uri: &str) -> Self {
        Self {
            uri: uri.into(),
            profiles: ProfileDir::default(),
        }
    }

    /// Where libvirt confines QEMU with AppArmor, writes the pod's own profile for the
    /// defined `domain` from the files `start` names; the domain's UUID then.
    fn write_profile(
        &self,
        conn: &Connect,
        domain: &Domain,
        start: &StartDomain,
    ) -> Result<Option<String>, Error> {
        // Without its template libvirt has no AppArmor driver: no need to ask it.
        if !self.profiles.has_libvirts_template() {
            return Ok(None);
        }
        let capabilities = conn
            .get_capabilities()
            .map_err(|e| Error::Libvirt(format!("capabilities: {e}")))?;
        if !libvirt_xml::security_models(&capabilities)
            .iter()
            .any(|m| m == "apparmor")
        {
            return Ok(None);
        }
        let uuid = domain
            .get_uuid_string()
            .map_err(|e| Error::Libvirt(format!("the domain's UUID: {e}")))?;
        let profile = pod_apparmor::profile(&uuid, &start.pod_id, &start.apparmor_files)?;
        self.profiles.write(&uuid, &profile)?;
        Ok(Some(uuid))
    }

    fn with_conn<T>(&self, f: impl FnOnce(&Connect) -> Result<T, Error>) -> Result<T, Error> {
        let mut conn = Connect::open(Some(&self.uri))
            .map_err(|e| Error::Libvirt(format!("connect to {}: {e}", self.uri)))?;
        let result = f(&conn);
        let _ = conn.close();
        result
    }

    /// [`VmManager::remove`] on an open connection.
    fn remove_on(&self, conn: &Connect, name: &str) -> Result<(), Error> {
        let domain = match Domain::lookup_by_name(conn, name) {
            Ok(d) => d,
            Err(e) if is_no_domain(&e) => return Ok(()),
            Err(e) => return Err(Error::Libvirt(format!("look up {name}: {e}"))),
        };
        // Its profile (if vmlet wrote one) goes with it: libvirt unloads it but leaves
        // the file.
        let uuid = domain.get_uuid_string().ok();
        if domain.is_active().unwrap_or(false) {
            if let Err(e) = domain.destroy() {
                // A concurrent removal (a kill of the pod) may have ended it first, and
                // may undefine it between any two of these calls.
                let running = Domain::lookup_by_name(conn, name).and_then(|d| d.is_active());
                match running {
                    Err(gone) if is_no_domain(&gone) => return Ok(()),
                    Ok(false) => {}
                    _ => return Err(Error::Libvirt(format!("destroy {name}: {e}"))),
                }
            }
        }
        match domain.undefine_flags(UNDEFINE_WITH_NVRAM) {
            Ok(()) => {}
            Err(e) if is_no_domain(&e) => {}
            Err(e) => return Err(Error::Libvirt(format!("undefine {name}: {e}"))),
        }
        uuid.map_or(Ok(()), |uuid| self.profiles.remove(&uuid))
    }
}

/// What a start error of libvirt's means for vmlet's node, where it says more than libvirt.
fn start_hint(e: &virt::error::Error) -> &'static str {
    let message = e.message();
    if message.contains("master-key.aes") && message.contains("Permission denied") {
        // Each pod's QEMU runs as a user of its own (the domain's static DAC label).
        " (the pod's QEMU runs as a user of its own, which libvirt's state directory does not let through: `vmletctl check` says, `vmletctl install` gives others search permission on /var/lib/libvirt/qemu)"
    } else {
        ""
    }
}

fn is_no_domain(e: &virt::error::Error) -> bool {
    matches!(e.code(), virt::error::ErrorNumber::NoDomain)
}

impl VmManager for Libvirt {
    fn kvm_usable(&self, emulator: &str, machine: &str) -> bool {
        self.with_conn(|conn| {
            Ok(conn
                .get_domain_capabilities(
                    Some(emulator),
                    Some("x86_64"),
                    Some(machine),
                    Some("kvm"),
                    0,
                )
                .is_ok())
        })
        .unwrap_or(false)
    }

    fn start(&self, start: &StartDomain) -> Result<(), Error> {
        self.with_conn(|conn| {
            // A domain of this name that vmlet marked as this pod id's is an earlier pod's of
            // the id whose teardown never ran (the node rebooted: libvirt keeps definitions).
            // The shim holds the id's lock and made its state directory new, so no live pod
            // has it: removed first, else the define would fail on the name. Any other
            // domain of the name is left for the define to refuse.
            let name = vmlet_shim::host::pod_paths::domain_name(&start.pod_id);
            let earlier = Domain::lookup_by_name(conn, &name)
                .and_then(|d| d.get_xml_desc(0))
                .ok()
                .and_then(|xml| libvirt_xml::pod_id_in(&xml));
            if earlier.as_deref() == Some(start.pod_id.as_str()) {
                self.remove_on(conn, &name)?;
            }
            let domain = Domain::define_xml(conn, &start.xml)
                .map_err(|e| Error::Libvirt(format!("define domain: {e}")))?;
            let profile = match self.write_profile(conn, &domain, start) {
                Ok(profile) => profile,
                Err(e) => {
                    let _ = domain.undefine_flags(UNDEFINE_WITH_NVRAM);
                    return Err(e);
                }
            };
            if let Err(e) = domain.create() {
                let _ = domain.undefine_flags(UNDEFINE_WITH_NVRAM);
                if let Some(uuid) = profile {
                    let _ = self.profiles.remove(&uuid);
                }
                return Err(Error::Libvirt(format!(
                    "start domain: {e}{}",
                    start_hint(&e)
                )));
            }
            Ok(())
        })
    }

    fn remove(&self, name: &str) -> Result<(), Error> {
        self.with_conn(|conn| self.remove_on(conn, name))
    }

    fn live_xml(&self, name: &str) -> Result<String, Error> {
        self.with_conn(|conn| {
            Domain::lookup_by_name(conn, name)
                .and_then(|d| d.get_xml_desc(0))
                .map_err(|e| Error::Libvirt(format!("read XML of {name}: {e}")))
        })
    }

    fn vmlet_domains(&self) -> Result<Vec<VmletDomain>, Error> {
        self.with_conn(|conn| {
            let domains = conn
                .list_all_domains(0)
                .map_err(|e| Error::Libvirt(format!("list domains: {e}")))?;
            let mut found = Vec::new();
            for d in domains {
                let (Ok(name), Ok(xml)) = (d.get_name(), d.get_xml_desc(0)) else {
                    continue; // gone meanwhile
                };
                if let Some(pod_id) = libvirt_xml::pod_id_in(&xml) {
                    found.push(VmletDomain {
                        name,
                        pod_id,
                        active: d.is_active().unwrap_or(false),
                    });
                }
            }
            Ok(found)
        })
    }

    fn qemu_pid_file(&self, name: &str) -> Result<std::path::PathBuf, Error> {
        vmlet_shim::vmm::libvirt_daemon::qemu_pid_file(&self.uri, name)
    }

    fn is_active(&self, name: &str) -> Result<bool, Error> {
        self.with_conn(|conn| match Domain::lookup_by_name(conn, name) {
            Ok(d) => d
                .is_active()
                .map_err(|e| Error::Libvirt(format!("state of {name}: {e}"))),
            Err(e) if is_no_domain(&e) => Ok(false),
            Err(e) => Err(Error::Libvirt(format!("look up {name}: {e}"))),
        })
    }
}

/// What `vmletctl check` asks libvirt about the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibvirtHost {
    /// libvirt's version, e.g. 9.0.0.
    pub version: String,
    /// The hypervisor driver's version (QEMU's, for qemu:///system).
    pub hypervisor_version: String,
    /// The security drivers of the host's capabilities (`<secmodel><model>`), e.g. `none`,
    /// `apparmor`, `selinux`, `dac`.
    pub security_models: Vec<String>,
}

impl Libvirt {
    /// libvirt's versions and security drivers; an error when it cannot be reached.
    pub fn host(&self) -> Result<LibvirtHost, Error> {
        let dotted = |v: u32| format!("{}.{}.{}", v / 1_000_000, v / 1000 % 1000, v % 1000);
        self.with_conn(|conn| {
            let ask = |what: &str, e: virt::error::Error| Error::Libvirt(format!("{what}: {e}"));
            let version = conn.get_lib_version().map_err(|e| ask("version", e))?;
            let hypervisor = conn
                .get_hyp_version()
                .map_err(|e| ask("hypervisor version", e))?;
            let capabilities = conn
                .get_capabilities()
                .map_err(|e| ask("capabilities", e))?;
            Ok(LibvirtHost {
                version: dotted(version),
                hypervisor_version: dotted(hypervisor),
                security_models: libvirt_xml::security_models(&capabilities),
            })
        })
    }
}
