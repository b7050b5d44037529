//! Builds the vmlet guest image.
//!
//! [`build`] writes into the output directory:
//! - `vmlinuz`: the Debian cloud kernel;
//! - `initrd.img`: a gzip-compressed `newc` cpio holding the static `vmlet-agent` as
//!   `/init`, the kernel modules the guest needs (resolved through `modules.dep`) and
//!   `/lib/modules/vmlet-modules.list` (their load order);
//! - `manifest.json`: kernel and agent versions, sha256 of every file, and a hash of the
//!   inputs, so that a second run with the same inputs does no work.
#![forbid(unsafe_code)]

mod agent;
mod cpio;
mod kernel;
mod manifest;
mod modules;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use manifest::Manifest;
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

/// What to build from.
#[derive(Debug, Clone)]
pub struct Options {
    /// Output directory.
    pub out: PathBuf,
    /// A local kernel `.deb`; without it the newest `linux-image-cloud-amd64` dependency is
    /// fetched with `apt-get download` into `out/cache`.
    pub kernel_deb: Option<PathBuf>,
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
    let deb = match &opts.kernel_deb {
        Some(deb) => deb.clone(),
        None => kernel::download(&cache)?,
    };
    let agent = match &opts.agent {
        Some(path) => path.clone(),
        None => agent::build_static()?,
    };
    let agent_bytes =
        std::fs::read(&agent).map_err(|e| Error::io(format!("read {}", agent.display()), e))?;
    let inputs = manifest::inputs_hash(&[
        &manifest::sha256_file(&deb)?,
        &manifest::sha256_hex(&agent_bytes),
        &GUEST_MODULES.join(","),
        &format!("{DRIVER_MODULES:?}"),
        env!("CARGO_PKG_VERSION"),
    ]);
    if let Some(existing) = Manifest::load_if_current(&opts.out, &inputs)? {
        progress("image is up to date");
        return Ok(existing);
    }

    let tree = kernel::extract(&deb, &cache)?;
    let modules_dir = tree.root.join("lib/modules").join(&tree.release);
    let read = |name: &str| {
        std::fs::read_to_string(modules_dir.join(name))
            .map_err(|e| Error::io(format!("read {name}"), e))
    };
    let (modules_dep, modules_builtin) = (read("modules.dep")?, read("modules.builtin")?);
    let order = modules::resolve(&modules_dep, &modules_builtin, GUEST_MODULES)?;
    let mut lists = vec![("vmlet-modules.list".to_owned(), order.clone())];
    for (driver, wanted) in DRIVER_MODULES {
        let list = modules::resolve(&modules_dep, &modules_builtin, wanted)?;
        lists.push((format!("vmlet-modules.{driver}.list"), list));
    }
    progress(&format!("packing {} modules and the agent", order.len()));
    let initrd = pack_initrd(&agent_bytes, &modules_dir, &tree.release, &lists)?;

    let vmlinuz = opts.out.join("vmlinuz");
    std::fs::copy(&tree.vmlinuz, &vmlinuz)
        .map_err(|e| Error::io(format!("copy {}", tree.vmlinuz.display()), e))?;
    let initrd_path = opts.out.join("initrd.img");
    write_atomic(&initrd_path, &initrd)?;
    let manifest = Manifest {
        kernel_release: tree.release.clone(),
        kernel_package: deb
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
        modules: order,
        vmlinuz_sha256: manifest::sha256_file(&vmlinuz)?,
        initrd_sha256: manifest::sha256_hex(&initrd),
        inputs_sha256: inputs,
    };
    manifest.save(&opts.out)?;
    progress(&format!("wrote {}", opts.out.display()));
    Ok(manifest)
}

/// Packs the agent as `/init` and every module of `lists` (each once), with each list as
/// `/lib/modules/<name>`.
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
        cpio.file(
            &format!("lib/modules/{name}"),
            0o644,
            list.join("\n").as_bytes(),
        )
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
