//! `vmletctl install` and `uninstall`: a release (the unpacked `make dist` tarball) put onto
//! a node, and taken off again without a trace.
//!
//! - Files: the release's `bin/`, `share/vmlet/` (the guest image), man pages and
//!   completions are copied under the root's `/usr/local` (the guest image to
//!   `/usr/local/share/vmlet`); each is
//!   recorded with its hash in `/var/lib/vmlet/install.json`, and uninstall removes exactly
//!   those (a file changed since is named and kept).
//! - containerd's config: where it imports a directory of drop-in files and containerd
//!   merges one ([`crate::containerd_imports`]), vmlet's CRI runtime is a file of its own
//!   there, and uninstall removes it (when unchanged). Elsewhere the runtime is appended as
//!   one marked block in the layout of the config's `version` (1.6/1.7: `version = 2`, 2.x:
//!   `version = 3`), after a backup; the result is parsed and must equal the original plus
//!   that runtime, nothing else. Uninstall removes the block, which gives the original back
//!   byte for byte (a config without a block as written is left as it is, named). A config
//!   that registers vmlet already (itself or in a file it imports) is not touched.
//! - `/etc/vmlet/config.toml` is written only when absent, and removed by uninstall only
//!   when it is still as written. Where the distribution's virtiofsd is new enough
//!   ([`crate::distro_virtiofsd`]), it names that one.
//! - Where libvirt has its AppArmor profiles, vmlet's rules for libvirtd
//!   ([`crate::node_apparmor`]) are appended to its site-local file as a marked block,
//!   libvirtd's profile is reloaded, and uninstall takes the block off again (byte for byte).
//!   Each pod's QEMU gets a profile of its own when it starts ([`vmlet_shim::vmm::pod_apparmor`]).
//! - libvirt's directory of its domains gets search permission for others, which each pod's
//!   QEMU needs ([`crate::libvirt_dir`]); uninstall gives its mode back.
//!
//! Installing twice changes nothing: the files are the same, the runtime is registered.
//! Installing another version (the DaemonSet with a newer image) takes the installed one off
//! first, as uninstall does, then installs; containerd needs a restart only when its config's
//! bytes changed ([`Steps::containerd_config_changed`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vmlet_vm_image::sha256_hex;

use crate::containerd_config::ConfigLayout;
use crate::containerd_imports::{self, Registration, Release};
pub use crate::root_files::AppendedBlock;
use crate::root_files::{
    append_block, copy_file, marked, remove_block, remove_if_unchanged, write_file, BlockRemoved,
    Removal,
};
use crate::{distro_virtiofsd, libvirt_dir, node_apparmor};
use vmlet_config::NodeConfig;
use vmlet_shim::Error;

/// Where the record of an installation is, under the root.
pub const RECORD: &str = "var/lib/vmlet/install.json";
/// containerd's config, under the root.
pub const CONTAINERD_CONFIG: &str = "etc/containerd/config.toml";
/// The node config, under the root.
pub const NODE_CONFIG: &str = "etc/vmlet/config.toml";

/// Where each part of a release goes, relative to the root: (release dir, root dir, mode).
const LAYOUT: &[(&str, &str, u32)] = &[
    ("bin", "usr/local/bin", 0o755),
    // Not under /usr/share: libvirt's AppArmor helper refuses kernels there.
    ("share/vmlet", "usr/local/share/vmlet", 0o644),
    ("share/man/man1", "usr/local/share/man/man1", 0o644),
    (
        "share/bash-completion/completions",
        "usr/local/share/bash-completion/completions",
        0o644,
    ),
    (
        "share/zsh/site-functions",
        "usr/local/share/zsh/site-functions",
        0o644,
    ),
    (
        "share/fish/vendor_completions.d",
        "usr/local/share/fish/vendor_completions.d",
        0o644,
    ),
];

