//! Judging [`HostFacts`] against the node config: one finding per subject, each from a
//! function of its own.

use vmlet_config::{Accel, NodeConfig, VsockTransport};

use super::{Finding, HostFacts, KvmFacts, Verdict};

use Verdict::{Fail, Ok, Warn};

/// Judges the facts against the node config, one finding per subject.
pub fn assess(config: &NodeConfig, facts: &HostFacts) -> Vec<Finding> {
    let mut out = vec![accel(config, facts), vsock(config, facts), vhost_net(facts)];
    out.push(super::launcher::launcher(config, facts));
    out.extend(libvirt(config, facts));
    out.push(pod_users(config, facts));
    out.extend(platform(facts));
    out.extend(programs(config, facts));
    out.push(match &facts.guest_image {
        Result::Ok(what) => finding(Ok, "guest image", what.clone()),
        Err(e) => finding(Fail, "guest image", e.clone()),
    });
    out.push(vm_mode(config, facts));
    out.push(cgroup(facts));
    out.extend(containerd(facts));
    out
}

fn finding(verdict: Verdict, subject: &'static str, text: String) -> Finding {
    Finding {
        verdict,
        subject,
        text,
    }
}

/// Why a probe guest would not boot, where the host shows it.
fn paravirtual_note(kvm: &KvmFacts) -> &'static str {
    if kvm.is_paravirtual() {
        " (/dev/kvm is kvm_pvm's: this host is itself a VM with a paravirtual KVM)"
    } else {
        ""
    }
}

/// The accelerator this node's pods get now: `kvm` or `tcg`; none where no pod can start
/// (`accel = "kvm"` where KVM does not run a guest). The same judgement as `check`'s accel
/// line: what `vmletctl check --accel` prints, and the installer's `vmlet.io/accel` label.
pub fn accelerator(config: &NodeConfig, facts: &HostFacts) -> Option<&'static str> {
    match (config.accel, facts.libvirt_kvm, &facts.kvm_probe) {
        (Accel::Tcg, _, _) => Some("tcg"),
        (_, true, Some(Result::Ok(_)) | None) => Some("kvm"),
        (Accel::Auto, _, _) => Some("tcg"),
        (Accel::Kvm, _, _) => None,
    }
}

/// The accelerator: KVM (probed), or TCG by choice or as the fallback.
fn accel(config: &NodeConfig, facts: &HostFacts) -> Finding {
    let direct = super::launcher::choice(config, facts).direct;
    let kvm_why = || {
        if facts.libvirt.is_err() && !direct {
            "libvirt is unreachable, so its KVM support is unknown".to_owned()
        } else {
            facts.kvm.why_unusable()
        }
    };
    let accel = format!("{:?}", config.accel).to_lowercase();
    let (verdict, text) = match (config.accel, facts.libvirt_kvm, &facts.kvm_probe) {
        (Accel::Tcg, _, _) => (Warn, "TCG (accel = \"tcg\" in the node config): software emulation, several times slower than KVM".into()),
        (Accel::Auto, true, Some(Err(why))) => (Warn, format!(
            "TCG fallback: {} KVM, but {why}{}",
            if direct { "/dev/kvm offers" } else { "libvirt offers" },
            paravirtual_note(&facts.kvm)
        )),
        (_, true, Some(Err(why))) => (Fail, format!(
            "accel = \"{accel}\" in the node config, but {why}{}: set accel = \"auto\" or \"tcg\"",
            paravirtual_note(&facts.kvm)
        )),
        (_, true, Some(Result::Ok(ms))) => (Ok, format!("KVM (accel = \"{accel}\"): a probe guest booted on it in {ms} ms")),
        (_, true, None) => (Ok, format!("KVM (accel = \"{accel}\")")),
        (Accel::Auto, false, _) => (Warn, format!("TCG fallback: KVM is not usable: {}", kvm_why())),
        (Accel::Kvm, false, _) => (Fail, format!("accel = \"kvm\" in the node config, but KVM is not usable: {}", kvm_why())),
    };
    finding(verdict, "accel", text)
}

