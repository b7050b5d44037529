//! containerd's config with vmlet's runtime, as each supported containerd reads it:
//! `vmletctl install` into a scratch root that holds the series' containerd (2.2 and 1.7 as
//! scripts/install-deps builds them, Debian's 1.6), then that containerd's `config dump`,
//! run chrooted into the root, shows what it merges from the config and the files it
//! imports. A drop-in where containerd merges one (2.x; 1.x where no file configures the CRI
//! plugin), the appended block elsewhere, and the operator's settings kept either way;
//! uninstall gives `/etc/containerd` back byte for byte.

use std::path::{Path, PathBuf};

use super::support::{stack, text};
use vmlet_integration::Stack;

/// A scratch root holding one containerd series' binary (and its libraries) at its path.
struct Root {
    dir: PathBuf,
    containerd: &'static str,
}

impl Root {
    fn new(s: &Stack, series: &str) -> Root {
        let dir = PathBuf::from(&s.dir).join(vmlet_integration::unique_id("dropin-root"));
        let (from, containerd) = match series {
            "1.6" => (PathBuf::from("/usr/bin/containerd"), "/usr/bin/containerd"),
            _ => {
                let pin = output(
                    std::process::Command::new(repo().join("scripts/containerd-pin")).arg(series),
                );
                let version = pin.split_whitespace().nth(1).unwrap().to_owned();
                (
                    PathBuf::from(format!(
                        "/usr/local/lib/vmlet/containerd-{version}/bin/containerd"
                    )),
                    "/usr/local/bin/containerd",
                )
            }
        };
        assert!(
            from.is_file(),
            "{}: containerd {series} (scripts/install-deps installs it)",
            from.display()
        );
        let root = Root { dir, containerd };
        root.copy_in(&from, Path::new(containerd));
        // A dynamically linked one (Debian's) brings its libraries.
        let ldd = vmlet_integration::bounded::output(std::process::Command::new("ldd").arg(&from))
            .unwrap();
        for word in text(&ldd.stdout).split_whitespace() {
            if word.starts_with('/') {
                root.copy_in(Path::new(word), Path::new(word));
            }
        }
        std::fs::create_dir_all(root.dir.join("etc/containerd")).unwrap();
        root
    }