/// What an installation did, for its uninstall.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub version: String,
    /// Each installed file (relative to the root) and its sha256.
    pub files: Vec<(PathBuf, String)>,
    /// The block appended to containerd's config, when one was.
    pub containerd_block: Option<String>,
    /// Whether containerd's config did not exist before (uninstall removes it then).
    pub containerd_config_created: bool,
    /// The drop-in file with vmlet's runtime, when install wrote one.
    #[serde(default)]
    pub containerd_drop_in: Option<DropIn>,
    /// The node config's sha256, when install wrote it.
    pub node_config: Option<String>,
    /// The blocks appended to AppArmor's site-local files.
    #[serde(default)]
    pub apparmor: Vec<AppendedBlock>,
    /// libvirt's directory of its domains, when install opened it to the pods' QEMUs.
    #[serde(default)]
    pub libvirt_dir: Option<libvirt_dir::ModeChange>,
}

/// A drop-in file of containerd's config that install wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropIn {
    /// The file, relative to the root.
    pub file: PathBuf,
    pub sha256: String,
    /// The topmost directory install made for it, relative to the root (uninstall removes
    /// the directories from the file's up to that one, those left empty).
    pub made_dir: Option<PathBuf>,
}

/// The node's containerd, as install needs it.
#[derive(Debug, Clone, Copy)]
pub struct NodeContainerd {
    /// How it merges an imported file.
    pub release: Release,
    /// The layout of a config that does not exist yet.
    pub default_layout: ConfigLayout,
}

/// What install or uninstall did: each step for the user, and whether containerd's config
/// changed (so that containerd is restarted only then).
#[derive(Debug, Default)]
pub struct Steps {
    pub done: Vec<String>,
    pub containerd_config_changed: bool,
}

impl Steps {
    fn push(&mut self, step: String) {
        self.done.push(step);
    }

    pub fn iter(&self) -> std::slice::Iter<'_, String> {
        self.done.iter()
    }
}

/// Installs the release unpacked at `release` under `root`, for the node's `containerd`.
pub fn install(release: &Path, root: &Path, containerd: NodeContainerd) -> Result<Steps, Error> {
    let mut steps = Steps::default();
    let version = release_version(release)?;
    let record_path = root.join(RECORD);
    let old = read_record(&record_path)?;
    let containerd_before = containerd_files(root, old.as_ref());
    let mut record = match old {
        Some(old) if old.version != version => {
            // Another version (an upgrade, or back): it comes off first, as uninstall takes
            // it off (containerd's config as before it, its files, its unchanged node config).
            steps.push(format!(
                "vmlet {} is installed: replacing it with {version}",
                old.version
            ));
            let old_steps = uninstall(root)?;
            steps.done.extend(old_steps.done);
            Record {
                version: version.clone(),
                ..Default::default()
            }
        }
        Some(old) => old,
        None => Record {
            version: version.clone(),
            ..Default::default()
        },
    };
    install_files(release, root, &mut record, &mut steps)?;
    if let Err(e) = register_runtime(root, containerd, &mut record, &mut steps) {
        // What is installed stays recorded, for uninstall to take off.
        let recorded = serde_json::to_vec_pretty(&record)
            .map_err(|e| Error::Internal(e.to_string()))
            .and_then(|json| write_file(&record_path, &json, 0o644));
        return Err(Error::FailedPrecondition(format!(
            "{}. vmlet {version}'s files are installed but its runtime is not registered with containerd: fix that and run install again, or `vmletctl uninstall`{}",
            e.message(),
            match recorded {
                Ok(()) => String::new(),
                Err(w) => format!(" (which cannot find them: {})", w.message()),
            }
        )));
    }
    // The node config, only when absent.
    let node_config = root.join(NODE_CONFIG);
    let defaults = release.join(NODE_CONFIG);
    if !node_config.exists() && defaults.is_file() {
        let mut text = std::fs::read_to_string(&defaults)
            .map_err(|e| Error::io(format!("read {}", defaults.display()), e))?;
        if let Some(version) = distro_virtiofsd::found(root) {
            text = distro_virtiofsd::node_config(&text);
            steps.push(format!(
                "the distribution's virtiofsd {version} (/{}) serves the pods' shares",
                distro_virtiofsd::PATH
            ));
        }
        write_file(&node_config, text.as_bytes(), 0o644)?;
        record.node_config = Some(sha256_hex(text.as_bytes()));
        steps.push(format!("wrote /{NODE_CONFIG}"));
    }
    if record.apparmor.is_empty() && root.join(node_apparmor::LIBVIRTD_PROFILE).is_file() {
        allow_in_apparmor(root, &node_config, &mut record, &mut steps)?;
    }
    // Each time: an upgrade of libvirt's package may have closed it again (the mode found
    // first is the one uninstall gives back).
    if let Some(change) = libvirt_dir::open_to_pods(root)? {
        steps.push(format!(
            "made /{} {:04o} (was {:04o}): each pod's QEMU, a user of its own, opens its domain's files there",
            change.dir.display(),
            change.after,
            change.before
        ));
        record.libvirt_dir.get_or_insert(change);
    }
    let json = serde_json::to_vec_pretty(&record).map_err(|e| Error::Internal(e.to_string()))?;
    write_file(&record_path, &json, 0o644)?;
    let containerd_after = containerd_files(root, Some(&record));
    steps.containerd_config_changed =
        containerd_before
            .keys()
            .chain(containerd_after.keys())
            .any(|path| {
                containerd_before.get(path).and_then(Option::as_ref)
                    != containerd_after.get(path).and_then(Option::as_ref)
            });
    if steps.done.is_empty() {
        steps.push(format!(
            "vmlet {version} is installed already; nothing changed"
        ));
    }
    Ok(steps)
}

