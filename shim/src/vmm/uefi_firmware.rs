//! The node's UEFI firmware (OVMF) for a VM image with `vmlet.io/firmware: uefi` that the
//! shim starts itself (`launcher = "direct"`), found as libvirt finds it: from QEMU's
//! firmware descriptors (QEMU's `docs/interop/firmware.json`), `/etc/qemu/firmware` over
//! `/usr/share/qemu/firmware` by file name, in file name order. The first that boots UEFI
//! from flash, for x86_64 and the VM's machine type, with a varstore template and without
//! secure boot (an image's own boot loader need not be signed; secure boot wants SMM,
//! which TCG runs slowly) is taken: its code, read-only, and a copy of its varstore for the
//! pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;

/// Where QEMU's packages and the node's admin put firmware descriptors; a later directory's
/// file of the same name replaces an earlier's (an empty one hides it).
pub const DESCRIPTOR_DIRS: [&str; 2] = ["/usr/share/qemu/firmware", "/etc/qemu/firmware"];
/// The most bytes of a descriptor read (they are a few hundred).
const MAX_DESCRIPTOR: u64 = 64 * 1024;
/// Features that make a firmware unfit for a VM image here.
const UNWANTED: [&str; 5] = [
    "secure-boot",
    "enrolled-keys",
    "requires-smm",
    "amd-sev-es",
    "intel-tdx",
];

/// A UEFI firmware: its code and the template of its variable store (both raw flash images).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UefiFirmware {
    pub code: PathBuf,
    pub vars_template: PathBuf,
    /// The descriptor it was found by.
    pub descriptor: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Descriptor {
    #[serde(default)]
    interface_types: Vec<String>,
    mapping: Mapping,
    #[serde(default)]
    targets: Vec<Target>,
    #[serde(default)]
    features: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Mapping {
    device: String,
    executable: Option<FlashFile>,
    nvram_template: Option<FlashFile>,
}

#[derive(Debug, Deserialize)]
struct FlashFile {
    filename: PathBuf,
    #[serde(default = "raw")]
    format: String,
}

fn raw() -> String {
    "raw".into()
}

#[derive(Debug, Deserialize)]
struct Target {
    architecture: String,
    #[serde(default)]
    machines: Vec<String>,
}

/// The firmware for `machine` among the descriptors in `dirs` (later directories override).
pub fn find(dirs: &[&Path], machine: &str) -> Result<UefiFirmware, Error> {
    let mut by_name = BTreeMap::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if Path::new(&name).extension().is_some_and(|e| e == "json") {
                by_name.insert(name, entry.path());
            }
        }
    }
    for path in by_name.values() {
        let Some(text) = read_bounded(path) else {
            continue;
        };
        if let Some(found) = fits(&text, machine) {
            return Ok(UefiFirmware {
                descriptor: path.clone(),
                ..found
            });
        }
    }
    Err(Error::FailedPrecondition(format!(
        "vmlet.io/firmware: uefi: no firmware descriptor in {} offers UEFI for x86_64 {machine} \
         from flash with a varstore and without secure boot (Debian's package ovmf has one)",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    )))
}

/// The descriptor's text, if it is a file of a descriptor's size (an empty one hides
/// another of its name).
fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_DESCRIPTOR).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The firmware `text` describes, if it fits a VM image on `machine`.
fn fits(text: &str, machine: &str) -> Option<UefiFirmware> {
    let d: Descriptor = serde_json::from_str(text).ok()?;
    let for_machine = d.targets.iter().any(|t| {
        t.architecture == "x86_64" && t.machines.iter().any(|m| machine_matches(m, machine))
    });
    if !d.interface_types.iter().any(|t| t == "uefi")
        || d.mapping.device != "flash"
        || !for_machine
        || d.features.iter().any(|f| UNWANTED.contains(&f.as_str()))
    {
        return None;
    }
    let (code, vars) = (d.mapping.executable?, d.mapping.nvram_template?);
    if code.format != "raw" || vars.format != "raw" {
        return None;
    }
    Some(UefiFirmware {
        code: code.filename,
        vars_template: vars.filename,
        descriptor: PathBuf::new(),
    })
}

