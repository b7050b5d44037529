//! vmlet's rules in libvirt's AppArmor profiles, for nodes where libvirt confines QEMU with
//! AppArmor (Debian's and Ubuntu's default `security_driver`).
//!
//! libvirt's profile for libvirtd runs only the helpers it knows (`/usr/bin/*`, its own
//! virtiofsd path), and each VM's profile (written by `virt-aa-helper` from the domain XML)
//! opens only what the XML names. vmlet needs, beyond that:
//! - libvirtd: to run vmlet's emulator wrapper (it probes it, then starts it as each pod's
//!   QEMU under the VM's profile) and vmlet's virtiofsd;
//! - each VM (the `libvirt-qemu` abstraction every VM profile includes): to run as the
//!   wrapper, and to open the vsock and QMP sockets vmlet passes beside libvirt's model
//!   (`<qemu:commandline>`) in the pod's state directory.
//!
//! Both go into the site-local files the profiles include (`/etc/apparmor.d/local/...`), as
//! blocks `vmletctl install` appends and `uninstall` takes off again; libvirtd's profile is
//! reloaded (`apparmor_parser -r`) where AppArmor is on. The guest image lives under
//! `/usr/local/share/vmlet`, since `virt-aa-helper` refuses kernels under `/usr/share`.
//! Tested by `scripts/check-apparmor` (a VM with Debian's AppArmor kernel).

use std::path::Path;

use vmlet_config::NodeConfig;

use crate::Error;

/// libvirt's profile of libvirtd: where it is there, libvirt may confine QEMU with AppArmor.
pub const LIBVIRTD_PROFILE: &str = "etc/apparmor.d/usr.sbin.libvirtd";
/// The site-local file libvirtd's profile includes.
pub const LOCAL_LIBVIRTD: &str = "etc/apparmor.d/local/usr.sbin.libvirtd";
/// The site-local file every VM's profile includes (through `abstractions/libvirt-qemu`).
pub const LOCAL_QEMU: &str = "etc/apparmor.d/local/abstractions/libvirt-qemu";
/// How long reloading a profile may take.
const RELOAD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The rules for each local file: (file under the root, rules).
pub fn rules(config: &NodeConfig) -> Result<Vec<(&'static str, String)>, Error> {
    let quoted = |path: &Path| {
        let text = path.to_string_lossy();
        if text.contains(['"', '\n', '\0']) || !path.is_absolute() {
            return Err(Error::InvalidArgument(format!(
                "{text:?}: not a path vmlet can name in an AppArmor rule"
            )));
        }
        Ok(format!("\"{text}\""))
    };
    let h = &config.helpers;
    let state = quoted(&config.state_dir)?;
    let state = state.trim_end_matches('"').trim_end_matches('/');
    Ok(vec![
        (
            LOCAL_LIBVIRTD,
            format!(
                "  # libvirtd probes vmlet's emulator wrapper and starts it as each pod's QEMU\n  # (under the VM's profile), and starts vmlet's virtiofsd.\n  {} PUx,\n  {} PUx,\n",
                quoted(&h.vmwrapper)?,
                quoted(&h.virtiofsd)?
            ),
        ),
        (
            LOCAL_QEMU,
            format!(
                "  # Each pod's QEMU starts as vmlet's emulator wrapper, and opens the vsock and QMP\n  # sockets vmlet passes beside libvirt's model, in the pod's state directory.\n  {} rmix,\n  {state}/*/vhost.sock\" rw,\n  {state}/*/qmp.sock\" rw,\n",
                quoted(&h.vmwrapper)?
            ),
        ),
    ])
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
    crate::host_check::run_under(
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
    fn the_rules_name_the_configs_programs_and_state_dir() {
        let all = rules(&NodeConfig::default()).unwrap();
        assert_eq!(all[0].0, LOCAL_LIBVIRTD);
        assert!(all[0]
            .1
            .contains("  \"/usr/local/bin/vmlet-vmwrapper\" PUx,\n"));
        assert!(all[0].1.contains("  \"/usr/local/bin/virtiofsd\" PUx,\n"));
        assert_eq!(all[1].0, LOCAL_QEMU);
        assert!(all[1]
            .1
            .contains("  \"/usr/local/bin/vmlet-vmwrapper\" rmix,\n"));
        assert!(all[1].1.contains("  \"/run/vmlet/*/vhost.sock\" rw,\n"));
        assert!(all[1].1.contains("  \"/run/vmlet/*/qmp.sock\" rw,\n"));
        let odd = NodeConfig {
            state_dir: "/run/vm\"let".into(),
            ..Default::default()
        };
        let e = rules(&odd).unwrap_err();
        assert!(e.to_string().contains("not a path vmlet can name"), "{e}");
    }
}
