//! Builds the vmlet guest image.
//!
//! [`build`] writes into the output directory:
//! - the kernel: `vmlinux`, the lean kernel (the default, see [`lean`]: built from Debian's
//!   kernel source with `kernel/vmlet.config`, started by QEMU at its PVH entry), or
//!   `vmlinuz`, the Debian cloud kernel (`--kernel cloud`);
//! - `initrd.img`: a gzip-compressed `newc` cpio holding the static `vmlet-agent` as
//!   `/init` and, for the cloud kernel, the modules the guest needs (resolved through
//!   `modules.dep`) with their load order in `/lib/modules/<release>/vmlet-modules.list`
//!   (a kernel of another release finds no list and loads nothing);
//! - `manifest.json`: kernel and agent versions, sha256 of every file, and a hash of the
//!   inputs, so that a second run with the same inputs does no work.
#![forbid(unsafe_code)]

mod agent;
pub mod cli;
mod cpio;
mod kernel;
pub mod lean;
mod manifest;
mod modules;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use manifest::{sha256_file, sha256_hex, Manifest};
pub use modules::{resolve as resolve_modules, DRIVER_MODULES, GUEST_MODULES};

/// Errors of the image builder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("kernel module {0} is neither in modules.dep nor built in")]
    MissingModule(String),
    #[error("kernel package: {0}")]
    Kernel(String),
    #[error("manifest: {0}")]
    Manifest(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Which guest kernel an image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kernel {
    /// The lean kernel built from [`lean::SOURCE_PACKAGE`] (`vmlinux`).
    Lean,
    /// The Debian cloud kernel (`vmlinuz`): a local `.deb`, or without one the newest
    /// `linux-image-cloud-amd64` dependency fetched with `apt-get download` into `out/cache`.
    Cloud { deb: Option<PathBuf> },
}

impl Kernel {
    /// The kernel's file name in the image.
    pub fn file_name(&self) -> &'static str {
        match self {
            Kernel::Lean => "vmlinux",
            Kernel::Cloud { .. } => "vmlinuz",
        }
    }
}

/// What to build from.
#[derive(Debug, Clone)]
pub struct Options {
    /// Output directory.
    pub out: PathBuf,
    pub kernel: Kernel,
    /// A prebuilt static agent; without it the agent is built with cargo.
    pub agent: Option<PathBuf>,
}

/// Prints a progress line for the slow steps.
pub(crate) fn progress(message: &str) {
    eprintln!("vmlet-image: {message}");
}

/// Builds (or confirms up to date) the image in `opts.out`.
pub fn build(opts: &Options) -> Result<Manifest, Error> {
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| Error::io(format!("create {}", opts.out.display()), e))?;
    let cache = opts.out.join("cache");
    let agent = match &opts.agent {
        Some(path) => path.clone(),
        None => agent::build_static()?,
    };
    let agent_bytes =
        std::fs::read(&agent).map_err(|e| Error::io(format!("read {}", agent.display()), e))?;
    let parts = match &opts.kernel {
        Kernel::Lean => lean_parts(&cache)?,
        Kernel::Cloud { deb } => cloud_parts(&cache, deb.as_deref())?,
    };
    let file = opts.kernel.file_name();
    let inputs = manifest::inputs_hash(&[
        file,
        &parts.kernel_sha256,
        &manifest::sha256_hex(&agent_bytes),
        &format!("{:?}", parts.lists),
        env!("CARGO_PKG_VERSION"),
    ]);
    if let Some(existing) = Manifest::load_if_current(&opts.out, &inputs)? {
        progress("image is up to date");
        return Ok(existing);
    }
    let count = parts.lists.first().map_or(0, |(_, l)| l.len());
    progress(&format!("packing {count} modules and the agent"));
    let initrd = pack_initrd(
        &agent_bytes,
        &parts.modules_dir,
        &parts.release,
        &parts.lists,
    )?;
    // The other kernel's file would only mislead whoever looks into the directory.
    for stale in ["vmlinux", "vmlinuz"].into_iter().filter(|n| *n != file) {
        let _ = std::fs::remove_file(opts.out.join(stale));
    }
    let kernel_path = opts.out.join(file);
    let tmp = kernel_path.with_extension("tmp");
    std::fs::copy(&parts.kernel, &tmp)
        .map_err(|e| Error::io(format!("copy {}", parts.kernel.display()), e))?;
    std::fs::rename(&tmp, &kernel_path)
        .map_err(|e| Error::io(format!("rename {}", kernel_path.display()), e))?;
    let initrd_path = opts.out.join("initrd.img");
    write_atomic(&initrd_path, &initrd)?;
    let manifest = Manifest {
        kernel_file: file.into(),
        kernel_release: parts.release,
        kernel_package: parts.package,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        modules: parts
            .lists
            .into_iter()
            .next()
            .map(|(_, l)| l)
            .unwrap_or_default(),
        kernel_sha256: parts.kernel_sha256,
        initrd_sha256: manifest::sha256_hex(&initrd),
        inputs_sha256: inputs,
    };
    manifest.save(&opts.out)?;
    progress(&format!("wrote {}", opts.out.display()));
    Ok(manifest)
}

/// What goes into an image besides the agent.
struct KernelParts {
    kernel: PathBuf,
    kernel_sha256: String,
    release: String,
    package: String,
    modules_dir: PathBuf,
    /// Module lists by file name (the boot list first); empty for a kernel without modules.
    lists: Vec<(String, Vec<String>)>,
}