    fn copy_in(&self, from: &Path, to: &Path) {
        let target = self.dir.join(to.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(from, &target).unwrap();
    }

    fn write_config(&self, text: &str) {
        std::fs::write(self.dir.join("etc/containerd/config.toml"), text).unwrap();
    }

    /// Every directory and file under the root's /etc, with a file's bytes.
    fn etc(&self) -> Vec<(PathBuf, Option<Vec<u8>>)> {
        let mut all = Vec::new();
        let mut dirs = vec![self.dir.join("etc")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    dirs.push(e.path());
                    all.push((e.path(), None));
                } else {
                    all.push((e.path(), Some(std::fs::read(e.path()).unwrap())));
                }
            }
        }
        all.sort();
        all
    }

    /// `vmletctl install` of a release with nothing but its VERSION; what it printed.
    fn install(&self, s: &Stack) -> String {
        let out = self.try_install(s);
        assert!(out.status.success(), "install: {}", text(&out.stderr));
        text(&out.stdout)
    }

    fn try_install(&self, s: &Stack) -> std::process::Output {
        let release = self.dir.with_extension("release");
        std::fs::create_dir_all(&release).unwrap();
        std::fs::write(release.join("VERSION"), "0.0.0-dropin\n").unwrap();
        vmlet_integration::bounded::output(
            std::process::Command::new(format!("{}/bin/vmletctl", s.dir))
                .args(["install", "--release", release.to_str().unwrap(), "--root"])
                .arg(&self.dir),
        )
        .unwrap()
    }

    fn uninstall(&self, s: &Stack) -> String {
        self.vmletctl(s, &["uninstall", "--root"])
    }

    fn vmletctl(&self, s: &Stack, args: &[&str]) -> String {
        output(
            std::process::Command::new(format!("{}/bin/vmletctl", s.dir))
                .args(args)
                .arg(&self.dir),
        )
    }

    /// containerd's merged config, as its `config dump` prints it chrooted into the root.
    fn dump(&self) -> toml::Table {
        let dump = output(std::process::Command::new("chroot").arg(&self.dir).args([
            self.containerd,
            "config",
            "dump",
        ]));
        dump.parse()
            .unwrap_or_else(|e| panic!("containerd config dump: {e}\n{dump}"))
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(self.dir.with_extension("release"));
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A command's stdout; it must succeed.
fn output(command: &mut std::process::Command) -> String {
    let what = vmlet_integration::bounded::describe(command);
    let out = vmlet_integration::bounded::output(command).unwrap();
    assert!(out.status.success(), "{what}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The value at the dotted `path` of the dumped config (plugin names hold dots: each step
/// is one key).
fn at<'a>(dump: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let (first, rest) = path.split_first()?;
    rest.iter()
        .try_fold(dump.get(*first)?, |v, key| v.get(*key))
}

fn runtimes(dump: &toml::Table, plugin: &str) -> Vec<String> {
    at(dump, &["plugins", plugin, "containerd", "runtimes"])
        .and_then(toml::Value::as_table)
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default()
}

const V2_CRI: &str = "io.containerd.grpc.v1.cri";
const V3_CRI: &str = "io.containerd.cri.v1.runtime";

#[test]
#[ignore]
fn containerd_2_merges_vmlets_drop_in_and_the_config_is_not_touched() {
    let s = stack();
    let root = Root::new(&s, "2.2");
    // As 2.2 writes it (importing /etc/containerd/conf.d/*.toml), with a setting of the
    // operator's in the CRI plugin's table.
    let default = output(std::process::Command::new("chroot").arg(&root.dir).args([
        root.containerd,
        "config",
        "default",
    ]));
    assert!(
        default.contains("/etc/containerd/conf.d/*.toml"),
        "{default}"
    );
    let config = format!(
        "{default}\n[plugins.'{V3_CRI}'.containerd.runtimes.operators]\n  runtime_type = 'io.containerd.runc.v2'\n"
    );
    root.write_config(&config);
    let before = root.etc();

    let said = root.install(&s);
    assert!(said.contains("conf.d/vmlet.toml, a drop-in file"), "{said}");
    assert_eq!(
        std::fs::read_to_string(root.dir.join("etc/containerd/config.toml")).unwrap(),
        config,
        "the config is as the operator wrote it"
    );
    let dump = root.dump();
    assert_eq!(
        runtimes(&dump, V3_CRI),
        ["operators", "runc", "vmlet"],
        "vmlet's beside the operator's and containerd's own"
    );
    let vmlet = at(
        &dump,
        &["plugins", V3_CRI, "containerd", "runtimes", "vmlet"],
    )
    .unwrap();
    assert_eq!(
        vmlet["runtime_path"].as_str(),
        Some("/usr/local/bin/containerd-shim-vmlet-v2")
    );

    let said = root.uninstall(&s);
    assert!(
        said.contains("removed the vmlet runtime's drop-in"),
        "{said}"
    );
    assert_eq!(
        root.etc(),
        before,
        "uninstall leaves /etc/containerd as it was"
    );
    assert_eq!(runtimes(&root.dump(), V3_CRI), ["operators", "runc"]);
    drop(root);

    // A `version = 2` config on 2.2: the drop-in in that version, migrated with the rest.
    let root = Root::new(&s, "2.2");
    root.write_config(&format!(
        "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n[plugins.\"{V2_CRI}\".containerd.runtimes.operators]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    ));
    let said = root.install(&s);
    assert!(said.contains("(config version 2;"), "{said}");
    assert_eq!(
        runtimes(&root.dump(), V3_CRI),
        ["operators", "runc", "vmlet"]
    );
}

#[test]
#[ignore]
fn containerd_1_gets_a_drop_in_only_where_it_would_not_replace_the_cri_settings() {
    let s = stack();
    let imports = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
    let operators_cni = format!("[plugins.\"{V2_CRI}\".cni]\n  bin_dir = \"/opt/operators/cni\"\n");
    for series in ["1.7", "1.6"] {
        // Why not always: a drop-in's CRI table replaces the config's whole one in 1.x.
        let root = Root::new(&s, series);
        root.write_config(&format!("{imports}{operators_cni}"));
        std::fs::create_dir_all(root.dir.join("etc/containerd/conf.d")).unwrap();
        std::fs::write(
            root.dir.join("etc/containerd/conf.d/other.toml"),
            format!("version = 2\n[plugins.\"{V2_CRI}\".containerd.runtimes.other]\n  runtime_type = \"io.containerd.runc.v2\"\n"),
        )
        .unwrap();
        let dump = root.dump();
        assert_ne!(
            at(&dump, &["plugins", V2_CRI, "cni", "bin_dir"]).and_then(toml::Value::as_str),
            Some("/opt/operators/cni"),
            "containerd {series} kept the config's CRI settings beside an imported file's: \
             vmlet could use a drop-in there"
        );
        // So a runtime appended to the config would be dropped too: refused, naming the
        // file whose table containerd takes.
        let before = root.etc();
        let refused = root.try_install(&s);
        assert!(!refused.status.success(), "{series}: install went ahead");
        let said = text(&refused.stderr);
        assert!(
            said.contains("from /etc/containerd/conf.d/other.toml alone"),
            "{series}: {said}"
        );
        root.uninstall(&s);
        assert_eq!(
            root.etc(),
            before,
            "{series}: the refused install left nothing"
        );
        drop(root);

        // No file configures the CRI plugin: a drop-in, with runc kept.
        let root = Root::new(&s, series);
        root.write_config(imports);
        let before = root.etc();
        let said = root.install(&s);
        assert!(
            said.contains("conf.d/vmlet.toml, a drop-in file"),
            "{series}: {said}"
        );
        assert_eq!(
            runtimes(&root.dump(), V2_CRI),
            ["runc", "vmlet"],
            "{series}"
        );
        root.uninstall(&s);
        assert_eq!(root.etc(), before, "{series}");
        drop(root);

        // The config configures it: appended, said why, and the settings kept.
        let root = Root::new(&s, series);
        let config = format!("{imports}{operators_cni}");
        root.write_config(&config);
        let before = root.etc();
        let said = root.install(&s);
        assert!(
            said.contains("appended: no drop-in file, as containerd 1.6 and 1.7 would replace"),
            "{series}: {said}"
        );
        let dump = root.dump();
        assert_eq!(runtimes(&dump, V2_CRI), ["runc", "vmlet"], "{series}");
        assert_eq!(
            at(&dump, &["plugins", V2_CRI, "cni", "bin_dir"]).and_then(toml::Value::as_str),
            Some("/opt/operators/cni"),
            "{series}"
        );
        root.uninstall(&s);
        assert_eq!(root.etc(), before, "{series}");
    }
}
