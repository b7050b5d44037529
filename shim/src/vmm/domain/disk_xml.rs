//! The domain XML's `<disk>` element and its parts (driver, source, backing chain,
//! target), typed like the rest ([`super::xml`]).

use serde::Serialize;

use super::attrs::{Empty, TypeAttr};

/// A file- or block-backed disk; its format and, for an overlay, its backing file are
/// given, so libvirt and QEMU probe neither.
#[derive(Debug, Serialize)]
pub struct Disk {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    #[serde(rename = "@device")]
    pub device: &'static str,
    pub driver: DiskDriver,
    pub source: DiskSource,
    #[serde(rename = "backingStore")]
    pub backing_store: BackingStore,
    pub target: DiskTarget,
    /// Its place in the boot order (none: libvirt's `<os><boot>` decides).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootOrder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<Empty>,
}

/// A disk's file (`type="file"`), or its block device (`type="block"`) with the slice of it
/// the guest sees.
#[derive(Debug, Serialize)]
pub struct DiskSource {
    #[serde(rename = "@file", skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(rename = "@dev", skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slices: Option<Slices>,
}

impl DiskSource {
    pub fn file(path: String) -> Self {
        DiskSource {
            file: Some(path),
            dev: None,
            slices: None,
        }
    }

    /// `size` bytes of the block device `dev` from `offset` on.
    pub fn block_slice(dev: String, offset: u64, size: u64) -> Self {
        DiskSource {
            file: None,
            dev: Some(dev),
            slices: Some(Slices {
                slice: Slice {
                    kind: "storage",
                    offset,
                    size,
                },
            }),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Slices {
    pub slice: Slice,
}

#[derive(Debug, Serialize)]
pub struct Slice {
    #[serde(rename = "@type")]
    pub kind: &'static str,
    #[serde(rename = "@offset")]
    pub offset: u64,
    #[serde(rename = "@size")]
    pub size: u64,
}

#[derive(Debug, Serialize)]
pub struct BootOrder {
    #[serde(rename = "@order")]
    pub order: u32,
}

#[derive(Debug, Serialize)]
pub struct DiskDriver {
    #[serde(rename = "@name")]
    pub name: &'static str,
    #[serde(rename = "@type")]
    pub format: &'static str,
}

/// A disk's backing chain: a backing file (with its format, and no backing of its own), or
/// none (`<backingStore/>`).
#[derive(Debug, Serialize)]
pub struct BackingStore {
    #[serde(rename = "@type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<TypeAttr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<UnlabelledFile>,
    #[serde(rename = "backingStore", skip_serializing_if = "Option::is_none")]
    pub backing_store: Option<Empty>,
}

/// A file libvirt must not chown (`relabel="no"`): a backing file in a container's image,
/// whose owner change would copy it up into the container's layer (QEMU only reads it).
#[derive(Debug, Serialize)]
pub struct UnlabelledFile {
    #[serde(rename = "@file")]
    pub file: String,
    pub seclabel: Seclabel,
}

/// libvirt's DAC label: on a file, `relabel="no"` alone ([`Seclabel::unlabelled`]); on the
/// domain, the pod's own user for its QEMU ([`Seclabel::pod_user`]).
#[derive(Debug, Serialize)]
pub struct Seclabel {
    #[serde(rename = "@type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(rename = "@model")]
    pub model: &'static str,
    #[serde(rename = "@relabel")]
    pub relabel: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl Seclabel {
    /// A file libvirt leaves as it is.
    pub fn unlabelled() -> Self {
        Seclabel {
            kind: None,
            model: "dac",
            relabel: "no",
            label: None,
        }
    }

    /// The domain's: libvirt runs QEMU as the pod's own `user` (`+UID:+GID`) and gives it
    /// what it relabels (the pod's disks, the sockets libvirt makes) while the domain runs.
    pub fn pod_user(user: &crate::host::pod_user::PodUser) -> Self {
        Seclabel {
            kind: Some("static"),
            model: "dac",
            relabel: "yes",
            label: Some(format!("+{}:+{}", user.uid, user.gid)),
        }
    }
}

impl BackingStore {
    /// No backing file.
    pub fn none() -> Self {
        BackingStore {
            kind: None,
            format: None,
            source: None,
            backing_store: None,
        }
    }

    /// The file `path` in `format`, itself with no backing file, left as it is (read, never
    /// chowned).
    pub fn file(path: String, format: &str) -> Self {
        BackingStore {
            kind: Some("file"),
            format: Some(TypeAttr {
                kind: format.into(),
            }),
            source: Some(UnlabelledFile {
                file: path,
                seclabel: Seclabel::unlabelled(),
            }),
            backing_store: Some(Empty {}),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DiskTarget {
    #[serde(rename = "@dev")]
    pub dev: &'static str,
    #[serde(rename = "@bus")]
    pub bus: &'static str,
}
