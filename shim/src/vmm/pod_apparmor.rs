//! Each pod's own AppArmor profile, where libvirt confines QEMU with AppArmor (Debian's
//! and Ubuntu's default `security_driver`).
//!
//! libvirt names a VM's profile `libvirt-UUID`. Starting a domain, it has `virt-aa-helper`
//! write the files the domain XML names into `/etc/apparmor.d/libvirt/libvirt-UUID.files`
//! and load the profile file `libvirt-UUID` beside it, which it first writes from
//! `TEMPLATE.qemu` unless that file is already there. vmlet writes that file itself, after
//! defining the domain and before starting it: libvirt's template (the `libvirt-qemu`
//! abstraction and the `.files` libvirt writes) plus what vmlet passes to QEMU beside
//! libvirt's model (`<qemu:commandline>`: the emulator wrapper, the tap, vsock and QMP
//! sockets, a VM image's root disk on NVMe), for this pod's paths only. One pod's QEMU
//! thus reaches none of another pod's files.
//!
//! The shim names those files beside the domain XML in its start request
//! ([`crate::vmm::vm_spec::VmSpec::apparmor_files`], [`crate::vmm::StartDomain`]);
//! `vmlet-libvirt` writes the profile from them when libvirt's security driver is AppArmor,
//! and removes it with the domain (libvirt unloads it, but leaves the file). Tested by
//! `scripts/check-apparmor`: a pod's profile reads its own disk and not another pod's.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::Error;

/// Where libvirt keeps its VMs' profiles (its `APPARMOR_DIR/libvirt`).
pub const PROFILE_DIR: &str = "/etc/apparmor.d/libvirt";
/// libvirt's template for the profiles of its QEMU VMs.
const TEMPLATE: &str = "TEMPLATE.qemu";
/// The first line of every profile vmlet writes: only such files are vmlet's to remove.
const MARK: &str = "# vmlet: this pod's QEMU profile";
/// The most of a profile file [`ProfileDir::remove`] reads to find vmlet's mark.
const MARK_READ_LIMIT: u64 = 4096;

/// What a pod's QEMU may do with a file; in the start request, its AppArmor letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "&str", try_from = "String")]
pub enum Access {
    /// Run it in the same profile (the emulator wrapper).
    Exec,
    /// Read (the agent's key, as QEMU starts).
    Read,
    /// Read and lock (a VM image's disk, behind its overlay).
    ReadLock,
    /// Read and write (a socket it connects).
    ReadWrite,
    /// Read, write and lock (a disk it writes).
    ReadWriteLock,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Exec => "rmix",
            Access::Read => "r",
            Access::ReadLock => "rk",
            Access::ReadWrite => "rw",
            Access::ReadWriteLock => "rwk",
        }
    }

    pub fn parse(text: &str) -> Result<Self, Error> {
        [
            Access::Exec,
            Access::Read,
            Access::ReadLock,
            Access::ReadWrite,
            Access::ReadWriteLock,
        ]
        .into_iter()
        .find(|a| a.as_str() == text)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{text:?}: not an access vmlet grants a pod's QEMU (rmix, r, rk, rw, rwk)"
            ))
        })
    }
}

impl From<Access> for &'static str {
    fn from(access: Access) -> Self {
        access.as_str()
    }
}

impl TryFrom<String> for Access {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        Access::parse(&text).map_err(|e| e.message())
    }
}

/// One file of a pod's profile.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodFile {
    pub path: String,
    pub access: Access,
}

/// A libvirt profile name's UUID: 36 lowercase hex digits and dashes, as libvirt writes it.
fn checked_uuid(uuid: &str) -> Result<&str, Error> {
    let dashes = [8, 13, 18, 23];
    let ok = uuid.len() == 36
        && uuid.char_indices().all(|(i, c)| {
            if dashes.contains(&i) {
                c == '-'
            } else {
                c.is_ascii_digit() || ('a'..='f').contains(&c)
            }
        });
    if ok {
        Ok(uuid)
    } else {
        Err(Error::InvalidArgument(format!(
            "{uuid:?}: not a domain UUID as libvirt writes it"
        )))
    }
}