/// The version of the release unpacked at `release` (its `VERSION` file).
fn release_version(release: &Path) -> Result<String, Error> {
    Ok(std::fs::read_to_string(release.join("VERSION"))
        .map_err(|e| {
            Error::io(
                format!("{}: not a vmlet release (no VERSION)", release.display()),
                e,
            )
        })?
        .trim()
        .to_owned())
}

/// The release's files into their places under `root` ([`LAYOUT`]), each recorded.
fn install_files(
    release: &Path,
    root: &Path,
    record: &mut Record,
    steps: &mut Steps,
) -> Result<(), Error> {
    for (from, to, mode) in LAYOUT {
        let dir = release.join(from);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        let mut new = 0;
        for name in &names {
            let relative = Path::new(to).join(name);
            let hash = copy_file(&dir.join(name), &root.join(&relative), *mode)?;
            if !record.files.iter().any(|(p, _)| p == &relative) {
                record.files.push((relative, hash));
                new += 1;
            }
        }
        if new > 0 {
            steps.push(format!("installed {new} files in /{to}"));
        }
    }
    Ok(())
}

/// containerd's config and the drop-in `record` names, when it does, each with its bytes
/// (None: no such file): what a restart of containerd would read anew.
type ContainerdFiles = std::collections::BTreeMap<PathBuf, Option<Vec<u8>>>;

fn containerd_files(root: &Path, record: Option<&Record>) -> ContainerdFiles {
    let drop_in = record.and_then(|r| r.containerd_drop_in.as_ref());
    std::iter::once(Path::new(CONTAINERD_CONFIG))
        .chain(drop_in.map(|d| d.file.as_path()))
        .map(|file| (file.to_owned(), std::fs::read(root.join(file)).ok()))
        .collect()
}

