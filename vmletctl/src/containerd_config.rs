//! containerd's config as vmlet meets it on a node: which layout it has (`version = 2` for
//! 1.6 and 1.7, `version = 3` for 2.x), which CRI runtimes in it start vmlet's shim, vmlet's
//! runtime appended as one checked block and taken off again, and containerd restarted.
//! `vmletctl install` and `uninstall` (`node_install`) and `vmletctl check` use it.

use vmlet_shim::Error;

/// The first line of each block `vmletctl install` appends to a node's file (containerd's
/// config, AppArmor's local files).
pub const BLOCK_START: &str =
    "# vmlet: added by `vmletctl install`; `vmletctl uninstall` removes this block.";

/// Which layout containerd's config has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigLayout {
    /// `version = 2` (containerd 1.6 and 1.7): the CRI plugin `io.containerd.grpc.v1.cri`.
    V2,
    /// `version = 3` (containerd 2.x): the CRI runtime plugin `io.containerd.cri.v1.runtime`.
    V3,
}

impl ConfigLayout {
    /// The layout of a config's text; an empty config takes `default`, which comes from
    /// containerd's major version.
    pub fn of(text: &str, default: ConfigLayout) -> Result<Self, Error> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            invalid(format!("containerd's config: {}", e.message()))
        })?;
        match table.get("version").and_then(toml::Value::as_integer) {
            Some(2) => Ok(ConfigLayout::V2),
            Some(3) => Ok(ConfigLayout::V3),
            None if table.is_empty() => Ok(default),
            other => Err(invalid(format!(
                "containerd's config has version {}: vmlet registers its runtime in versions 2 (containerd 1.6, 1.7) and 3 (2.x); migrate it with `containerd config migrate`",
                other.map_or("1 (no version key)".to_owned(), |v| v.to_string())
            ))),
        }
    }

    /// The config's `version`.
    pub fn version(self) -> u8 {
        match self {
            ConfigLayout::V2 => 2,
            ConfigLayout::V3 => 3,
        }
    }

    /// The plugin whose `containerd.runtimes` table holds the CRI runtimes.
    pub fn plugin(self) -> &'static str {
        match self {
            ConfigLayout::V2 => "io.containerd.grpc.v1.cri",
            ConfigLayout::V3 => "io.containerd.cri.v1.runtime",
        }
    }

    /// The runtime's table, as the deploy/ snippets have it.
    fn snippet(self) -> &'static str {
        match self {
            ConfigLayout::V2 => include_str!("../../deploy/containerd-vmlet-v2.toml"),
            ConfigLayout::V3 => include_str!("../../deploy/containerd-vmlet-v3.toml"),
        }
    }
}

pub(crate) fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// The CRI runtimes in a containerd config (version 2 or 3) that start vmlet's shim: by
/// runtime_type `io.containerd.vmlet.v2`, or by a runtime_path to `containerd-shim-vmlet-v2`.
pub fn vmlet_runtimes(config_text: &str) -> Result<Vec<String>, String> {
    Ok(vmlet_runtimes_in(&parse(config_text)?))
}

pub(crate) fn parse(text: &str) -> Result<toml::Table, String> {
    text.parse()
        .map_err(|e: toml::de::Error| e.message().to_owned())
}

/// The CRI plugin's `containerd` table in `layout`, in a parsed config.
fn cri_containerd(config: &toml::Table, layout: ConfigLayout) -> Option<&toml::Value> {
    config
        .get("plugins")?
        .get(layout.plugin())?
        .get("containerd")
}