/// vsock: the kernel's vhost-vsock, or the user-space backend.
fn vsock(config: &NodeConfig, facts: &HostFacts) -> Finding {
    let user_space = |verdict_if_missing, why: &str| match &facts.vhost_device_vsock {
        Result::Ok(version) => (
            Ok,
            format!(
                "user-space backend: {version} ({}), {why}",
                config.helpers.vhost_device_vsock.display()
            ),
        ),
        Err(e) => (
            verdict_if_missing,
            format!("{why}, and the user-space backend is unusable: {e}"),
        ),
    };
    let direct = super::launcher::choice(config, facts).direct;
    let (verdict, text) = match (config.vsock, facts.vhost_vsock) {
        (VsockTransport::Auto, _) if direct => user_space(
            Fail,
            "the shim starts QEMU itself (launcher), which takes the user-space backend",
        ),
        (VsockTransport::Auto | VsockTransport::Vhost, true) => {
            (Ok, "the kernel's vhost-vsock (/dev/vhost-vsock)".to_owned())
        }
        (VsockTransport::Vhost, false) => (
            Fail,
            "vsock = \"vhost\" in the node config, but /dev/vhost-vsock is missing (load vhost_vsock)".to_owned(),
        ),
        (VsockTransport::Auto, false) => user_space(Fail, "no /dev/vhost-vsock"),
        (VsockTransport::VhostUser, _) => user_space(Fail, "vsock = \"vhost-user\" in the node config"),
    };
    finding(verdict, "vsock", text)
}

fn vhost_net(facts: &HostFacts) -> Finding {
    if facts.vhost_net {
        finding(Ok, "vhost-net", "/dev/vhost-net present; vmlet's taps do not use it (vhost=off): QEMU moves their packets".into())
    } else {
        finding(Warn, "vhost-net", "missing (/dev/vhost-net; modprobe vhost_net): vmlet's taps do not need it (vhost=off), QEMU moves their packets".into())
    }
}

/// libvirt, and the confinement its security drivers give QEMU.
fn libvirt(config: &NodeConfig, facts: &HostFacts) -> Vec<Finding> {
    let host = match &facts.libvirt {
        Result::Ok(host) => host,
        // The shim starts pods' QEMU itself: only a CPU model libvirt expands needs libvirt.
        Err(e) if super::launcher::choice(config, facts).direct => {
            let text = format!(
                "{} unreachable: {e}; the shim starts pods' VMs (vmlet's guest and VM images) \
                 without it, but a pod with a CPU model libvirt expands (host-model, \
                 VirtletLibvirtCPUSetting) cannot start",
                config.libvirt_uri
            );
            return vec![finding(Warn, "libvirt", text)];
        }
        Err(e) => {
            let text = format!(
                "{} unreachable: {e} (is libvirtd running?)",
                config.libvirt_uri
            );
            return vec![finding(Fail, "libvirt", text)];
        }
    };
    let models = if host.security_models.is_empty() {
        "none".to_owned()
    } else {
        host.security_models.join(", ")
    };
    let mut out = vec![finding(
        Ok,
        "libvirt",
        format!(
            "{} reachable: libvirt {}, hypervisor {}, security driver {models}",
            config.libvirt_uri, host.version, host.hypervisor_version
        ),
    )];
    let local = format!("/{}", crate::node_apparmor::LOCAL_LIBVIRTD);
    if host.security_models.iter().any(|m| m == "apparmor") {
        // Under the direct launcher only what libvirt still starts (a CPU model it expands)
        // needs them.
        let missing = match super::launcher::choice(config, facts).direct {
            true => Warn,
            false => Fail,
        };
        out.push(if facts.apparmor_rules {
            finding(Ok, "confinement", format!("libvirt confines QEMU with AppArmor; vmlet's rules are in libvirtd's profile ({local}), and each of libvirt's VMs gets a profile of its own ({})", vmlet_shim::vmm::pod_apparmor::PROFILE_DIR))
        } else {
            finding(missing, "confinement", format!("libvirt confines QEMU with AppArmor, and vmlet's rules (of this version and config) are not in libvirtd's profile ({local}): libvirtd cannot start vmlet's wrapper for the VMs it starts; `vmletctl install` adds them"))
        });
    }
    if host.security_models.iter().any(|m| m == "selinux") {
        out.push(finding(Warn, "confinement", "libvirt confines QEMU with SELinux: vmlet's own QEMU arguments (the vsock and QMP sockets in the state directory) have no labels from vmlet; untested".into()));
    }
    out
}