/// vmlet's CRI runtime in containerd's config under `root`: a drop-in file where the config
/// imports one and containerd merges it, else a block appended to the config (a backup of
/// it beside it); nothing when a runtime starts vmlet already. What was written is recorded.
fn register_runtime(
    root: &Path,
    node: NodeContainerd,
    record: &mut Record,
    steps: &mut Steps,
) -> Result<(), Error> {
    let containerd = &root.join(CONTAINERD_CONFIG);
    let (text, existed) = match std::fs::read_to_string(containerd) {
        Ok(text) => (text, true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), false),
        Err(e) => return Err(Error::io(format!("read {}", containerd.display()), e)),
    };
    let layout = ConfigLayout::of(&text, node.default_layout)?;
    let node_path = Path::new("/").join(CONTAINERD_CONFIG);
    let (merged, block, why) = match containerd_imports::plan(
        root,
        &node_path,
        &text,
        layout,
        node.release,
    )? {
        Registration::Present(names) => {
            steps.push(format!(
                "/{CONTAINERD_CONFIG}: a runtime starts vmlet already ({}); left as it is",
                names.join(", ")
            ));
            return Ok(());
        }
        Registration::DropIn { file, text } => {
            let relative = file.strip_prefix("/").unwrap_or(&file).to_owned();
            let made_dir = relative
                .ancestors()
                .skip(1)
                .take_while(|d| !d.as_os_str().is_empty() && !root.join(d).exists())
                .last()
                .map(Path::to_owned);
            write_file(&root.join(&relative), text.as_bytes(), 0o644)?;
            record.containerd_drop_in = Some(DropIn {
                file: relative,
                sha256: sha256_hex(text.as_bytes()),
                made_dir,
            });
            steps.push(format!(
                    "registered the CRI runtime vmlet in {}, a drop-in file /{CONTAINERD_CONFIG} imports (config version {}; the config is left as it is); restart containerd to use it",
                    file.display(),
                    layout.version()
                ));
            return Ok(());
        }
        Registration::Append { merged, block, why } => (merged, block, why),
    };
    if existed {
        let backup = backup_path(containerd);
        std::fs::write(&backup, &text)
            .map_err(|e| Error::io(format!("write {}", backup.display()), e))?;
        steps.push(format!(
            "backed up /{CONTAINERD_CONFIG} to {}",
            backup.display()
        ));
    }
    write_file(containerd, merged.as_bytes(), 0o644)?;
    record.containerd_block = Some(block);
    record.containerd_config_created = !existed;
    steps.push(format!(
        "registered the CRI runtime vmlet in /{CONTAINERD_CONFIG} (config version {}), appended: no drop-in file, as {why}; restart containerd to use it",
        layout.version()
    ));
    Ok(())
}

/// vmlet's rules in libvirt's AppArmor profiles under `root` (for the node config at
/// `node_config`, or the defaults), recorded, and the profiles reloaded.
fn allow_in_apparmor(
    root: &Path,
    node_config: &Path,
    record: &mut Record,
    steps: &mut Steps,
) -> Result<(), Error> {
    let config = match std::fs::read_to_string(node_config) {
        Ok(text) => NodeConfig::from_toml(&text, node_config).map_err(Error::Config)?,
        Err(_) => NodeConfig::default(),
    };
    for (file, rules) in node_apparmor::rules(&config)? {
        record
            .apparmor
            .push(append_block(root, Path::new(file), &rules)?);
    }
    steps.push(format!(
        "allowed libvirtd to start vmlet's wrapper in its AppArmor profile (/{}); each pod's QEMU gets a profile of its own",
        node_apparmor::LOCAL_LIBVIRTD,
    ));
    steps.push(node_apparmor::reload(root)?);
    Ok(())
}

