//! The files under a node's root that `vmletctl install` writes and `uninstall` takes back
//! ([`crate::node_install`]): whole files, through a temporary file and a rename, removed
//! only while unchanged; and marked blocks appended to files that are not vmlet's, taken
//! off again byte for byte.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vmlet_vm_image::{sha256_file, sha256_hex};

use crate::containerd_config::BLOCK_START;
use vmlet_shim::Error;

/// A block appended to a file under the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendedBlock {
    /// The file, relative to the root.
    pub file: PathBuf,
    pub block: String,
    /// Whether install made the file (uninstall removes it then, when it is left empty).
    pub created: bool,
}

/// `rules` as the marked block [`append_block`] appends (after a newline where the file
/// does not end with one).
pub(crate) fn marked(rules: &str) -> String {
    format!("  {BLOCK_START}\n{rules}")
}

/// Appends `rules` as a marked block to `file` (relative to `root`), making it if missing.
pub(crate) fn append_block(root: &Path, file: &Path, rules: &str) -> Result<AppendedBlock, Error> {
    let path = root.join(file);
    let (text, created) = match std::fs::read_to_string(&path) {
        Ok(text) => (text, false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), true),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let mut block = String::new();
    if !text.is_empty() && !text.ends_with('\n') {
        block.push('\n');
    }
    block.push_str(&marked(rules));
    write_file(&path, format!("{text}{block}").as_bytes(), 0o644)?;
    Ok(AppendedBlock {
        file: file.to_owned(),
        block,
        created,
    })
}

/// What taking an appended block off did.
pub(crate) enum BlockRemoved {
    /// Install made the file, and it held only the block.
    FileRemoved,
    /// The file has its bytes from before install again.
    Restored,
}

/// Takes an appended block off its file again; None when the file no longer ends with the
/// block (edited since).
pub(crate) fn remove_block(
    root: &Path,
    appended: &AppendedBlock,
) -> Result<Option<BlockRemoved>, Error> {
    let path = root.join(&appended.file);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let Some(original) = text.strip_suffix(&appended.block) else {
        return Ok(None);
    };
    if appended.created && original.is_empty() {
        std::fs::remove_file(&path)
            .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
        Ok(Some(BlockRemoved::FileRemoved))
    } else {
        write_file(&path, original.as_bytes(), 0o644)?;
        Ok(Some(BlockRemoved::Restored))
    }
}

/// Copies `from` to `to` (through a temporary file and a rename), returning its sha256.
pub(crate) fn copy_file(from: &Path, to: &Path, mode: u32) -> Result<String, Error> {
    let data = std::fs::read(from).map_err(|e| Error::io(format!("read {}", from.display()), e))?;
    write_file(to, &data, mode)?;
    Ok(sha256_hex(&data))
}

pub(crate) fn write_file(to: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let dir = to
        .parent()
        .ok_or_else(|| Error::Internal(format!("{} has no directory", to.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut temporary = to.as_os_str().to_owned();
    temporary.push(".vmlet-new");
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, data)
        .map_err(|e| Error::io(format!("write {}", temporary.display()), e))?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {}", temporary.display()), e))?;
    std::fs::rename(&temporary, to).map_err(|e| Error::io(format!("rename to {}", to.display()), e))
}

/// What became of an installed file at uninstall.
pub(crate) enum Removal {
    Removed,
    /// Changed since the install, so kept: this names it.
    Changed(String),
    /// Not there any more.
    Gone,
}

/// Removes the file at `relative` under `root` if its sha256 is still `hash`.
pub(crate) fn remove_if_unchanged(
    root: &Path,
    relative: &Path,
    hash: &str,
) -> Result<Removal, Error> {
    let path = root.join(relative);
    match sha256_file(&path) {
        Ok(now) if now == hash => {
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            Ok(Removal::Removed)
        }
        Ok(_) => Ok(Removal::Changed(format!(
            "/{} (changed since the install)",
            relative.display()
        ))),
        Err(_) => Ok(Removal::Gone),
    }
}
