//! `vmletctl check`: what the node has and what vmlet will use, line by line. The facts are
//! gathered by [`HostFacts::gather`] (files, `/sys`, programs' `--version`, libvirt,
//! containerd's config) and judged by [`assess`], a pure function the unit tests drive with
//! made-up facts. A [`Verdict::Fail`] is something that keeps a pod from starting.

use std::io::Read;
use std::path::{Path, PathBuf};

use vmlet_config::{Accel, NodeConfig, VsockTransport};
use vmlet_vm_image::{sha256_file, Manifest};

use crate::node_program::{on_path, version_line};
use crate::vmm::LibvirtHost;

/// How one line of the check ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Works, with a cost or a limit worth knowing.
    Warn,
    /// A pod could not start.
    Fail,
}

/// One line of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub verdict: Verdict,
    pub subject: &'static str,
    pub text: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict:<5} {:<13} {}", self.subject, self.text)
    }
}

/// What the host has that a check needs to know about KVM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvmFacts {
    pub dev_kvm: bool,
    /// The loaded modules among kvm_intel, kvm_amd and kvm_pvm.
    pub modules: Vec<String>,
    /// The CPU shows vmx or svm.
    pub cpu_virtualisation: bool,
}

/// Where containerd is and what its config says of vmlet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdFacts {
    /// `containerd --version`'s line, or why there is none.
    pub version: Result<String, String>,
    pub config: PathBuf,
    /// The runtimes in the config that start vmlet's shim, as `plugin.runtimes.NAME`, or
    /// why the config could not be read.
    pub vmlet_runtimes: Result<Vec<String>, String>,
    /// Where `containerd-shim-vmlet-v2` is on the PATH (containerd finds the shim of
    /// `io.containerd.vmlet.v2` there).
    pub shim_on_path: Option<PathBuf>,
}

/// Everything [`assess`] judges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub kvm: KvmFacts,
    /// libvirt's answer to "can this QEMU run a KVM domain of this machine type".
    pub libvirt_kvm: bool,
    /// Where libvirt offers KVM and the config may use it: whether a guest booted on it (its
    /// boot time in ms) or why not ([`crate::kvm_probe`]); None where not probed.
    pub kvm_probe: Option<Result<u64, String>>,
    /// vmlet's rules for this config, as this version writes them, are in AppArmor's local
    /// files for libvirt.
    pub apparmor_rules: bool,
    pub libvirt: Result<LibvirtHost, String>,
    pub vhost_vsock: bool,
    pub vhost_net: bool,
    /// Each program's first line of `--version`, or why there is none: QEMU, the emulator
    /// wrapper, the libvirt helper, virtiofsd, vhost-device-vsock.
    pub qemu: Result<String, String>,
    pub vmwrapper: Result<String, String>,
    pub libvirt_helper: Result<String, String>,
    pub virtiofsd: Result<String, String>,
    pub vhost_device_vsock: Result<String, String>,
    /// The guest kernel and initrd: what they are, or why they are not usable.
    pub guest_image: Result<String, String>,
    /// Where the programs a VM-mode pod's boot runs are on the PATH: `qemu-img` (its root
    /// disk's overlay) and `xorrisofs` (its cloud-init seed).
    pub qemu_img: Option<PathBuf>,
    pub xorrisofs: Option<PathBuf>,
    pub cgroup_v2: bool,
    pub containerd: ContainerdFacts,
}

/// The largest config file read (containerd's, AppArmor's local files).
const CONFIG_FILE_LIMIT: u64 = 1 << 20;