/// Takes off what the installation recorded under `root` did.
pub fn uninstall(root: &Path) -> Result<Steps, Error> {
    let record_path = root.join(RECORD);
    let Some(record) = read_record(&record_path)? else {
        return Err(Error::NotFound(format!(
            "a vmlet installation under {} ({} is missing)",
            root.display(),
            record_path.display()
        )));
    };
    let mut steps = Steps::default();
    let mut kept = Vec::new();
    let mut removed = 0;
    for (relative, hash) in &record.files {
        match remove_if_unchanged(root, relative, hash)? {
            Removal::Removed => removed += 1,
            Removal::Changed(what) => kept.push(what),
            Removal::Gone => {}
        }
    }
    steps.push(format!("removed {removed} installed files"));
    if let Some(block) = &record.containerd_block {
        let appended = AppendedBlock {
            file: CONTAINERD_CONFIG.into(),
            block: block.clone(),
            created: record.containerd_config_created,
        };
        let containerd = root.join(CONTAINERD_CONFIG);
        let removed = remove_block(root, &appended)?;
        steps.containerd_config_changed = removed.is_some();
        match removed {
            Some(BlockRemoved::FileRemoved) => {
                steps.push(format!("removed /{CONTAINERD_CONFIG} (install made it)"))
            }
            Some(BlockRemoved::Restored) => {
                let _ = std::fs::remove_file(backup_path(&containerd));
                steps.push(format!("removed the vmlet runtime from /{CONTAINERD_CONFIG}; restart containerd"));
            }
            None => kept.push(format!(
                "/{CONTAINERD_CONFIG}: vmlet's block is no longer at its end (edited since); remove the [..runtimes.vmlet] table by hand (the config before install: {})",
                backup_path(&containerd).display()
            )),
        }
    }
    if let Some(drop_in) = &record.containerd_drop_in {
        match remove_if_unchanged(root, &drop_in.file, &drop_in.sha256)? {
            Removal::Removed => {
                steps.containerd_config_changed = true;
                steps.push(format!(
                    "removed the vmlet runtime's drop-in /{}; restart containerd",
                    drop_in.file.display()
                ));
            }
            Removal::Changed(what) => kept.push(what),
            Removal::Gone => {}
        }
        if let Some(top) = drop_in
            .made_dir
            .as_ref()
            .filter(|t| drop_in.file.starts_with(t))
        {
            for dir in drop_in.file.ancestors().skip(1) {
                if dir.as_os_str().is_empty()
                    || std::fs::remove_dir(root.join(dir)).is_err()
                    || dir == top.as_path()
                {
                    break;
                }
            }
        }
    }
    if let Some(hash) = &record.node_config {
        match remove_if_unchanged(root, Path::new(NODE_CONFIG), hash)? {
            Removal::Removed => steps.push(format!("removed /{NODE_CONFIG}")),
            Removal::Changed(what) => kept.push(what),
            Removal::Gone => {}
        }
    }
    if !record.apparmor.is_empty() {
        for appended in &record.apparmor {
            match remove_block(root, appended)? {
                Some(_) => steps.push(format!(
                    "removed vmlet's rules from /{}",
                    appended.file.display()
                )),
                None => kept.push(format!(
                    "/{}: vmlet's block is no longer at its end (edited since); remove it by hand",
                    appended.file.display()
                )),
            }
        }
        steps.push(node_apparmor::reload(root)?);
    }
    if let Some(change) = &record.libvirt_dir {
        steps.done.extend(libvirt_dir::restore(root, change)?);
    }
    std::fs::remove_file(&record_path)
        .map_err(|e| Error::io(format!("remove {}", record_path.display()), e))?;
    // The directories install made, when empty.
    for dir in ["var/lib/vmlet", "usr/local/share/vmlet", "etc/vmlet"] {
        let _ = std::fs::remove_dir(root.join(dir));
    }
    for what in kept {
        steps.push(format!("kept {what}"));
    }
    Ok(steps)
}

/// Whether AppArmor's local files under `root` hold vmlet's rules for `config` as this
/// version writes them (`vmletctl check`); each file is read up to `limit` bytes.
pub fn apparmor_rules_installed(root: &Path, config: &NodeConfig, limit: u64) -> bool {
    use std::io::Read;
    node_apparmor::rules(config).is_ok_and(|rules| {
        rules.iter().all(|(file, rules)| {
            let mut text = String::new();
            std::fs::File::open(root.join(file))
                .and_then(|f| f.take(limit).read_to_string(&mut text))
                .is_ok_and(|_| text.contains(&marked(rules)))
        })
    })
}

fn backup_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_owned();
    name.push(".before-vmlet");
    config.with_file_name(name)
}