fn lean_parts(cache: &Path) -> Result<KernelParts, Error> {
    let built = lean::build(cache)?;
    Ok(KernelParts {
        kernel_sha256: manifest::sha256_file(&built.vmlinux)?,
        kernel: built.vmlinux,
        release: built.release,
        package: built.source,
        modules_dir: PathBuf::new(),
        lists: Vec::new(),
    })
}

fn cloud_parts(cache: &Path, deb: Option<&Path>) -> Result<KernelParts, Error> {
    let deb = match deb {
        Some(deb) => deb.to_owned(),
        None => kernel::download(cache)?,
    };
    let tree = kernel::extract(&deb, cache)?;
    let modules_dir = tree.root.join("lib/modules").join(&tree.release);
    let read = |name: &str| {
        std::fs::read_to_string(modules_dir.join(name))
            .map_err(|e| Error::io(format!("read {name}"), e))
    };
    let (modules_dep, modules_builtin) = (read("modules.dep")?, read("modules.builtin")?);
    let order = modules::resolve(&modules_dep, &modules_builtin, GUEST_MODULES)?;
    let mut lists = vec![("vmlet-modules.list".to_owned(), order)];
    for (driver, wanted) in DRIVER_MODULES {
        let list = modules::resolve(&modules_dep, &modules_builtin, wanted)?;
        lists.push((format!("vmlet-modules.{driver}.list"), list));
    }
    Ok(KernelParts {
        kernel_sha256: manifest::sha256_file(&tree.vmlinuz)?,
        kernel: tree.vmlinuz,
        release: tree.release,
        package: deb
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        modules_dir,
        lists,
    })
}

/// Packs the agent as `/init` and every module of `lists` (each once), with each list as
/// `/lib/modules/<release>/<name>`.
fn pack_initrd(
    agent: &[u8],
    modules_dir: &Path,
    release: &str,
    lists: &[(String, Vec<String>)],
) -> Result<Vec<u8>, Error> {
    let mut cpio = cpio::CpioWriter::new(Vec::new());
    let io = |e| Error::io("write initramfs", e);
    for dir in [
        "dev",
        "proc",
        "sys",
        "run",
        "tmp",
        "etc",
        "lib",
        "lib/modules",
    ] {
        cpio.dir(dir, 0o755).map_err(io)?;
    }
    cpio.char_device("dev/console", 0o600, 5, 1).map_err(io)?;
    cpio.file("init", 0o755, agent).map_err(io)?;
    let base = format!("lib/modules/{release}");
    let mut dirs_done = std::collections::HashSet::new();
    if !lists.is_empty() {
        cpio.dir(&base, 0o755).map_err(io)?;
        dirs_done.insert(base.clone());
    }
    let mut packed = std::collections::HashSet::new();
    for module in lists.iter().flat_map(|(_, l)| l) {
        if !packed.insert(module) {
            continue;
        }
        let mut prefix = base.clone();
        for part in Path::new(module)
            .parent()
            .into_iter()
            .flat_map(|p| p.iter())
        {
            if dirs_done.insert(prefix.clone()) {
                cpio.dir(&prefix, 0o755).map_err(io)?;
            }
            prefix = format!("{prefix}/{}", part.to_string_lossy());
        }
        if dirs_done.insert(prefix.clone()) {
            cpio.dir(&prefix, 0o755).map_err(io)?;
        }
        if !module.ends_with(".ko") {
            return Err(Error::Kernel(format!(
                "module {module} is compressed; only plain .ko modules are supported"
            )));
        }
        let data = std::fs::read(modules_dir.join(module))
            .map_err(|e| Error::io(format!("read module {module}"), e))?;
        cpio.file(&format!("{base}/{module}"), 0o644, &data)
            .map_err(io)?;
    }
    for (name, list) in lists {
        cpio.file(&format!("{base}/{name}"), 0o644, list.join("\n").as_bytes())
            .map_err(io)?;
    }
    let raw = cpio.finish().map_err(io)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).map_err(io)?;
    gz.finish().map_err(io)
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("rename {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn unpacked(gz: &[u8]) -> String {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut raw)
            .unwrap();
        String::from_utf8_lossy(&raw).into_owned()
    }

    #[test]
    fn module_lists_sit_under_their_kernels_release() {
        let dir = std::env::temp_dir().join(format!("vmlet-initrd-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("kernel/net")).unwrap();
        std::fs::write(dir.join("kernel/net/vsock.ko"), b"module").unwrap();
        let lists = vec![(
            "vmlet-modules.list".to_owned(),
            vec!["kernel/net/vsock.ko".to_owned()],
        )];
        let image = unpacked(&pack_initrd(b"agent", &dir, "6.1.0-cloud", &lists).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(image.contains("lib/modules/6.1.0-cloud/vmlet-modules.list"));
        assert!(image.contains("lib/modules/6.1.0-cloud/kernel/net/vsock.ko"));
        // Not where a kernel of another release (the lean one) would look.
        assert!(!image.contains("lib/modules/vmlet-modules.list"));
    }

    #[test]
    fn a_kernel_without_modules_gets_the_agent_alone() {
        let image =
            unpacked(&pack_initrd(b"AGENT", Path::new("/nonexistent"), "6.1", &[]).unwrap());
        assert!(image.contains("init") && image.contains("AGENT"));
        assert!(!image.contains("vmlet-modules") && !image.contains("lib/modules/6.1"));
    }

    #[test]
    fn each_kernel_has_its_file_name() {
        assert_eq!(Kernel::Lean.file_name(), "vmlinux");
        assert_eq!(Kernel::Cloud { deb: None }.file_name(), "vmlinuz");
    }
}
