//! vmlet's rules in libvirt's AppArmor profile of libvirtd, for nodes where libvirt confines
//! QEMU with AppArmor (Debian's and Ubuntu's default `security_driver`).
//!
//! libvirt's profile for libvirtd runs only the helpers it knows (`/usr/bin/*`, its own
//! virtiofsd path). vmlet's emulator wrapper (libvirtd probes it, then starts it as each
//! pod's QEMU under the VM's profile) needs a rule there; a pod's virtiofsd is the shim's,
//! not libvirtd's. What each pod's QEMU opens beside libvirt's model is in the pod's own profile
//! ([`vmlet_shim::vmm::pod_apparmor`]), not here.
//!
//! The rules go into the site-local file libvirtd's profile includes
//! (`/etc/apparmor.d/local/usr.sbin.libvirtd`), as a block `vmletctl install` appends and
//! `uninstall` takes off again; libvirtd's profile is reloaded (`apparmor_parser -r`) where
//! AppArmor is on. The guest image lives under `/usr/local/share/vmlet`, since
//! `virt-aa-helper` refuses kernels under `/usr/share`. Tested by `scripts/check-apparmor`
//! (a VM with Debian's AppArmor kernel).

use std::path::Path;

use vmlet_config::NodeConfig;

use vmlet_shim::vmm::pod_apparmor::quoted;
use vmlet_shim::Error;

/// libvirt's profile of libvirtd: where it is there, libvirt may confine QEMU with AppArmor.
pub const LIBVIRTD_PROFILE: &str = "etc/apparmor.d/usr.sbin.libvirtd";
/// The site-local file libvirtd's profile includes.
pub const LOCAL_LIBVIRTD: &str = "etc/apparmor.d/local/usr.sbin.libvirtd";
/// How long reloading a profile may take.
const RELOAD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The rules for each local file: (file under the root, rules).
pub fn rules(config: &NodeConfig) -> Result<Vec<(&'static str, String)>, Error> {
    let h = &config.helpers;
    // Each pod's profile names paths under it.
    quoted(&config.state_dir)?;
    let libvirtd = format!(
        "  # libvirtd probes vmlet's emulator wrapper and starts it as each pod's QEMU\n  \
         # (under the VM's profile).\n  {} PUx,\n",
        quoted(&h.vmwrapper)?
    );
    Ok(vec![(LOCAL_LIBVIRTD, libvirtd)])
}

/// Reloads libvirtd's profile under `root` (its local file changed), chrooted there, where
/// AppArmor is on; says what it did.
pub fn reload(root: &Path) -> Result<String, Error> {
    if !root.join("sys/kernel/security/apparmor").is_dir() {
        return Ok("AppArmor is off here: the rules take effect when its profiles load".into());
    }
    let parser = Path::new("/sbin/apparmor_parser");
    let program = ["sbin/apparmor_parser", "usr/sbin/apparmor_parser"]
        .iter()
        .find(|p| root.join(p).is_file())
        .map(|p| Path::new("/").join(p))
        .ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "AppArmor is on but {} is missing: reload /{LIBVIRTD_PROFILE} by hand",
                parser.display()
            ))
        })?;
    let profile = Path::new("/").join(LIBVIRTD_PROFILE);
    crate::node_program::run_under(
        root,
        &program,
        &["-r".as_ref(), profile.as_os_str()],
        RELOAD_DEADLINE,
    )
    .map_err(|e| {
        Error::FailedPrecondition(format!("apparmor_parser -r {}: {e}", profile.display()))
    })?;
    Ok(format!(
        "reloaded libvirtd's AppArmor profile (/{LIBVIRTD_PROFILE})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_name_the_configs_programs_and_refuse_an_odd_state_dir() {
        let all = rules(&NodeConfig::default()).unwrap();
        assert_eq!(all[0].0, LOCAL_LIBVIRTD);
        assert!(all[0]
            .1
            .contains("  \"/usr/local/bin/vmlet-vmwrapper\" PUx,\n"));
        assert!(
            !all[0].1.contains("virtiofsd"),
            "the shim starts it: {all:?}"
        );
        assert_eq!(all.len(), 1, "each pod's QEMU has its own profile: {all:?}");
        for odd in ["/run/vm\"let", "/run/vmlet*", "/run/{a,b}", "run/vmlet"] {
            let config = NodeConfig {
                state_dir: odd.into(),
                ..Default::default()
            };
            let e = rules(&config).unwrap_err();
            assert!(e.to_string().contains("not a path vmlet can name"), "{e}");
        }
    }
}
