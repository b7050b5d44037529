//! The Debian cloud kernel: fetched with apt, unpacked with dpkg-deb, indexed with depmod.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{progress, Error};

/// The meta package whose dependency names the current cloud kernel.
const META_PACKAGE: &str = "linux-image-cloud-amd64";

pub(crate) fn run(command: &mut Command) -> Result<String, Error> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|e| Error::Command {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if !output.status.success() {
        return Err(Error::Command {
            command: shown,
            detail: tail(&String::from_utf8_lossy(&output.stderr), 40),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The last `lines` lines of `text` (a failed kernel build's errors come last).
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Downloads the current cloud kernel package into `cache` unless it is there already.
pub fn download(cache: &Path) -> Result<PathBuf, Error> {
    let depends = run(Command::new("apt-cache").args(["depends", META_PACKAGE]))?;
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| {
            Error::Kernel(format!(
                "{META_PACKAGE} names no kernel (run apt-get update)"
            ))
        })?
        .to_owned();
    download_package(cache, &package)
}

/// The `.deb` of `package` in `cache`, fetched with `apt-get download` unless it is there.
pub(crate) fn download_package(cache: &Path, package: &str) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(cache).map_err(|e| Error::io("create cache dir", e))?;
    if let Some(deb) = find_deb(cache, package)? {
        return Ok(deb);
    }
    progress(&format!("downloading {package}"));
    run(Command::new("apt-get")
        .args(["download", "-q", package])
        .current_dir(cache))?;
    find_deb(cache, package)?
        .ok_or_else(|| Error::Kernel(format!("apt-get download {package} left no .deb")))
}

fn find_deb(cache: &Path, package: &str) -> Result<Option<PathBuf>, Error> {
    let prefix = format!("{package}_");
    let entries = std::fs::read_dir(cache).map_err(|e| Error::io("list cache dir", e))?;
    Ok(entries.flatten().map(|e| e.path()).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
    }))
}

/// An unpacked kernel package.
pub struct KernelTree {
    pub root: PathBuf,
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// Unpacks `deb` under `cache` (once) and generates `modules.dep` with depmod.
pub fn extract(deb: &Path, cache: &Path) -> Result<KernelTree, Error> {
    let stem = deb
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Kernel(format!("bad package path {}", deb.display())))?;
    let root = cache.join(format!("tree-{stem}"));
    let done = root.join(".vmlet-unpacked");
    if !done.exists() {
        progress(&format!("unpacking {}", deb.display()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(|e| Error::io("create unpack dir", e))?;
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root))?;
    }
    let modules = root.join("lib/modules");
    let release = std::fs::read_dir(&modules)
        .map_err(|e| Error::io(format!("list {}", modules.display()), e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or_else(|| Error::Kernel("package has no lib/modules/<release>".into()))?;
    if !done.exists() {
        progress("indexing modules with depmod");
        run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
        std::fs::write(&done, b"").map_err(|e| Error::io("mark unpacked", e))?;
    }
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.exists() {
        return Err(Error::Kernel(format!("no {}", vmlinuz.display())));
    }
    Ok(KernelTree {
        root,
        release,
        vmlinuz,
    })
}