/// Whether the descriptor's machine `pattern` (`pc-q35-*`) covers `machine`; QEMU's aliases
/// `q35` and `pc` are its newest `pc-q35-` and `pc-i440fx-` machines.
fn machine_matches(pattern: &str, machine: &str) -> bool {
    let machine = match machine {
        "q35" => "pc-q35-latest",
        "pc" => "pc-i440fx-latest",
        other => other,
    };
    match pattern.strip_suffix('*') {
        Some(prefix) => machine.starts_with(prefix),
        None => pattern == machine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = r#"{
        "description": "UEFI firmware for x86_64, without Secure Boot without SMM, with empty varstore",
        "interface-types": ["uefi"],
        "mapping": {
            "device": "flash",
            "executable": {"filename": "/usr/share/OVMF/OVMF_CODE_4M.fd", "format": "raw"},
            "nvram-template": {"filename": "/usr/share/OVMF/OVMF_VARS_4M.fd", "format": "raw"}
        },
        "targets": [{"architecture": "x86_64", "machines": ["pc-i440fx-*", "pc-q35-*"]}],
        "features": ["acpi-s3", "amd-sev", "verbose-dynamic"],
        "tags": []
    }"#;

    fn secure() -> String {
        PLAIN
            .replace("OVMF_CODE_4M.fd", "OVMF_CODE_4M.secboot.fd")
            .replace(
                "\"acpi-s3\"",
                "\"acpi-s3\", \"requires-smm\", \"secure-boot\"",
            )
    }

    #[test]
    fn the_plain_descriptor_fits_q35_and_a_secure_one_does_not() {
        let found = fits(PLAIN, "q35").unwrap();
        assert_eq!(found.code, Path::new("/usr/share/OVMF/OVMF_CODE_4M.fd"));
        assert_eq!(
            found.vars_template,
            Path::new("/usr/share/OVMF/OVMF_VARS_4M.fd")
        );
        assert!(fits(PLAIN, "pc-q35-9.2").is_some());
        assert!(fits(PLAIN, "microvm").is_none());
        assert!(fits(&secure(), "q35").is_none());
        let stateless = PLAIN.replace("nvram-template", "other");
        assert!(fits(&stateless, "q35").is_none());
        assert!(fits("not json", "q35").is_none());
    }

    #[test]
    fn descriptors_are_taken_in_name_order_and_etc_overrides_by_name() {
        let root = tempfile::tempdir().unwrap();
        let (usr, etc) = (root.path().join("usr"), root.path().join("etc"));
        std::fs::create_dir_all(&usr).unwrap();
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(usr.join("50-secure.json"), secure()).unwrap();
        std::fs::write(usr.join("60-plain.json"), PLAIN).unwrap();
        let dirs = [usr.as_path(), etc.as_path()];
        let found = find(&dirs, "q35").unwrap();
        assert_eq!(found.descriptor, usr.join("60-plain.json"));
        // The admin's own, first by name.
        let own = PLAIN.replace("OVMF_CODE_4M.fd", "OWN_CODE.fd");
        std::fs::write(etc.join("10-own.json"), own).unwrap();
        assert_eq!(
            find(&dirs, "q35").unwrap().code,
            Path::new("/usr/share/OVMF/OWN_CODE.fd")
        );
        // An empty file of a name hides the package's.
        std::fs::remove_file(etc.join("10-own.json")).unwrap();
        std::fs::write(etc.join("60-plain.json"), "").unwrap();
        let err = find(&dirs, "q35").unwrap_err();
        assert!(err.message().contains("no firmware descriptor"), "{err}");
        assert!(err.message().contains("ovmf"), "{err}");
    }
}