/// Each pod's QEMU as a user of its own: the range holds none of the node's users, and
/// libvirt's domain directory lets every uid of it through.
fn pod_users(config: &NodeConfig, facts: &HostFacts) -> Finding {
    let range = config.pod_users;
    let last = u64::from(range.first_uid) + u64::from(range.count) - 1;
    let dir = crate::libvirt_dir::DIR;
    if !facts.pod_users_taken.is_empty() {
        return finding(Fail, "pod-users", format!("pod_users ({}..={last}) holds the node's users {}: a pod's QEMU would run as one; choose a range no user has", range.first_uid, facts.pod_users_taken.join(", ")));
    }
    match &facts.libvirt_dir_passable {
        Result::Ok(true) => finding(Ok, "pod-users", format!("each pod's QEMU runs as a uid of its own ({}..={last}, no user of the node's), which passes through libvirt's /{dir}", range.first_uid)),
        Result::Ok(false) => {
            // Under the direct launcher only what libvirt still starts (a CPU model it
            // expands) is kept out.
            let (verdict, whose) = match super::launcher::choice(config, facts).direct {
                true => (Warn, "the QEMU of a pod with a CPU model libvirt expands (libvirt's), a user of its own,"),
                false => (Fail, "each pod's QEMU, a user of its own,"),
            };
            finding(verdict, "pod-users", format!("libvirt's /{dir} lets only its own QEMU user through: {whose} cannot open its domain's files there; `vmletctl install` gives others search permission (0751)"))
        }
        Err(e) => finding(Warn, "pod-users", format!("whether libvirt's /{dir} lets each pod's QEMU through is unknown: {e}")),
    }
}

/// A `(major, minor)` release.
type Release = (u32, u32);

/// The QEMU and libvirt releases vmlet is tested on (`make test`, and `make test-matrix` for
/// the backports pair), and the distribution each pair is from.
pub const TESTED_PLATFORMS: &[(Release, Release, &str)] = &[
    ((7, 2), (9, 0), "Debian 12"),
    (
        (10, 0),
        (11, 3),
        "Debian 13, and Debian 12's bookworm-backports",
    ),
    ((11, 1), (12, 9), "Debian 13's trixie-backports"),
];

/// Something a node's QEMU and libvirt versions change for its pods: the versions that have
/// it (QEMU's first release with it; libvirt's oldest release measured to use it), and what
/// a pod gets with it and without it.
pub struct PlatformFeature {
    pub name: &'static str,
    pub qemu: Release,
    pub libvirt: Release,
    pub with: &'static str,
    pub without: &'static str,
}

/// What `vmletctl check` says about the node's versions, beside whether they are tested.
pub const PLATFORM_FEATURES: &[PlatformFeature] = &[PlatformFeature {
    name: "the guest CPU read in one round trip",
    // QEMU's `qom-list-get` is in 10.1; libvirt 12.9 uses it, 11.3 does not (measured).
    qemu: (10, 1),
    libvirt: (12, 9),
    with: "libvirt reads the started guest CPU's features with one qom-list-get",
    without: "libvirt reads them with one qom-get each (~400: a bare domain's start took ~0.33 s longer under TCG, measured against libvirt 12.9 with QEMU 11.1)",
}];