/// The profile `libvirt-UUID` of the pod `pod_id`: libvirt's template (its abstraction and
/// the files libvirt writes from the domain XML) and `files`.
pub fn profile(uuid: &str, pod_id: &str, files: &[PodFile]) -> Result<String, Error> {
    let uuid = checked_uuid(uuid)?;
    let mut rules = String::new();
    for file in files {
        let path = quoted(Path::new(&file.path))?;
        rules.push_str(&format!("  {path} {},\n", file.access.as_str()));
    }
    let pod = pod_id.escape_debug();
    Ok(format!(
        "{MARK} (pod {pod}): libvirt's template for it and the files vmlet's QEMU arguments\n\
         # name, written by vmlet-libvirt before the domain starts, removed with the domain.\n\
         \n\
         #include <tunables/global>\n\
         \n\
         profile libvirt-{uuid} flags=(attach_disconnected) {{\n  \
         #include <abstractions/libvirt-qemu>\n  \
         #include <libvirt/libvirt-{uuid}.files>\n\
         \n  \
         # QEMU 10 reads whether a host block device it was handed (a hot-plugged one) is\n  \
         # zoned, QEMU 11 also its discard granularity; libvirt's abstraction (11 and 12)\n  \
         # grants only its max_segments.\n  \
         /sys/devices/**/block/*/queue/zoned r,\n  \
         /sys/devices/**/block/*/queue/discard_granularity r,\n\
         \n  \
         # What vmlet passes to QEMU beside libvirt's model, for this pod only.\n\
         {rules}}}\n"
    ))
}

/// A directory of libvirt's VM profiles ([`PROFILE_DIR`] on a node).
#[derive(Debug, Clone)]
pub struct ProfileDir {
    pub dir: PathBuf,
}

impl Default for ProfileDir {
    fn default() -> Self {
        Self {
            dir: PROFILE_DIR.into(),
        }
    }
}

impl ProfileDir {
    /// Whether libvirt's template for its VMs' profiles is here: libvirt's AppArmor driver
    /// does not start without it.
    pub fn has_libvirts_template(&self) -> bool {
        self.dir.join(TEMPLATE).is_file()
    }

    fn path(&self, uuid: &str) -> Result<PathBuf, Error> {
        Ok(self.dir.join(format!("libvirt-{}", checked_uuid(uuid)?)))
    }

    /// Writes the profile of the domain `uuid` (whole or not at all: through a file of its
    /// own, renamed into place).
    pub fn write(&self, uuid: &str, text: &str) -> Result<(), Error> {
        let path = self.path(uuid)?;
        let partial = self.dir.join(format!(".vmlet-{uuid}.partial"));
        let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&partial)
            .map_err(|e| io("write the AppArmor profile", e))?;
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&partial, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(io("write the AppArmor profile", e));
        }
        Ok(())
    }

    /// Removes the profile file of the domain `uuid` if vmlet wrote it; no such file is not
    /// an error, and a file of libvirt's (or anyone's) stays.
    pub fn remove(&self, uuid: &str) -> Result<(), Error> {
        let path = self.path(uuid)?;
        let mut head = String::new();
        match std::fs::File::open(&path) {
            Ok(file) => {
                use std::io::Read;
                let _ = file.take(MARK_READ_LIMIT).read_to_string(&mut head);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
        }
        if !head.starts_with(MARK) {
            return Ok(());
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(
                format!("remove the AppArmor profile {}", path.display()),
                e,
            )),
            _ => Ok(()),
        }
    }
}

/// Characters AppArmor reads as a glob, a variable or an alternation in a path.
const APPARMOR_SPECIAL: &[char] = &['*', '?', '[', ']', '{', '}', '^', '@', ','];

