//! `manifest.json`: what an image was built from, with hashes.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `vmlinux` (the lean kernel) or `vmlinuz` (the Debian cloud kernel).
    pub kernel_file: String,
    pub kernel_release: String,
    pub kernel_package: String,
    pub agent_version: String,
    pub modules: Vec<String>,
    pub kernel_sha256: String,
    pub initrd_sha256: String,
    /// Hash of everything the image was built from.
    pub inputs_sha256: String,
}

pub fn sha256_hex(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

pub fn sha256_file(path: &Path) -> Result<String, Error> {
    let data = std::fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    Ok(sha256_hex(&data))
}

pub fn inputs_hash(parts: &[&str]) -> String {
    sha256_hex(parts.join("\n").as_bytes())
}

impl Manifest {
    const FILE: &'static str = "manifest.json";

    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let json =
            serde_json::to_string_pretty(self).map_err(|e| Error::Manifest(e.to_string()))?;
        std::fs::write(dir.join(Self::FILE), json + "\n")
            .map_err(|e| Error::io("write manifest.json", e))
    }

    pub fn load(dir: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(dir.join(Self::FILE))
            .map_err(|e| Error::io("read manifest.json", e))?;
        serde_json::from_str(&text).map_err(|e| Error::Manifest(e.to_string()))
    }

    /// The manifest in `dir` if it was built from `inputs` and its files are intact.
    pub fn load_if_current(dir: &Path, inputs: &str) -> Result<Option<Self>, Error> {
        let Ok(manifest) = Self::load(dir) else {
            return Ok(None);
        };
        if manifest.inputs_sha256 != inputs {
            return Ok(None);
        }
        for (file, hash) in [
            (manifest.kernel_file.as_str(), &manifest.kernel_sha256),
            ("initrd.img", &manifest.initrd_sha256),
        ] {
            match sha256_file(&dir.join(file)) {
                Ok(actual) if &actual == hash => {}
                _ => return Ok(None),
            }
        }
        Ok(Some(manifest))
    }
}
