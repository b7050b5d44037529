//! vmlet's rules in libvirt's AppArmor profiles, for nodes where libvirt confines QEMU with
//! AppArmor (Debian's and Ubuntu's default `security_driver`).
//!
//! libvirt's profile for libvirtd runs only the helpers it knows (`/usr/bin/*`, its own
//! virtiofsd path), and each VM's profile (written by `virt-aa-helper` from the domain XML)
//! opens only what the XML names. vmlet needs, beyond that:
//! - libvirtd: to run vmlet's emulator wrapper (it probes it, then starts it as each pod's
//!   QEMU under the VM's profile) and vmlet's virtiofsd;
//! - each VM (the `libvirt-qemu` abstraction every VM profile includes): to run as the
//!   wrapper (which fetches the pod's taps from the shim's socket), and to open what vmlet
//!   passes beside libvirt's model (`<qemu:commandline>`) in the pod's state directory: the
//!   vsock and QMP sockets, and a VM image's root disk on NVMe with its backing file.
//!
//! Files the shim opens and hands to QEMU (taps, hot-plugged block devices) need no rule:
//! AppArmor does not revalidate a file an unconfined task opened.
//!
//! Both go into the site-local files the profiles include (`/etc/apparmor.d/local/...`), as
//! blocks `vmletctl install` appends and `uninstall` takes off again; libvirtd's profile is
//! reloaded (`apparmor_parser -r`) where AppArmor is on. The guest image lives under
//! `/usr/local/share/vmlet`, since `virt-aa-helper` refuses kernels under `/usr/share`.
//! Tested by `scripts/check-apparmor` (a VM with Debian's AppArmor kernel).

use std::path::Path;

use vmlet_config::NodeConfig;

use crate::pod_paths::PodPaths;
use crate::Error;

/// libvirt's profile of libvirtd: where it is there, libvirt may confine QEMU with AppArmor.
pub const LIBVIRTD_PROFILE: &str = "etc/apparmor.d/usr.sbin.libvirtd";
/// The site-local file libvirtd's profile includes.
pub const LOCAL_LIBVIRTD: &str = "etc/apparmor.d/local/usr.sbin.libvirtd";
/// The site-local file every VM's profile includes (through `abstractions/libvirt-qemu`).
pub const LOCAL_QEMU: &str = "etc/apparmor.d/local/abstractions/libvirt-qemu";
/// How long reloading a profile may take.
const RELOAD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Characters AppArmor reads as a glob, a variable or an alternation in a path.
const APPARMOR_SPECIAL: &[char] = &['*', '?', '[', ']', '{', '}', '^', '@', ','];

/// A path of the node config as an AppArmor rule's quoted path.
fn quoted(path: &Path) -> Result<String, Error> {
    let text = path.to_string_lossy();
    if text.contains(['"', '\n', '\0']) || text.contains(APPARMOR_SPECIAL) || !path.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "{text:?}: not a path vmlet can name in an AppArmor rule (absolute, without \
             quotes, newlines or any of {APPARMOR_SPECIAL:?})"
        )));
    }
    Ok(format!("\"{text}\""))
}

/// The rules for each local file: (file under the root, rules).
///
/// A VM's files in its pod's state directory are named as [`PodPaths`] names them, for any
/// pod (`STATE_DIR/*/`): the profile is libvirt's, written from the domain XML, and vmlet's
/// own QEMU arguments are not in that XML.
pub fn rules(config: &NodeConfig) -> Result<Vec<(&'static str, String)>, Error> {
    let h = &config.helpers;
    // Checked before the glob goes in.
    quoted(&config.state_dir)?;
    let any_pod = PodPaths::new(&config.state_dir, "*");
    let pod_file = |path: &Path, access: &str| format!("  \"{}\" {access},\n", path.display());
    let libvirtd = format!(
        "  # libvirtd probes vmlet's emulator wrapper and starts it as each pod's QEMU\n  \
         # (under the VM's profile), and starts vmlet's virtiofsd.\n  {} PUx,\n  {} PUx,\n",
        quoted(&h.vmwrapper)?,
        quoted(&h.virtiofsd)?
    );
    let qemu = [
        format!(
            "  # Each pod's QEMU starts as vmlet's emulator wrapper, which fetches the pod's taps;\n  \
             # QEMU opens the vsock and QMP sockets vmlet passes beside libvirt's model, and a VM\n  \
             # image's root disk on NVMe (QEMU's own device), in the pod's state directory.\n  \
             {} rmix,\n",
            quoted(&h.vmwrapper)?
        ),
        pod_file(&any_pod.tap_socket, "rw"),
        pod_file(&any_pod.vhost_socket, "rw"),
        pod_file(&any_pod.qmp_socket, "rw"),
        pod_file(&any_pod.root_disk, "rwk"),
        pod_file(&any_pod.image_disk, "rk"),
    ]
    .concat();
    Ok(vec![(LOCAL_LIBVIRTD, libvirtd), (LOCAL_QEMU, qemu)])
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
        for rule in [
            "\"/run/vmlet/*/taps.sock\" rw,",
            "\"/run/vmlet/*/vhost-vsock.sock\" rw,",
            "\"/run/vmlet/*/qmp.sock\" rw,",
            "\"/run/vmlet/*/root.qcow2\" rwk,",
            "\"/run/vmlet/*/image-disk\" rk,",
        ] {
            assert!(
                all[1].1.contains(&format!("  {rule}\n")),
                "{rule} in {}",
                all[1].1
            );
        }
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