/// A path as an AppArmor rule's quoted path; one that AppArmor would read as more than
/// that one path is refused.
pub fn quoted(path: &Path) -> Result<String, Error> {
    let text = path.to_string_lossy();
    if text.contains(['"', '\n', '\0']) || text.contains(APPARMOR_SPECIAL) || !path.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "{text:?}: not a path vmlet can name in an AppArmor rule (absolute, without \
             quotes, newlines or any of {APPARMOR_SPECIAL:?})"
        )));
    }
    Ok(format!("\"{text}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0d5c0e2a-6b1f-4c3e-9a57-3f0e8f1d2c4b";

    fn files() -> Vec<PodFile> {
        vec![
            PodFile {
                path: "/usr/local/bin/vmlet-vmwrapper".into(),
                access: Access::Exec,
            },
            PodFile {
                path: "/run/vmlet/p1/qmp.sock".into(),
                access: Access::ReadWrite,
            },
            PodFile {
                path: "/run/vmlet/p1/root.qcow2".into(),
                access: Access::ReadWriteLock,
            },
        ]
    }

    #[test]
    fn the_profile_is_libvirts_template_with_the_pods_own_files() {
        let text = profile(UUID, "p1", &files()).unwrap();
        assert!(text.starts_with(MARK), "{text}");
        for line in [
            "#include <tunables/global>\n",
            &format!("profile libvirt-{UUID} flags=(attach_disconnected) {{\n"),
            "  #include <abstractions/libvirt-qemu>\n",
            &format!("  #include <libvirt/libvirt-{UUID}.files>\n"),
            "  \"/usr/local/bin/vmlet-vmwrapper\" rmix,\n",
            "  \"/run/vmlet/p1/qmp.sock\" rw,\n",
            "  \"/run/vmlet/p1/root.qcow2\" rwk,\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        assert!(text.ends_with("rwk,\n}\n"), "{text}");
        let sysfs = [
            "  /sys/devices/**/block/*/queue/zoned r,\n",
            "  /sys/devices/**/block/*/queue/discard_granularity r,\n",
        ];
        let mut files = text.clone();
        for read in sysfs {
            assert!(text.contains(read), "{read:?} in {text}");
            files = files.replace(read, "");
        }
        assert!(!files.contains('*'), "no glob but the sysfs read: {text}");
    }

    #[test]
    fn a_path_or_uuid_that_would_widen_the_profile_is_refused() {
        for path in ["/run/vmlet/*/qmp.sock", "/run/x\"y", "relative", "/a\nb"] {
            let odd = [PodFile {
                path: path.into(),
                access: Access::ReadWrite,
            }];
            assert!(profile(UUID, "p1", &odd).is_err(), "{path:?}");
        }
        for uuid in [
            "",
            "../../x",
            "0D5C0E2A-6B1F-4C3E-9A57-3F0E8F1D2C4B",
            "x/../y",
        ] {
            assert!(profile(uuid, "p1", &files()).is_err(), "{uuid:?}");
            assert!(ProfileDir::default().remove(uuid).is_err(), "{uuid:?}");
        }
        // A pod id is only a comment, escaped onto its one line.
        let text = profile(UUID, "p\n}", &files()).unwrap();
        assert!(text.lines().next().unwrap().contains("p\\n}"), "{text}");
    }

    #[test]
    fn accesses_are_only_the_four_vmlet_grants() {
        for access in ["rmix", "rk", "rw", "rwk"] {
            assert_eq!(Access::parse(access).unwrap().as_str(), access);
        }
        for odd in ["", "ux", "rwix", "rw,\n  /** rwk"] {
            assert!(Access::parse(odd).is_err(), "{odd:?}");
        }
    }

    #[test]
    fn written_profiles_are_removed_and_libvirts_are_left() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = ProfileDir {
            dir: scratch.path().to_owned(),
        };
        let text = profile(UUID, "p1", &files()).unwrap();
        dir.write(UUID, &text).unwrap();
        let path = dir.dir.join(format!("libvirt-{UUID}"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        dir.remove(UUID).unwrap();
        assert!(!path.exists());
        dir.remove(UUID).unwrap();
        let libvirts = "#\n# This profile is for the domain whose UUID matches this file.\n";
        std::fs::write(&path, libvirts).unwrap();
        dir.remove(UUID).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), libvirts);
        assert_eq!(std::fs::read_dir(&dir.dir).unwrap().count(), 1);
        // libvirt's AppArmor driver is there only with its template.
        assert!(!dir.has_libvirts_template());
        std::fs::write(dir.dir.join(TEMPLATE), "profile LIBVIRT_TEMPLATE {}\n").unwrap();
        assert!(dir.has_libvirts_template());
    }
}