/// [`vmlet_runtimes`] of a parsed config.
pub(crate) fn vmlet_runtimes_in(config: &toml::Table) -> Vec<String> {
    let mut found = Vec::new();
    for layout in [ConfigLayout::V2, ConfigLayout::V3] {
        let runtimes = cri_containerd(config, layout)
            .and_then(|c| c.get("runtimes"))
            .and_then(toml::Value::as_table);
        for (name, runtime) in runtimes.into_iter().flatten() {
            let text = |key| runtime.get(key).and_then(toml::Value::as_str).unwrap_or("");
            if text("runtime_type") == "io.containerd.vmlet.v2"
                || text("runtime_path").ends_with("/containerd-shim-vmlet-v2")
            {
                found.push(format!("{}.runtimes.{name}", layout.plugin()));
            }
        }
    }
    found
}

/// containerd's config with vmlet's runtime: None when a runtime starts vmlet already,
/// else the text with the block appended (checked: the parsed result is the original plus
/// vmlet's runtime, nothing else).
pub fn add_runtime(text: &str, layout: ConfigLayout) -> Result<Option<(String, String)>, Error> {
    let config = parse(text).map_err(|e| invalid(format!("containerd's config: {e}")))?;
    if !vmlet_runtimes_in(&config).is_empty() {
        return Ok(None);
    }
    let mut block = String::new();
    if !text.is_empty() && !text.ends_with('\n') {
        block.push('\n');
    }
    block.push('\n');
    block.push_str(BLOCK_START);
    block.push('\n');
    if text.trim().is_empty() {
        block.push_str(&format!("version = {}\n", layout.version()));
    }
    let with_runc = keeps_runc(&config, layout);
    block.push_str(&runtime_tables(layout, with_runc));
    let added: &[&str] = if with_runc {
        &["vmlet", "runc"]
    } else {
        &["vmlet"]
    };
    let merged = format!("{text}{block}");
    check_only_runtimes_added(text, &merged, layout, added)?;
    Ok(Some((merged, block)))
}

/// vmlet's runtime table in `layout` (the deploy/ snippet's table and keys, without its
/// comments), and runc's when `with_runc`.
pub(crate) fn runtime_tables(layout: ConfigLayout, with_runc: bool) -> String {
    let mut tables = String::new();
    for line in layout.snippet().lines() {
        if !line.trim_start().starts_with('#') && !line.trim().is_empty() {
            tables.push_str(line);
            tables.push('\n');
        }
    }
    if with_runc {
        tables.push_str(&format!(
            "# containerd 1.6 and 1.7 take a config's runtimes instead of their own: runc, the default,\n\
             # as they define it.\n\
             [plugins.\"{}\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
            layout.plugin()
        ));
    }
    tables
}

/// Whether vmlet's block must define runc: in the `version = 2` layout, containerd 1.6 and
/// 1.7 replace their default runtimes (runc) with the config's runtimes table, so a config
/// that uses runc, the default runtime, without defining it (Debian's own) would lose it
/// once vmlet's runtime is there, and with it every CRI pod but vmlet's. (containerd 2.x
/// merges the tables.)
fn keeps_runc(config: &toml::Table, layout: ConfigLayout) -> bool {
    if layout != ConfigLayout::V2 {
        return false;
    }
    let cri = cri_containerd(config, layout);
    let default = cri
        .and_then(|c| c.get("default_runtime_name"))
        .and_then(toml::Value::as_str)
        .unwrap_or("runc");
    let defined = cri
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get("runc"))
        .is_some();
    default == "runc" && !defined
}

/// The parsed `merged` must be the parsed `original` plus the runtimes `added` in `layout`.
fn check_only_runtimes_added(
    original: &str,
    merged: &str,
    layout: ConfigLayout,
    added: &[&str],
) -> Result<(), Error> {
    let parse = |t: &str| {
        t.parse::<toml::Table>()
            .map_err(|e| invalid(format!("containerd's config with vmlet's runtime would not parse ({}): edit it by hand with deploy/containerd-vmlet-v*.toml", e.message())))
    };
    let (before, mut after) = (parse(original)?, parse(merged)?);
    // Take the runtime out again: the rest must be the original.
    let runtimes = after
        .get_mut("plugins")
        .and_then(|p| p.get_mut(layout.plugin()))
        .and_then(|p| p.get_mut("containerd"))
        .and_then(|c| c.get_mut("runtimes"))
        .and_then(toml::Value::as_table_mut)
        .ok_or_else(|| invalid("vmlet's runtime table went missing".into()))?;
    for name in added {
        if runtimes.remove(*name).is_none() {
            return Err(invalid(format!("the runtime table {name} went missing")));
        }
    }
    if !before.contains_key("version") {
        // An empty config gets its version line with the runtime.
        after.remove("version");
    }
    prune_empty(&mut after);
    let mut before = before;
    prune_empty(&mut before);
    if after != before {
        return Err(invalid(
            "appending vmlet's runtime would change other settings of containerd's config: edit it by hand with deploy/containerd-vmlet-v*.toml".into(),
        ));
    }
    Ok(())
}