impl HostFacts {
    /// Looks at this host with `config`'s paths; `containerd` is the containerd binary to ask
    /// (found on the PATH when None) and `containerd_config` its config file.
    pub fn gather(
        config: &NodeConfig,
        libvirt: &crate::vmm::Libvirt,
        containerd: Option<&Path>,
        containerd_config: &Path,
    ) -> Self {
        use crate::vmm::VmManager;
        let h = &config.helpers;
        let kvm = KvmFacts::gather();
        let libvirt_host = libvirt.host().map_err(|e| e.message());
        let libvirt_kvm = libvirt_host.is_ok()
            && kvm.dev_kvm
            && libvirt.kvm_usable(&h.qemu.to_string_lossy(), &config.guest.machine);
        let kvm_probe = (libvirt_kvm && config.accel != Accel::Tcg).then(|| {
            let state_dir = config
                .state_dir
                .is_dir()
                .then_some(config.state_dir.as_path());
            let probe = crate::kvm_probe::guest_boots_on_kvm(
                &h.qemu,
                &config.guest.kernel,
                &config.guest.machine,
                state_dir,
            );
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime for the probe: {e}"))
                .and_then(|runtime| runtime.block_on(probe))
                .map(|took| took.as_millis() as u64)
        });
        let containerd_bin = containerd
            .map(Path::to_owned)
            .or_else(|| on_path("containerd"));
        let apparmor_rules = crate::node_install::apparmor_rules_installed(
            Path::new("/"),
            config,
            CONFIG_FILE_LIMIT,
        );
        HostFacts {
            kvm,
            libvirt_kvm,
            kvm_probe,
            apparmor_rules,
            libvirt: libvirt_host,
            vhost_vsock: Path::new("/dev/vhost-vsock").exists(),
            vhost_net: Path::new("/dev/vhost-net").exists(),
            qemu: version_line(&h.qemu),
            vmwrapper: version_line(&h.vmwrapper),
            libvirt_helper: version_line(&h.libvirt),
            virtiofsd: version_line(&h.virtiofsd),
            vhost_device_vsock: version_line(&h.vhost_device_vsock),
            guest_image: guest_image(&config.guest.kernel, &config.guest.initrd),
            qemu_img: on_path("qemu-img"),
            xorrisofs: on_path("xorrisofs"),
            cgroup_v2: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
            containerd: ContainerdFacts {
                version: containerd_bin
                    .ok_or_else(|| "no containerd on the PATH".to_owned())
                    .and_then(|bin| version_line(&bin)),
                config: containerd_config.to_owned(),
                vmlet_runtimes: read_bounded(containerd_config, CONFIG_FILE_LIMIT)
                    .and_then(|text| crate::containerd_config::vmlet_runtimes(&text)),
                shim_on_path: on_path("containerd-shim-vmlet-v2"),
            },
        }
    }
}

impl KvmFacts {
    fn gather() -> Self {
        let cpuinfo = read_bounded(Path::new("/proc/cpuinfo"), 4 << 20).unwrap_or_default();
        KvmFacts {
            dev_kvm: Path::new("/dev/kvm").exists(),
            modules: ["kvm_intel", "kvm_amd", "kvm_pvm"]
                .into_iter()
                .filter(|m| Path::new("/sys/module").join(m).exists())
                .map(str::to_owned)
                .collect(),
            cpu_virtualisation: cpuinfo
                .lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm")),
        }
    }

    /// /dev/kvm is kvm_pvm's, on a CPU without vmx or svm: QEMU cannot run a guest on it,
    /// whatever libvirt says.
    fn is_paravirtual(&self) -> bool {
        self.dev_kvm && !self.cpu_virtualisation && self.modules.iter().any(|m| m == "kvm_pvm")
    }

    /// Why a KVM that libvirt does not offer is unusable, as far as the host shows.
    fn why_unusable(&self) -> String {
        if !self.dev_kvm {
            return if self.cpu_virtualisation {
                "no /dev/kvm (load kvm_intel or kvm_amd)".into()
            } else {
                "no /dev/kvm, and the CPU shows no vmx or svm (a VM without nested \
                 virtualisation, or virtualisation off in the firmware)"
                    .into()
            };
        }
        if self.modules.iter().any(|m| m == "kvm_pvm") {
            return "/dev/kvm is kvm_pvm's (paravirtual KVM of a host that is itself a VM, \
                    whose CPU shows no vmx or svm): QEMU cannot run an ordinary guest on it"
                .into();
        }
        "libvirt reports no KVM domain for this QEMU and machine type (is /dev/kvm \
         accessible to libvirt's QEMU user, or masked for libvirtd?)"
            .into()
    }
}

/// Judges the facts against the node config, one finding per subject.
/// Why a probe guest would not boot, where the host shows it.
fn paravirtual_note(kvm: &KvmFacts) -> &'static str {
    if kvm.is_paravirtual() {
        " (/dev/kvm is kvm_pvm's: this host is itself a VM with a paravirtual KVM)"
    } else {
        ""
    }
}

