//! The distribution's virtiofsd, which `vmletctl install` prefers to the release's where it is
//! new enough: Debian 13's `virtiofsd` package (1.13) is, Debian 12 has none (QEMU 7.2's C
//! virtiofsd is another program). Found through dpkg's status file under the root, so that an
//! install into `--root=/host` from the installer image runs nothing of the host's.

use std::path::Path;

/// Where Debian's `virtiofsd` package puts the program, relative to the root.
pub const PATH: &str = "usr/libexec/virtiofsd";
/// dpkg's record of the installed packages, relative to the root.
const DPKG_STATUS: &str = "var/lib/dpkg/status";
/// The oldest virtiofsd taken: 1.13 hands its state over in a migration (vhost-user's
/// device-state interface), which the release's virtiofsd does too.
pub const MINIMUM: (u32, u32) = (1, 13);

/// The distribution's virtiofsd under `root`: its version, when dpkg has the `virtiofsd`
/// package installed at [`MINIMUM`] or later and [`PATH`] is a file.
pub fn found(root: &Path) -> Option<String> {
    let status = std::fs::read_to_string(root.join(DPKG_STATUS)).ok()?;
    let version = installed_version(&status, "virtiofsd")?;
    (upstream(&version)? >= MINIMUM && root.join(PATH).is_file()).then_some(version)
}

/// The version of `package` in dpkg's status file, if it is installed.
fn installed_version(status: &str, package: &str) -> Option<String> {
    status.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
        };
        (field("Package") == Some(package) && field("Status") == Some("install ok installed"))
            .then(|| field("Version").map(str::to_owned))
            .flatten()
    })
}

/// A Debian version's upstream major and minor (`1:1.13.2-1+b1` -> 1.13).
fn upstream(version: &str) -> Option<(u32, u32)> {
    let version = version.split_once(':').map_or(version, |(_, v)| v);
    let mut numbers = version.split(['.', '-', '+', '~']);
    Some((numbers.next()?.parse().ok()?, numbers.next()?.parse().ok()?))
}

/// The release's default node config with `helpers.virtiofsd` set to the distribution's,
/// unless the defaults set helpers themselves (then they are kept as they are).
pub fn node_config(defaults: &str) -> String {
    let sets_helpers = defaults
        .parse::<toml::Table>()
        .is_ok_and(|t| t.contains_key("helpers"));
    if sets_helpers {
        return defaults.to_owned();
    }
    let mut text = defaults.to_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "\n# vmletctl install: the distribution's virtiofsd, new enough (>= {}.{}).\n[helpers]\nvirtiofsd = \"/{PATH}\"\n",
        MINIMUM.0, MINIMUM.1
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Package: virtiofsd\nStatus: install ok installed\nPriority: optional\nVersion: 1.13.2-1\n\nPackage: zlib1g\nStatus: install ok installed\nVersion: 1:1.3.dfsg-3.1\n";

    #[test]
    fn the_installed_package_and_its_upstream_version_are_read() {
        assert_eq!(
            installed_version(STATUS, "virtiofsd").as_deref(),
            Some("1.13.2-1")
        );
        assert_eq!(installed_version(STATUS, "qemu-system-x86"), None);
        let removed = STATUS.replace("install ok installed", "deinstall ok config-files");
        assert_eq!(installed_version(&removed, "virtiofsd"), None);
        assert_eq!(upstream("1.13.2-1"), Some((1, 13)));
        assert_eq!(upstream("1:1.10.1-1+b1"), Some((1, 10)));
        assert_eq!(upstream("garbage"), None);
    }

    #[test]
    fn only_a_new_enough_package_with_its_program_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("var/lib/dpkg")).unwrap();
        std::fs::write(root.join(DPKG_STATUS), STATUS).unwrap();
        assert_eq!(found(root), None, "no program at {PATH}");
        std::fs::create_dir_all(root.join("usr/libexec")).unwrap();
        std::fs::write(root.join(PATH), "virtiofsd").unwrap();
        assert_eq!(found(root).as_deref(), Some("1.13.2-1"));
        std::fs::write(root.join(DPKG_STATUS), STATUS.replace("1.13.2", "1.10.1")).unwrap();
        assert_eq!(found(root), None, "older than the minimum");
    }

    #[test]
    fn the_node_config_names_it_unless_the_defaults_set_helpers() {
        let config = node_config("# defaults\n");
        let parsed =
            vmlet_config::NodeConfig::from_toml(&config, Path::new("config.toml")).unwrap();
        assert_eq!(
            parsed.helpers.virtiofsd,
            Path::new("/usr/libexec/virtiofsd")
        );
        assert!(config.starts_with("# defaults\n"));
        let own = "[helpers]\nqemu = \"/opt/qemu\"\n";
        assert_eq!(node_config(own), own);
    }
}