/// The release of a version like `10.0.2` (none if it does not start with two numbers).
fn release(version: &str) -> Option<Release> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// Each of [`PLATFORM_FEATURES`] as these releases (of QEMU and libvirt) have it or not.
fn platform_features(releases: Option<(Release, Release)>) -> Vec<String> {
    PLATFORM_FEATURES
        .iter()
        .map(|f| {
            let (q, l) = (f.qemu, f.libvirt);
            match releases {
                Some((have_q, have_l)) if have_q >= q && have_l >= l => {
                    format!("with {}: {}", f.name, f.with)
                }
                _ => format!(
                    "without {} (QEMU {}.{} or later, with libvirt {}.{} or later as measured): {}",
                    f.name, q.0, q.1, l.0, l.1, f.without
                ),
            }
        })
        .collect()
}

/// Whether libvirt's QEMU and libvirt itself are a pair vmlet is tested on, and what their
/// versions change ([`PLATFORM_FEATURES`]); none when libvirt is unreachable ([`libvirt`]
/// says so).
fn platform(facts: &HostFacts) -> Option<Finding> {
    let host = facts.libvirt.as_ref().ok()?;
    let (qemu, libvirt) = (&host.hypervisor_version, &host.version);
    let releases = release(qemu).zip(release(libvirt));
    let tested = TESTED_PLATFORMS
        .iter()
        .find(|(q, l, _)| releases == Some((*q, *l)));
    let features = platform_features(releases).join("; ");
    Some(match tested {
        Some((_, _, from)) => finding(
            Ok,
            "platform",
            format!("QEMU {qemu} and libvirt {libvirt}: tested (as in {from}); {features}"),
        ),
        None => {
            let pairs: Vec<String> = TESTED_PLATFORMS
                .iter()
                .map(|(q, l, from)| {
                    format!(
                        "QEMU {}.{} with libvirt {}.{}, as in {from}",
                        q.0, q.1, l.0, l.1
                    )
                })
                .collect();
            finding(
                Warn,
                "platform",
                format!(
                    "QEMU {qemu} and libvirt {libvirt}: not a pair vmlet is tested on ({}); {features}",
                    pairs.join("; ")
                ),
            )
        }
    })
}

/// The programs a pod's VM runs: vmlet's own must be of this vmletctl's version.
fn programs(config: &NodeConfig, facts: &HostFacts) -> Vec<Finding> {
    let h = &config.helpers;
    let mine = vmlet_shim::cli::VERSION;
    [
        ("qemu", &h.qemu, &facts.qemu, false),
        ("vmwrapper", &h.vmwrapper, &facts.vmwrapper, true),
        ("vmlet-libvirt", &h.libvirt, &facts.libvirt_helper, true),
        ("virtiofsd", &h.virtiofsd, &facts.virtiofsd, false),
    ]
    .into_iter()
    .map(|(subject, path, result, ours)| {
        let (verdict, text) = match result {
            Result::Ok(version) if ours && !version.ends_with(&format!(" {mine}")) => (
                Warn,
                format!(
                    "{} ({version}): not vmletctl's version {mine}",
                    path.display()
                ),
            ),
            Result::Ok(version) => (Ok, format!("{} ({version})", path.display())),
            Err(e) => (Fail, format!("{}: {e}", path.display())),
        };
        finding(verdict, subject, text)
    })
    .collect()
}

/// What a VM-mode pod's boot runs besides QEMU, when the node allows VM-mode pods.
fn vm_mode(config: &NodeConfig, facts: &HostFacts) -> Finding {
    let missing: Vec<&str> = [
        (&facts.qemu_img, "qemu-img (Debian: qemu-utils)"),
        (&facts.xorrisofs, "xorrisofs (Debian: xorriso)"),
    ]
    .into_iter()
    .filter(|(found, _)| found.is_none())
    .map(|(_, what)| what)
    .collect();
    let mut image_type = vmlet_config::ANNOTATION_KEYS
        .iter()
        .filter(|(_, key)| *key == vmlet_config::AnnotationKey::ImageType)
        .map(|(name, _)| *name);
    let vm_mode = image_type.clone().next().unwrap_or_default();
    if !image_type.any(|name| config.annotations.allowed.iter().any(|a| a == name)) {
        finding(
            Ok,
            "vm mode",
            format!("off ({vm_mode} is not in annotations.allowed)"),
        )
    } else if missing.is_empty() {
        finding(
            Ok,
            "vm mode",
            "qemu-img and xorrisofs are on the PATH".into(),
        )
    } else {
        finding(
            Warn,
            "vm mode",
            format!(
                "VM-mode pods ({vm_mode}: vm) cannot start: {} not on the PATH; other pods can",
                missing.join(" and ")
            ),
        )
    }
}