pub fn assess(config: &NodeConfig, facts: &HostFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut say = |verdict, subject, text: String| {
        out.push(Finding {
            verdict,
            subject,
            text,
        })
    };
    use Verdict::{Fail, Ok, Warn};

    // The accelerator.
    let kvm_why = || {
        if facts.libvirt.is_err() {
            "libvirt is unreachable, so its KVM support is unknown".to_owned()
        } else {
            facts.kvm.why_unusable()
        }
    };
    let accel = format!("{:?}", config.accel).to_lowercase();
    match (config.accel, facts.libvirt_kvm, &facts.kvm_probe) {
        (Accel::Tcg, _, _) => say(Warn, "accel", "TCG (accel = \"tcg\" in the node config): software emulation, several times slower than KVM".into()),
        (Accel::Auto, true, Some(Err(why))) => say(Warn, "accel", format!(
            "TCG fallback: libvirt offers KVM, but {why}{}",
            paravirtual_note(&facts.kvm)
        )),
        (_, true, Some(Err(why))) => say(Fail, "accel", format!(
            "accel = \"{accel}\" in the node config, but {why}{}: set accel = \"auto\" or \"tcg\"",
            paravirtual_note(&facts.kvm)
        )),
        (_, true, Some(Result::Ok(ms))) => say(Ok, "accel", format!("KVM (accel = \"{accel}\"): a probe guest booted on it in {ms} ms")),
        (_, true, None) => say(Ok, "accel", format!("KVM (accel = \"{accel}\")")),
        (Accel::Auto, false, _) => say(Warn, "accel", format!("TCG fallback: KVM is not usable: {}", kvm_why())),
        (Accel::Kvm, false, _) => say(Fail, "accel", format!("accel = \"kvm\" in the node config, but KVM is not usable: {}", kvm_why())),
    }

    // vsock.
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
    let (verdict, text) = match (config.vsock, facts.vhost_vsock) {
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
    say(verdict, "vsock", text);

    // vhost-net.
    if facts.vhost_net {
        say(Ok, "vhost-net", "/dev/vhost-net present; vmlet's taps do not use it (vhost=off): QEMU moves their packets".into());
    } else {
        say(Warn, "vhost-net", "missing (/dev/vhost-net; modprobe vhost_net): vmlet's taps do not need it (vhost=off), QEMU moves their packets".into());
    }

    // libvirt.
    match &facts.libvirt {
        Result::Ok(host) => {
            let models = if host.security_models.is_empty() {
                "none".to_owned()
            } else {
                host.security_models.join(", ")
            };
            say(
                Ok,
                "libvirt",
                format!(
                    "{} reachable: libvirt {}, hypervisor {}, security driver {models}",
                    config.libvirt_uri, host.version, host.hypervisor_version
                ),
            );
            let local = format!("/{}", crate::node_apparmor::LOCAL_LIBVIRTD);
            if host.security_models.iter().any(|m| m == "apparmor") {
                if facts.apparmor_rules {
                    say(Ok, "confinement", format!("libvirt confines QEMU with AppArmor; vmlet's rules are in libvirtd's profile ({local}), and each pod's QEMU gets a profile of its own ({})", crate::pod_apparmor::PROFILE_DIR));
                } else {
                    say(Fail, "confinement", format!("libvirt confines QEMU with AppArmor, and vmlet's rules (of this version and config) are not in libvirtd's profile ({local}): libvirtd cannot start vmlet's wrapper or virtiofsd; `vmletctl install` adds them"));
                }
            }
            if host.security_models.iter().any(|m| m == "selinux") {
                say(Warn, "confinement", "libvirt confines QEMU with SELinux: vmlet's own QEMU arguments (the vsock and QMP sockets in the state directory) have no labels from vmlet; untested".into());
            }
        }
        Err(e) => say(
            Fail,
            "libvirt",
            format!(
                "{} unreachable: {e} (is libvirtd running?)",
                config.libvirt_uri
            ),
        ),
    }

    // Programs: vmlet's own must be of this vmletctl's version.
    let h = &config.helpers;
    for (subject, path, result, ours) in [
        ("qemu", &h.qemu, &facts.qemu, false),
        ("vmwrapper", &h.vmwrapper, &facts.vmwrapper, true),
        ("vmlet-libvirt", &h.libvirt, &facts.libvirt_helper, true),
        ("virtiofsd", &h.virtiofsd, &facts.virtiofsd, false),
    ] {
        let (verdict, text) = match result {
            Result::Ok(version)
                if ours && !version.ends_with(&format!(" {}", crate::cli::VERSION)) =>
            {
                let mine = crate::cli::VERSION;
                (
                    Warn,
                    format!(
                        "{} ({version}): not vmletctl's version {mine}",
                        path.display()
                    ),
                )
            }
            Result::Ok(version) => (Ok, format!("{} ({version})", path.display())),
            Err(e) => (Fail, format!("{}: {e}", path.display())),
        };
        say(verdict, subject, text);
    }

    // The guest image.
    match &facts.guest_image {
        Result::Ok(what) => say(Ok, "guest image", what.clone()),
        Err(e) => say(Fail, "guest image", e.clone()),
    }

    // What a VM-mode pod's boot runs besides QEMU.
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
        say(
            Ok,
            "vm mode",
            format!("off ({vm_mode} is not in annotations.allowed)"),
        );
    } else if missing.is_empty() {
        say(
            Ok,
            "vm mode",
            "qemu-img and xorrisofs are on the PATH".into(),
        );
    } else {
        say(
            Warn,
            "vm mode",
            format!(
                "VM-mode pods ({vm_mode}: vm) cannot start: {} not on the PATH; other pods can",
                missing.join(" and ")
            ),
        );
    }

    // cgroups.
    if facts.cgroup_v2 {
        say(Ok, "cgroup", "v2 (unified)".into());
    } else {
        say(
            Warn,
            "cgroup",
            "v1: vmlet places each pod's VM in its v1 cgroups; containerd 2.2 deprecates v1".into(),
        );
    }

    // containerd.
    let c = &facts.containerd;
    match &c.version {
        Result::Ok(version) => say(Ok, "containerd", version.clone()),
        Err(e) => say(Fail, "containerd", e.clone()),
    }
    match &c.shim_on_path {
        Some(path) => say(Ok, "shim", format!("{} (io.containerd.vmlet.v2)", path.display())),
        None => say(Fail, "shim", "containerd-shim-vmlet-v2 is not on the PATH: containerd cannot start io.containerd.vmlet.v2".into()),
    }
    match &c.vmlet_runtimes {
        Result::Ok(names) if !names.is_empty() => say(Ok, "runtime", format!("{} in {}", names.join(", "), c.config.display())),
        Result::Ok(_) => say(Warn, "runtime", format!(
            "no CRI runtime starts vmlet in {} (Kubernetes pods cannot use it; ctr and nerdctl can): see deploy/containerd-vmlet-v*.toml",
            c.config.display()
        )),
        Err(e) => say(Warn, "runtime", format!("{}: {e}", c.config.display())),
    }
    out
}