/// Removes tables left empty (the parents `[a.b.c]` makes implicitly).
fn prune_empty(table: &mut toml::Table) {
    table.retain(|_, value| {
        if let toml::Value::Table(inner) = value {
            prune_empty(inner);
            !inner.is_empty()
        } else {
            true
        }
    });
}

/// containerd's config without the block `add_runtime` appended: None when the text does
/// not end with it (edited since). (Uninstall takes every appended block off this way.)
pub fn remove_runtime(text: &str, block: &str) -> Option<String> {
    text.strip_suffix(block).map(str::to_owned)
}

/// How long `systemctl restart containerd` may take.
const RESTART_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Restarts containerd with systemctl. In a container that sees the host's PIDs (the
/// installer DaemonSet's pod: `hostPID`, privileged), systemctl runs in the mount namespace
/// of the host's init, so that it is the host's systemctl talking to the host's systemd.
pub fn restart_containerd() -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let what = "systemctl restart containerd";
    let mut command = std::process::Command::new("/bin/systemctl");
    command.args(["restart", "containerd"]);
    let ours = std::fs::metadata("/proc/self/ns/mnt").map(|m| m.ino());
    let init = std::fs::metadata("/proc/1/ns/mnt").map(|m| m.ino());
    if let (Ok(ours), Ok(init)) = (ours, init) {
        if ours != init {
            let namespace = std::fs::File::open("/proc/1/ns/mnt")
                .map_err(|e| Error::io("open /proc/1/ns/mnt (the host's init)", e))?;
            // SAFETY: setns is an async-signal-safe system call on an fd the closure owns.
            unsafe {
                command.pre_exec(move || {
                    use std::os::fd::AsRawFd;
                    if libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
    }
    let mut child = command
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| Error::io(what, e))?;
    let start = std::time::Instant::now();
    loop {
        match child.try_wait().map_err(|e| Error::io(what, e))? {
            Some(status) if status.success() => return Ok(()),
            Some(status) => return Err(Error::FailedPrecondition(format!("{what}: {status}"))),
            None if start.elapsed() > RESTART_DEADLINE => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout(format!(
                    "{what} did not finish within {}s",
                    RESTART_DEADLINE.as_secs()
                )));
            }
            None => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const DEBIAN_16: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n      conf_dir = \"/etc/cni/net.d\"\n  [plugins.\"io.containerd.internal.v1.opt\"]\n    path = \"/var/lib/containerd/opt\"\n";

    #[test]
    fn the_runtime_is_appended_in_the_configs_layout_and_removed_byte_for_byte() {
        let (merged, block) = add_runtime(DEBIAN_16, ConfigLayout::V2).unwrap().unwrap();
        assert!(merged.starts_with(DEBIAN_16));
        assert_eq!(
            vmlet_runtimes(&merged).unwrap(),
            ["io.containerd.grpc.v1.cri.runtimes.vmlet"]
        );
        assert_eq!(
            add_runtime(&merged, ConfigLayout::V2).unwrap(),
            None,
            "registered once"
        );
        assert_eq!(remove_runtime(&merged, &block).unwrap(), DEBIAN_16);

        let v3 = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'";
        let (merged, block) = add_runtime(v3, ConfigLayout::V3).unwrap().unwrap();
        assert!(merged.contains("runtime_path = \"/usr/local/bin/containerd-shim-vmlet-v2\""));
        assert_eq!(remove_runtime(&merged, &block).unwrap(), v3);

        let (fresh, _) = add_runtime("", ConfigLayout::V3).unwrap().unwrap();
        assert_eq!(
            ConfigLayout::of(&fresh, ConfigLayout::V2).unwrap(),
            ConfigLayout::V3
        );
    }

    #[test]
    fn a_version_2_config_that_relies_on_the_default_runc_keeps_it() {
        let runtimes = |text: &str| -> Vec<String> {
            let table: toml::Table = text.parse().unwrap();
            table["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
                .as_table()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        // Debian's config names no runtime: containerd 1.6 would drop its runc for vmlet's.
        let (merged, block) = add_runtime(DEBIAN_16, ConfigLayout::V2).unwrap().unwrap();
        assert_eq!(runtimes(&merged), ["runc", "vmlet"]);
        assert!(
            block.contains("runtime_type = \"io.containerd.runc.v2\""),
            "{block}"
        );
        assert_eq!(remove_runtime(&merged, &block).unwrap(), DEBIAN_16);
        let (fresh, _) = add_runtime("", ConfigLayout::V2).unwrap().unwrap();
        assert_eq!(runtimes(&fresh), ["runc", "vmlet"]);
        // A config that defines runc, or whose default is another runtime, is left as it is.
        let with_runc = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n    SystemdCgroup = true\n";
        let (merged, _) = add_runtime(with_runc, ConfigLayout::V2).unwrap().unwrap();
        assert_eq!(runtimes(&merged), ["runc", "vmlet"]);
        assert_eq!(merged.matches("runtimes.runc]").count(), 1, "{merged}");
        let crun = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun]\n  runtime_type = \"io.containerd.runc.v2\"\n";
        let (merged, _) = add_runtime(crun, ConfigLayout::V2).unwrap().unwrap();
        assert_eq!(runtimes(&merged), ["crun", "vmlet"]);
        // containerd 2.x merges its default runtimes with the config's.
        let (merged, _) = add_runtime("version = 3\n", ConfigLayout::V3)
            .unwrap()
            .unwrap();
        assert!(!merged.contains("runtimes.runc"), "{merged}");
    }

    #[test]
    fn a_config_vmlet_cannot_extend_safely_is_refused_by_name() {
        // The runtimes table written inline: a table appended under it would redefine it.
        let inline = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n";
        let err = add_runtime(inline, ConfigLayout::V2).unwrap_err().message();
        assert!(err.contains("edit it by hand"), "{err}");
        let v1 = "[plugins.cri]\nsandbox_image = \"x\"\n";
        let err = ConfigLayout::of(v1, ConfigLayout::V2)
            .unwrap_err()
            .message();
        assert!(err.contains("version 1"), "{err}");
        let edited = "version = 2\n# changed after install\n";
        assert_eq!(remove_runtime(edited, "\n# vmlet block\n"), None);
    }

    #[test]
    fn vmlet_runtimes_are_found_in_both_config_layouts() {
        let v2 = include_str!("../../deploy/containerd-vmlet-v2.toml");
        assert_eq!(
            vmlet_runtimes(v2).unwrap(),
            ["io.containerd.grpc.v1.cri.runtimes.vmlet"]
        );
        let v3 = include_str!("../../deploy/containerd-vmlet-v3.toml");
        assert_eq!(
            vmlet_runtimes(v3).unwrap(),
            ["io.containerd.cri.v1.runtime.runtimes.vmlet"]
        );
        let runc_only = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\nruntime_type = 'io.containerd.runc.v2'\n";
        assert!(vmlet_runtimes(runc_only).unwrap().is_empty());
        assert!(vmlet_runtimes("[[[").is_err());
    }
}