fn cgroup(facts: &HostFacts) -> Finding {
    if facts.cgroup_v2 {
        finding(Ok, "cgroup", "v2 (unified)".into())
    } else {
        finding(
            Warn,
            "cgroup",
            "v1: vmlet places each pod's VM in its v1 cgroups; containerd 2.2 deprecates v1".into(),
        )
    }
}

/// containerd, the shim where containerd finds it, and the CRI runtimes that start it.
fn containerd(facts: &HostFacts) -> Vec<Finding> {
    let c = &facts.containerd;
    vec![
        match &c.version {
            Result::Ok(version) => finding(Ok, "containerd", version.clone()),
            Err(e) => finding(Fail, "containerd", e.clone()),
        },
        match &c.shim_on_path {
            Some(path) => finding(Ok, "shim", format!("{} (io.containerd.vmlet.v2)", path.display())),
            None => finding(Fail, "shim", "containerd-shim-vmlet-v2 is not on the PATH: containerd cannot start io.containerd.vmlet.v2".into()),
        },
        match &c.vmlet_runtimes {
            Result::Ok(names) if !names.is_empty() => finding(Ok, "runtime", format!("{} in {}", names.join(", "), c.config.display())),
            Result::Ok(_) => finding(Warn, "runtime", format!(
                "no CRI runtime starts vmlet in {} (Kubernetes pods cannot use it; ctr and nerdctl can): see deploy/containerd-vmlet-v*.toml",
                c.config.display()
            )),
            Err(e) => finding(Warn, "runtime", format!("{}: {e}", c.config.display())),
        },
    ]
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::host_check::ContainerdFacts;
    use vmlet_libvirt::LibvirtHost;

    #[test]
    fn the_accelerator_word_follows_the_accel_line() {
        let config = |accel| NodeConfig {
            accel,
            ..Default::default()
        };
        let mut f = facts();
        // Not usable: auto falls back, kvm cannot start a pod, tcg is TCG.
        assert_eq!(accelerator(&config(Accel::Auto), &f), Some("tcg"));
        assert_eq!(accelerator(&config(Accel::Kvm), &f), None);
        assert_eq!(accelerator(&config(Accel::Tcg), &f), Some("tcg"));
        f.libvirt_kvm = true;
        f.kvm_probe = Some(Err("a probe guest did not boot on KVM within 10 s".into()));
        assert_eq!(accelerator(&config(Accel::Auto), &f), Some("tcg"));
        assert_eq!(accelerator(&config(Accel::Kvm), &f), None);
        f.kvm_probe = Some(Result::Ok(250));
        assert_eq!(accelerator(&config(Accel::Auto), &f), Some("kvm"));
        assert_eq!(accelerator(&config(Accel::Kvm), &f), Some("kvm"));
        assert_eq!(accelerator(&config(Accel::Tcg), &f), Some("tcg"));
    }

    pub(in crate::host_check) fn facts() -> HostFacts {
        HostFacts {
            kvm: KvmFacts {
                dev_kvm: true,
                modules: vec!["kvm_pvm".into()],
                cpu_virtualisation: false,
            },
            libvirt_kvm: false,
            kvm_probe: None,
            apparmor_rules: false,
            libvirt_dir_passable: Result::Ok(true),
            pod_users_taken: Vec::new(),
            libvirt: Result::Ok(LibvirtHost {
                version: "9.0.0".into(),
                hypervisor_version: "7.2.0".into(),
                security_models: vec!["none".into()],
            }),
            vhost_vsock: false,
            vhost_net: false,
            lsm: vmlet_shim::host::qemu_apparmor::NodeLsm::None,
            apparmor_parser: false,
            qemu: Result::Ok("QEMU emulator version 7.2.15".into()),
            vmwrapper: Result::Ok(format!("vmlet-vmwrapper {}", vmlet_shim::cli::VERSION)),
            libvirt_helper: Result::Ok(format!("vmlet-libvirt {}", vmlet_shim::cli::VERSION)),
            virtiofsd: Result::Ok("virtiofsd 1.13.2".into()),
            vhost_device_vsock: Result::Ok("vhost-device-vsock 0.3.0".into()),
            guest_image: Result::Ok("/usr/local/share/vmlet/vmlinux".into()),
            qemu_img: Some("/usr/bin/qemu-img".into()),
            xorrisofs: Some("/usr/bin/xorrisofs".into()),
            cgroup_v2: true,
            containerd: ContainerdFacts {
                version: Result::Ok("containerd v2.2.0".into()),
                config: "/etc/containerd/config.toml".into(),
                vmlet_runtimes: Result::Ok(vec![
                    "io.containerd.cri.v1.runtime.runtimes.vmlet".into()
                ]),
                shim_on_path: Some("/usr/local/bin/containerd-shim-vmlet-v2".into()),
            },
        }
    }

    fn line<'a>(findings: &'a [Finding], subject: &str) -> &'a Finding {
        findings.iter().find(|f| f.subject == subject).unwrap()
    }

    #[test]
    fn the_platform_is_tested_or_named_as_untested() {
        let config = NodeConfig::default();
        let with = |qemu: &str, libvirt: &str| {
            let mut facts = facts();
            facts.libvirt = Result::Ok(LibvirtHost {
                version: libvirt.into(),
                hypervisor_version: qemu.into(),
                security_models: vec![],
            });
            line(&assess(&config, &facts), "platform").clone()
        };
        let bookworm = with("7.2.0", "9.0.0");
        assert_eq!(bookworm.verdict, Verdict::Ok, "{bookworm}");
        assert!(bookworm.text.contains("Debian 12"), "{bookworm}");
        let trixie = with("10.0.13", "11.3.0");
        assert_eq!(trixie.verdict, Verdict::Ok, "{trixie}");
        assert!(
            trixie.text.contains("QEMU 10.0.13 and libvirt 11.3.0"),
            "{trixie}"
        );
        let noble = with("8.2.2", "10.0.0");
        assert_eq!(noble.verdict, Verdict::Warn, "{noble}");
        assert!(
            noble.text.contains("not a pair vmlet is tested on"),
            "{noble}"
        );
        assert!(
            noble.text.contains("QEMU 10.0 with libvirt 11.3"),
            "{noble}"
        );
        // A mixed pair is not a tested one either.
        assert_eq!(with("10.0.2", "9.0.0").verdict, Verdict::Warn);
        // What the versions change is said either way.
        assert!(
            trixie.text.contains("without the guest CPU read in one round trip (QEMU 10.1 or later, with libvirt 12.9 or later as measured)"),
            "{trixie}"
        );
        let backports = with("11.1.3", "12.9.0");
        assert_eq!(backports.verdict, Verdict::Ok, "{backports}");
        assert!(backports.text.contains("trixie-backports"), "{backports}");
        assert!(
            backports
                .text
                .contains("with the guest CPU read in one round trip: libvirt reads"),
            "{backports}"
        );
        // Both must be new enough, and a version that is not numbers has nothing.
        assert!(with("11.1.3", "11.3.0")
            .text
            .contains("without the guest CPU"));
        assert!(with("10.1.0", "12.9.0").text.contains("with the guest CPU"));
        assert!(with("git", "12.9.0").text.contains("without the guest CPU"));
        let mut unreachable = facts();
        unreachable.libvirt = Err("refused".into());
        let findings = assess(&config, &unreachable);
        assert!(findings.iter().all(|f| f.subject != "platform"));
    }

    #[test]
    fn a_node_like_this_one_runs_tcg_with_the_user_space_vsock() {
        let config = NodeConfig::default();
        let findings = assess(&config, &facts());
        assert!(
            findings.iter().all(|f| f.verdict != Verdict::Fail),
            "{findings:#?}"
        );
        let accel = line(&findings, "accel");
        assert!(
            accel.text.starts_with("TCG fallback") && accel.text.contains("kvm_pvm"),
            "{accel}"
        );
        let vsock = line(&findings, "vsock");
        assert!(
            vsock
                .text
                .contains("user-space backend: vhost-device-vsock"),
            "{vsock}"
        );
        assert!(line(&findings, "vhost-net").text.starts_with("missing"));
        assert!(line(&findings, "libvirt")
            .text
            .contains("security driver none"));
        assert!(findings.iter().all(|f| f.subject != "confinement"));
        let printed = accel.to_string();
        assert!(printed.starts_with("warn  accel         TCG"), "{printed}");
    }

    #[test]
    fn apparmor_needs_vmlets_rules_in_libvirts_profiles() {
        let mut f = facts();
        if let Result::Ok(host) = &mut f.libvirt {
            host.security_models = vec!["apparmor".into(), "dac".into()];
        }
        let libvirt = NodeConfig {
            launcher: vmlet_config::Launcher::Libvirt,
            ..Default::default()
        };
        // Only a VM image needs them where the default starts vmlet's guest itself.
        let findings = assess(&NodeConfig::default(), &f);
        assert_eq!(line(&findings, "confinement").verdict, Verdict::Warn);
        let findings = assess(&libvirt, &f);
        let confinement = line(&findings, "confinement");
        assert_eq!(confinement.verdict, Verdict::Fail);
        assert!(
            confinement.text.contains("are not in libvirtd's profile")
                && confinement.text.contains("vmletctl install"),
            "{confinement}"
        );
        f.apparmor_rules = true;
        let findings = assess(&NodeConfig::default(), &f);
        assert_eq!(line(&findings, "confinement").verdict, Verdict::Ok);
    }

    #[test]
    fn vm_mode_names_the_programs_it_lacks_unless_the_node_does_not_allow_it() {
        let mut f = facts();
        let config = NodeConfig::default();
        assert_eq!(line(&assess(&config, &f), "vm mode").verdict, Verdict::Ok);
        f.xorrisofs = None;
        let findings = assess(&config, &f);
        let vm_mode = line(&findings, "vm mode");
        assert_eq!(vm_mode.verdict, Verdict::Warn);
        assert!(
            vm_mode.text.contains("xorrisofs (Debian: xorriso)")
                && !vm_mode.text.contains("qemu-img"),
            "{vm_mode}"
        );
        let mut off = NodeConfig::default();
        off.annotations
            .allowed
            .retain(|a| a != "vmlet.io/image-type");
        let findings = assess(&off, &f);
        let vm_mode = line(&findings, "vm mode");
        assert_eq!(vm_mode.verdict, Verdict::Ok);
        assert!(vm_mode.text.starts_with("off"), "{vm_mode}");
    }

    #[test]
    fn what_keeps_a_pod_from_starting_fails_by_name() {
        let config = NodeConfig {
            launcher: vmlet_config::Launcher::Libvirt,
            ..Default::default()
        };
        let mut f = facts();
        f.libvirt = Err("connect to qemu:///system: no socket".into());
        let findings = assess(&config, &f);
        let libvirt = line(&findings, "libvirt");
        assert_eq!(libvirt.verdict, Verdict::Fail);
        assert!(
            libvirt.text.contains("qemu:///system unreachable"),
            "{libvirt}"
        );
        assert!(line(&findings, "accel")
            .text
            .contains("libvirt is unreachable"));
        // The default launcher starts pods without it: only a CPU model libvirt expands
        // needs it.
        let findings = assess(&NodeConfig::default(), &f);
        let libvirt = line(&findings, "libvirt");
        assert_eq!(libvirt.verdict, Verdict::Warn, "{libvirt}");
        assert!(libvirt.text.contains("VM images) without it"), "{libvirt}");
        assert!(libvirt.text.contains("host-model"), "{libvirt}");
        assert!(!line(&findings, "accel")
            .text
            .contains("libvirt is unreachable"));

        // Debian's /var/lib/libvirt/qemu before install: 0750, its QEMU user's.
        let mut f = facts();
        f.libvirt_dir_passable = Result::Ok(false);
        let users = line(&assess(&config, &f), "pod-users").clone();
        assert_eq!(users.verdict, Verdict::Fail);
        assert!(users.text.contains("`vmletctl install`"), "{users}");
        let mut f = facts();
        f.pod_users_taken = vec!["alice (1879048200)".into()];
        let users = line(&assess(&config, &f), "pod-users").clone();
        assert_eq!(users.verdict, Verdict::Fail);
        assert!(users.text.contains("alice (1879048200)"), "{users}");
        assert_eq!(
            line(&assess(&config, &facts()), "pod-users").verdict,
            Verdict::Ok
        );

        let mut f = facts();
        f.vhost_device_vsock = Err("not found".into());
        f.guest_image = Err("/usr/local/share/vmlet/vmlinux: No such file".into());
        f.containerd.shim_on_path = None;
        let findings = assess(&config, &f);
        for subject in ["vsock", "guest image", "shim"] {
            assert_eq!(line(&findings, subject).verdict, Verdict::Fail, "{subject}");
        }

        let config = NodeConfig {
            accel: Accel::Kvm,
            ..Default::default()
        };
        assert_eq!(
            line(&assess(&config, &facts()), "accel").verdict,
            Verdict::Fail
        );

        // libvirt offering a KVM that cannot run guests (kvm_pvm): the probe guest hangs,
        // auto falls back to TCG, accel = "kvm" cannot start a pod.
        let mut f = facts();
        f.libvirt_kvm = true;
        f.kvm_probe = Some(Err("a probe guest did not boot on KVM within 10 s".into()));
        for (launcher, offers) in [
            (vmlet_config::Launcher::Libvirt, "libvirt offers"),
            (vmlet_config::Launcher::Auto, "/dev/kvm offers"),
        ] {
            let config = NodeConfig {
                launcher,
                ..Default::default()
            };
            let accel = line(&assess(&config, &f), "accel").clone();
            assert_eq!(accel.verdict, Verdict::Warn);
            assert!(
                accel
                    .text
                    .starts_with(&format!("TCG fallback: {offers} KVM, but a probe guest"))
                    && accel.text.contains("kvm_pvm"),
                "{accel}"
            );
        }
        let kvm = NodeConfig {
            accel: Accel::Kvm,
            ..Default::default()
        };
        let accel = line(&assess(&kvm, &f), "accel").clone();
        assert_eq!(accel.verdict, Verdict::Fail);
        assert!(
            accel.text.contains("set accel = \"auto\" or \"tcg\""),
            "{accel}"
        );
        let tcg = NodeConfig {
            accel: Accel::Tcg,
            ..Default::default()
        };
        assert_eq!(line(&assess(&tcg, &f), "accel").verdict, Verdict::Warn);
        // Where the probe guest boots, KVM it is.
        f.kvm_probe = Some(Result::Ok(420));
        let accel = line(&assess(&NodeConfig::default(), &f), "accel").clone();
        assert_eq!(accel.verdict, Verdict::Ok);
        assert!(accel.text.contains("booted on it in 420 ms"), "{accel}");
    }

    #[test]
    fn a_helper_of_another_version_is_named() {
        let mut f = facts();
        f.vmwrapper = Result::Ok("vmlet-vmwrapper 0.0.1".into());
        let findings = assess(&NodeConfig::default(), &f);
        let wrapper = line(&findings, "vmwrapper");
        assert_eq!(wrapper.verdict, Verdict::Warn);
        assert!(wrapper.text.contains("not vmletctl's version"), "{wrapper}");
    }

    #[test]
    fn kvm_reasons_follow_what_the_host_shows() {
        let none = KvmFacts::default();
        assert!(none.why_unusable().contains("no vmx or svm"));
        let masked = KvmFacts {
            dev_kvm: true,
            modules: vec!["kvm_intel".into()],
            cpu_virtualisation: true,
        };
        assert!(masked.why_unusable().contains("libvirt reports no KVM"));
    }
}