/// The guest kernel and initrd, checked against the `manifest.json` beside them when there
/// is one.
fn guest_image(kernel: &Path, initrd: &Path) -> Result<String, String> {
    let size = |path: &Path| {
        std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|m| {
                if m.is_file() {
                    Ok(m.len())
                } else {
                    Err(format!("{}: not a file", path.display()))
                }
            })
    };
    let (k, i) = (size(kernel)?, size(initrd)?);
    let mut text = format!(
        "{} ({} MiB), {} ({} MiB)",
        kernel.display(),
        k >> 20,
        initrd.display(),
        i >> 20
    );
    let Some(dir) = kernel.parent() else {
        return Ok(text);
    };
    let manifest_path = dir.join("manifest.json");
    if !manifest_path.exists() {
        text.push_str(" (no manifest.json beside them)");
        return Ok(text);
    }
    let manifest = Manifest::load(dir).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    for (path, key, want) in [
        (kernel, "kernel_sha256", &manifest.kernel_sha256),
        (initrd, "initrd_sha256", &manifest.initrd_sha256),
    ] {
        let digest = sha256_file(path).map_err(|e| e.to_string())?;
        if &digest != want {
            return Err(format!(
                "{} does not match {} ({key}): rebuild it with vmlet-image build",
                path.display(),
                manifest_path.display()
            ));
        }
    }
    text.push_str(&format!(
        ", match {}: kernel {}, agent {}",
        manifest_path.display(),
        manifest.kernel_release,
        manifest.agent_version
    ));
    Ok(text)
}

fn read_bounded(path: &Path, limit: u64) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{e}"))?;
    let mut text = String::new();
    file.take(limit)
        .read_to_string(&mut text)
        .map_err(|e| format!("{e}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> HostFacts {
        HostFacts {
            kvm: KvmFacts {
                dev_kvm: true,
                modules: vec!["kvm_pvm".into()],
                cpu_virtualisation: false,
            },
            libvirt_kvm: false,
            kvm_probe: None,
            apparmor_rules: false,
            libvirt: Result::Ok(LibvirtHost {
                version: "9.0.0".into(),
                hypervisor_version: "7.2.0".into(),
                security_models: vec!["none".into()],
            }),
            vhost_vsock: false,
            vhost_net: false,
            qemu: Result::Ok("QEMU emulator version 7.2.15".into()),
            vmwrapper: Result::Ok(format!("vmlet-vmwrapper {}", crate::cli::VERSION)),
            libvirt_helper: Result::Ok(format!("vmlet-libvirt {}", crate::cli::VERSION)),
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
        let findings = assess(&NodeConfig::default(), &f);
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
        let config = NodeConfig::default();
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
        let accel = line(&assess(&NodeConfig::default(), &f), "accel").clone();
        assert_eq!(accel.verdict, Verdict::Warn);
        assert!(
            accel
                .text
                .starts_with("TCG fallback: libvirt offers KVM, but a probe guest")
                && accel.text.contains("kvm_pvm"),
            "{accel}"
        );
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