fn read_record(path: &Path) -> Result<Option<Record>, Error> {
    match std::fs::read(path) {
        Ok(json) => serde_json::from_slice(&json)
            .map(Some)
            .map_err(|e| Error::FailedPrecondition(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerd_config::tests::DEBIAN_16;

    /// containerd 2.x, which would make its config in `version = 3`.
    const NODE: NodeContainerd = NodeContainerd {
        release: Release::Two,
        default_layout: ConfigLayout::V3,
    };

    fn release(dir: &Path) -> PathBuf {
        let r = dir.join("release");
        for (path, text) in [
            ("VERSION", "0.1.0\n"),
            ("bin/vmletctl", "#!/bin/sh\n"),
            ("bin/containerd-shim-vmlet-v2", "shim"),
            ("share/vmlet/vmlinux", "kernel"),
            ("share/man/man1/vmletctl.1", ".TH vmletctl"),
            ("etc/vmlet/config.toml", "# defaults\n"),
        ] {
            std::fs::create_dir_all(r.join(path).parent().unwrap()).unwrap();
            std::fs::write(r.join(path), text).unwrap();
        }
        r
    }

    /// A root under `dir` whose containerd config is `text`.
    fn root_with_config(dir: &Path, text: &str) -> PathBuf {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
        std::fs::write(root.join(CONTAINERD_CONFIG), text).unwrap();
        root
    }

    /// Every file under `dir` with its bytes.
    fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut all = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    all.push((e.path(), std::fs::read(e.path()).unwrap()));
                }
            }
        }
        all.sort();
        all
    }

    #[test]
    fn install_twice_changes_nothing_and_uninstall_restores_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let release = release(dir.path());
        let root = root_with_config(dir.path(), DEBIAN_16);
        std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        std::fs::write(root.join("usr/local/bin/other"), "not vmlet's").unwrap();
        let before = tree(&root);

        let steps = install(&release, &root, NODE).unwrap();
        assert!(
            steps
                .iter()
                .any(|s| s.contains("registered the CRI runtime vmlet")),
            "{steps:?}"
        );
        assert!(steps.containerd_config_changed);
        let config = std::fs::read_to_string(root.join(CONTAINERD_CONFIG)).unwrap();
        assert!(
            config.contains("io.containerd.grpc.v1.cri\".containerd.runtimes.vmlet"),
            "{config}"
        );
        assert_eq!(
            std::fs::read(root.join("usr/local/bin/vmletctl")).unwrap(),
            b"#!/bin/sh\n"
        );
        assert_eq!(
            std::fs::read(root.join(NODE_CONFIG)).unwrap(),
            b"# defaults\n"
        );
        let installed = tree(&root);

        let again = install(&release, &root, NODE).unwrap();
        assert!(again.iter().all(|s| !s.contains("registered")), "{again:?}");
        assert!(
            !again.containerd_config_changed,
            "containerd needs no restart"
        );
        assert_eq!(tree(&root), installed, "installing twice changes nothing");

        let steps = uninstall(&root).unwrap();
        assert!(steps.iter().all(|s| !s.starts_with("kept")), "{steps:?}");
        assert!(steps.containerd_config_changed);
        assert_eq!(
            tree(&root),
            before,
            "uninstall restores every file byte for byte"
        );
        assert!(uninstall(&root).is_err(), "nothing left to uninstall");
    }

    #[test]
    fn another_version_is_replaced_and_containerd_restarted_only_when_its_config_changed() {
        let dir = tempfile::tempdir().unwrap();
        let old = release(dir.path());
        std::fs::write(old.join("bin/vmlet-old-only"), "gone in the next version").unwrap();
        let root = root_with_config(dir.path(), DEBIAN_16);
        let before = tree(&root);
        install(&old, &root, NODE).unwrap();

        let new = dir.path().join("new");
        for (path, bytes) in tree(&old) {
            let target = new.join(path.strip_prefix(&old).unwrap());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(target, bytes).unwrap();
        }
        std::fs::remove_file(new.join("bin/vmlet-old-only")).unwrap();
        std::fs::write(new.join("VERSION"), "0.2.0\n").unwrap();
        std::fs::write(new.join("bin/vmletctl"), "#!/bin/sh\n# 0.2.0\n").unwrap();

        let steps = install(&new, &root, NODE).unwrap();
        assert!(
            steps.iter().any(|s| s.contains("replacing it with 0.2.0")),
            "{steps:?}"
        );
        // The same block: containerd's config bytes are as they were, no restart.
        assert!(!steps.containerd_config_changed, "{steps:?}");
        assert!(!root.join("usr/local/bin/vmlet-old-only").exists());
        assert_eq!(
            std::fs::read(root.join("usr/local/bin/vmletctl")).unwrap(),
            b"#!/bin/sh\n# 0.2.0\n"
        );
        let record = read_record(&root.join(RECORD)).unwrap().unwrap();
        assert_eq!(record.version, "0.2.0");
        uninstall(&root).unwrap();
        assert_eq!(
            tree(&root),
            before,
            "the new version's uninstall restores the root"
        );
    }

    #[test]
    fn a_config_that_imports_drop_ins_is_left_as_it_is_and_the_drop_in_goes_again() {
        let dir = tempfile::tempdir().unwrap();
        let release = release(dir.path());
        // The drop-in's directory and its parent do not exist yet.
        let config = "version = 3\nimports = ['/etc/k8s/containerd.d/*.toml']\n";
        let root = root_with_config(dir.path(), config);
        let before = tree(&root);

        let steps = install(&release, &root, NODE).unwrap();
        assert!(steps.containerd_config_changed, "{steps:?}");
        assert!(
            steps
                .iter()
                .any(|s| s.contains("in /etc/k8s/containerd.d/vmlet.toml, a drop-in file")),
            "{steps:?}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join(CONTAINERD_CONFIG)).unwrap(),
            config,
            "the operator's config is not touched"
        );
        assert!(!root
            .join("etc/containerd/config.toml.before-vmlet")
            .exists());
        let drop_in =
            std::fs::read_to_string(root.join("etc/k8s/containerd.d/vmlet.toml")).unwrap();
        assert!(drop_in.contains("runtimes.vmlet]"), "{drop_in}");

        // Again, and another version over it: containerd reads the same bytes.
        let again = install(&release, &root, NODE).unwrap();
        assert!(!again.containerd_config_changed, "{again:?}");
        assert!(
            again.iter().any(|s| s.contains("vmlet already")),
            "{again:?}"
        );
        std::fs::write(release.join("VERSION"), "0.2.0\n").unwrap();
        let upgrade = install(&release, &root, NODE).unwrap();
        assert!(!upgrade.containerd_config_changed, "{upgrade:?}");

        let steps = uninstall(&root).unwrap();
        assert!(steps.containerd_config_changed, "{steps:?}");
        assert!(steps.iter().all(|s| !s.starts_with("kept")), "{steps:?}");
        assert_eq!(
            tree(&root),
            before,
            "the drop-in and its directory are gone"
        );
        assert!(
            !root.join("etc/k8s").exists(),
            "the directories install made are gone"
        );
        assert!(root.join("etc/containerd").exists());
    }

    #[test]
    fn an_upgrade_moves_an_appended_runtime_into_a_drop_in_and_a_refusal_keeps_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let release = release(dir.path());
        let root = root_with_config(dir.path(), "version = 3\n");
        install(&release, &root, NODE).unwrap();
        // The operator imports a directory since; the block stays at the config's end.
        let appended = std::fs::read_to_string(root.join(CONTAINERD_CONFIG)).unwrap();
        let imports = "imports = ['/etc/containerd/conf.d/*.toml']\n";
        std::fs::write(root.join(CONTAINERD_CONFIG), format!("{imports}{appended}")).unwrap();
        std::fs::write(release.join("VERSION"), "0.2.0\n").unwrap();
        let steps = install(&release, &root, NODE).unwrap();
        assert!(steps.containerd_config_changed, "{steps:?}");
        assert_eq!(
            std::fs::read_to_string(root.join(CONTAINERD_CONFIG)).unwrap(),
            format!("{imports}version = 3\n")
        );
        assert!(root.join("etc/containerd/conf.d/vmlet.toml").is_file());
        uninstall(&root).unwrap();

        // A file of the operator's where the drop-in goes: refused, and what was installed
        // stays recorded for uninstall.
        std::fs::create_dir_all(root.join("etc/containerd/conf.d")).unwrap();
        std::fs::write(root.join("etc/containerd/conf.d/vmlet.toml"), "# mine\n").unwrap();
        let err = install(&release, &root, NODE).unwrap_err().message();
        assert!(err.contains("conf.d/vmlet.toml is there"), "{err}");
        assert!(root.join("usr/local/bin/vmletctl").exists());
        uninstall(&root).unwrap();
        assert!(!root.join("usr/local/bin/vmletctl").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("etc/containerd/conf.d/vmlet.toml")).unwrap(),
            "# mine\n"
        );
    }

    #[test]
    fn apparmor_rules_are_appended_where_libvirt_has_its_profiles_and_taken_off_again() {
        let dir = tempfile::tempdir().unwrap();
        let release = release(dir.path());
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc/apparmor.d/local")).unwrap();
        std::fs::write(
            root.join(node_apparmor::LIBVIRTD_PROFILE),
            "profile libvirtd {}\n",
        )
        .unwrap();
        std::fs::write(
            root.join(node_apparmor::LOCAL_LIBVIRTD),
            "# Site-specific additions\n  /opt/admins r,",
        )
        .unwrap();
        let before = tree(&root);

        let steps = install(&release, &root, NODE).unwrap();
        assert!(
            steps.iter().any(|s| s.contains("AppArmor is off here")),
            "{steps:?}"
        );
        let libvirtd = std::fs::read_to_string(root.join(node_apparmor::LOCAL_LIBVIRTD)).unwrap();
        assert!(
            libvirtd.starts_with("# Site-specific additions\n  /opt/admins r,\n  # vmlet:")
                && libvirtd.contains("\"/usr/local/bin/vmlet-vmwrapper\" PUx,"),
            "{libvirtd}"
        );
        // Each pod's QEMU has its own profile: nothing for every VM.
        assert!(!root.join("etc/apparmor.d/local/abstractions").exists());
        // Again: nothing more.
        let installed = tree(&root);
        install(&release, &root, NODE).unwrap();
        assert_eq!(tree(&root), installed);

        uninstall(&root).unwrap();
        assert_eq!(tree(&root), before, "the local files are as they were");
    }

    #[test]
    fn a_node_config_of_the_admins_is_kept_and_an_edited_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let release = release(dir.path());
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc/vmlet")).unwrap();
        std::fs::write(root.join(NODE_CONFIG), "state_dir = \"/x\"\n").unwrap();
        install(&release, &root, NODE).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join(NODE_CONFIG)).unwrap(),
            "state_dir = \"/x\"\n"
        );
        // containerd had no config: install wrote one in 2.x's layout.
        let config = std::fs::read_to_string(root.join(CONTAINERD_CONFIG)).unwrap();
        assert!(config.contains("version = 3"), "{config}");
        std::fs::write(root.join("usr/local/bin/vmletctl"), "edited").unwrap();
        let steps = uninstall(&root).unwrap();
        assert!(
            steps
                .iter()
                .any(|s| s.contains("kept /usr/local/bin/vmletctl")),
            "{steps:?}"
        );
        assert!(
            !root.join(CONTAINERD_CONFIG).exists(),
            "install made it, uninstall removed it"
        );
        assert_eq!(
            std::fs::read_to_string(root.join(NODE_CONFIG)).unwrap(),
            "state_dir = \"/x\"\n"
        );
    }
}
