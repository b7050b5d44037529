//! The lean guest kernel: Debian's kernel source package with the patches of `kernel/`
//! ([`PATCHES`], each saying why in its header), built with `make allnoconfig` and the options
//! of `kernel/vmlet.config` (each commented with why the guest needs it), into an
//! uncompressed `vmlinux` that QEMU starts at its PVH entry point. No modules: everything the
//! guest needs is built in.
//!
//! The result is cached under `cache/lean-<hash>` by the source package's file name (it
//! carries its version), the fragment, the patches and this builder's version; the source
//! tree is removed once the kernel is built.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::kernel::{download_package, run};
use crate::{manifest, progress, Error};

/// Debian's kernel source package the lean kernel is built from.
pub const SOURCE_PACKAGE: &str = "linux-source-6.1";

/// The configuration fragment, kept in the repository.
pub const FRAGMENT: &str = include_str!("../kernel/vmlet.config");

/// The patches applied to the source, in order: (file name, text for `patch -p1`).
pub const PATCHES: &[(&str, &str)] = &[
    (
        "virtiofs-zero-reply-pages.patch",
        include_str!("../kernel/virtiofs-zero-reply-pages.patch"),
    ),
    (
        "fuse-keep-unchanged-cache.patch",
        include_str!("../kernel/fuse-keep-unchanged-cache.patch"),
    ),
];

/// A built lean kernel.
pub struct LeanKernel {
    /// The uncompressed ELF kernel with a PVH note.
    pub vmlinux: PathBuf,
    /// `make kernelrelease`.
    pub release: String,
    /// The source package's file name.
    pub source: String,
}

/// The options the fragment sets (`CONFIG_X=y` lines), in order.
pub fn fragment_options(fragment: &str) -> Vec<&str> {
    fragment
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("CONFIG_"))
        .collect()
}

/// The fragment's options that `.config` does not hold as written: kconfig dropped them
/// because a dependency is off (or the option does not exist in this source).
pub fn dropped_options<'a>(fragment: &'a str, config: &str) -> Vec<&'a str> {
    let set: std::collections::HashSet<&str> = config.lines().map(str::trim).collect();
    fragment_options(fragment)
        .into_iter()
        .filter(|o| !set.contains(o))
        .collect()
}

/// Builds the lean kernel into `cache` unless a build of the same inputs is there.
pub fn build(cache: &Path) -> Result<LeanKernel, Error> {
    let deb = download_package(cache, SOURCE_PACKAGE)?;
    let source = deb
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut inputs = vec![source.as_str(), FRAGMENT, env!("CARGO_PKG_VERSION")];
    inputs.extend(PATCHES.iter().flat_map(|(name, text)| [*name, *text]));
    let key = manifest::inputs_hash(&inputs);
    let dir = cache.join(format!("lean-{}", &key[..16]));
    let vmlinux = dir.join("vmlinux");
    let release_file = dir.join("release");
    if let (true, Ok(release)) = (vmlinux.exists(), std::fs::read_to_string(&release_file)) {
        return Ok(LeanKernel {
            vmlinux,
            release: release.trim().to_owned(),
            source,
        });
    }
    let tree = cache.join("lean-build");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).map_err(|e| Error::io("create kernel build dir", e))?;
    // make runs in the tree: the paths it is given (the fragment's) must not be relative.
    let tree = tree
        .canonicalize()
        .map_err(|e| Error::io("resolve kernel build dir", e))?;
    let result = build_in(&deb, &tree, &dir);
    let _ = std::fs::remove_dir_all(&tree);
    let release = result?;
    std::fs::write(&release_file, &release).map_err(|e| Error::io("write release", e))?;
    Ok(LeanKernel {
        vmlinux,
        release,
        source,
    })
}

/// Unpacks the source, configures and builds it in `tree`; writes `vmlinux` and `config`
/// into `out`; returns the kernel release.
fn build_in(deb: &Path, tree: &Path, out: &Path) -> Result<String, Error> {
    progress(&format!("unpacking {}", deb.display()));
    let tarball = format!("./usr/src/{SOURCE_PACKAGE}.tar.xz");
    run(Command::new("sh")
        .arg("-c")
        .arg(
            r#"dpkg-deb --fsys-tarfile "$1" | tar -xO "$2" | tar -xJ -C "$3" --strip-components=1"#,
        )
        .arg("sh")
        .arg(deb)
        .arg(&tarball)
        .arg(tree))?;
    for (name, text) in PATCHES {
        progress(&format!("applying kernel/{name}"));
        let file = tree.join(name);
        std::fs::write(&file, text).map_err(|e| Error::io("write kernel patch", e))?;
        run(Command::new("patch")
            .args(["-p1", "--forward", "--batch", "--quiet", "-d"])
            .arg(tree)
            .arg("-i")
            .arg(&file))?;
    }
    let fragment = tree.join("vmlet.config");
    std::fs::write(&fragment, FRAGMENT).map_err(|e| Error::io("write config fragment", e))?;
    let make = |args: &[&str]| {
        let mut command = Command::new("make");
        command
            .arg("-C")
            .arg(tree)
            .arg("ARCH=x86_64")
            .args(args)
            .env("KCONFIG_ALLCONFIG", &fragment);
        command
    };
    run(&mut make(&["allnoconfig"]))?;
    let config = std::fs::read_to_string(tree.join(".config"))
        .map_err(|e| Error::io("read the kernel's .config", e))?;
    let dropped = dropped_options(FRAGMENT, &config);
    if !dropped.is_empty() {
        return Err(Error::Kernel(format!(
            "kernel/vmlet.config: {SOURCE_PACKAGE} did not take {} (a dependency is off or \
             the option does not exist)",
            dropped.join(", ")
        )));
    }
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    progress(&format!(
        "building the lean kernel from {SOURCE_PACKAGE} ({jobs} jobs, a few minutes)"
    ));
    run(&mut make(&[&format!("-j{jobs}"), "vmlinux"]))?;
    let release = run(&mut make(&["-s", "kernelrelease"]))?.trim().to_owned();
    std::fs::create_dir_all(out).map_err(|e| Error::io("create lean kernel dir", e))?;
    let tmp = out.join("vmlinux.tmp");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(tree.join("vmlinux"))
        .arg(&tmp))?;
    std::fs::copy(tree.join(".config"), out.join("config"))
        .map_err(|e| Error::io("keep the kernel's .config", e))?;
    std::fs::rename(&tmp, out.join("vmlinux")).map_err(|e| Error::io("keep vmlinux", e))?;
    Ok(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_of_the_fragment_is_a_set_option_with_a_reason() {
        let options = fragment_options(FRAGMENT);
        assert!(options.len() > 50);
        let lines: Vec<&str> = FRAGMENT.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with("CONFIG_") {
                continue;
            }
            assert!(
                line.ends_with("=y"),
                "{line}: the fragment only switches on"
            );
            // Each option is under a comment: directly, or through the options above it.
            let above = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.starts_with("CONFIG_"))
                .unwrap();
            assert!(above.starts_with('#'), "{line} has no comment saying why");
        }
        for needed in [
            "CONFIG_PVH=y",
            "CONFIG_VIRTIO_VSOCKETS=y",
            "CONFIG_VIRTIO_FS=y",
        ] {
            assert!(options.contains(&needed), "{needed}");
        }
    }

    #[test]
    fn every_patch_says_why_and_touches_only_the_files_it_names() {
        for (name, text) in PATCHES {
            let header: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("--- "))
                .collect();
            assert!(header.len() >= 3, "{name}: a header says why");
            let files: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("+++ b/"))
                .collect();
            assert!(!files.is_empty(), "{name}: patches a file");
            for file in files {
                assert!(!file.contains(".."), "{name}: {file}");
                assert!(text.contains(&format!("--- a/{file}")), "{name}: {file}");
            }
        }
    }

    #[test]
    fn an_option_kconfig_dropped_is_named() {
        let fragment = "# why\nCONFIG_A=y\nCONFIG_B=y\n";
        assert!(dropped_options(fragment, "CONFIG_A=y\nCONFIG_B=y\n").is_empty());
        assert_eq!(
            dropped_options(fragment, "CONFIG_A=y\n# CONFIG_B is not set\n"),
            vec!["CONFIG_B=y"]
        );
    }
}
