//! Gathering [`HostFacts`]: files, `/sys`, programs' `--version`, libvirt, containerd's
//! config, and a probe guest on KVM.

use std::io::Read;
use std::path::Path;

use vmlet_config::{Accel, NodeConfig};
use vmlet_vm_image::{sha256_file, Manifest};

use super::{ContainerdFacts, HostFacts, KvmFacts};
use crate::containerd_config::ConfigLayout;
use crate::containerd_imports::{taken_vmlet_runtimes, whole_tables, Release};
use crate::node_program::{on_path, version_line};

/// The largest config file read (containerd's, AppArmor's local files).
const CONFIG_FILE_LIMIT: u64 = 1 << 20;

impl HostFacts {
    /// Looks at this host with `config`'s paths; `containerd` is the containerd binary to ask
    /// (found on the PATH when None) and `containerd_config` its config file.
    pub fn gather(
        config: &NodeConfig,
        libvirt: &vmlet_libvirt::Libvirt,
        containerd: Option<&Path>,
        containerd_config: &Path,
    ) -> Self {
        use vmlet_shim::vmm::VmManager;
        let h = &config.helpers;
        let kvm = KvmFacts::gather();
        let libvirt_host = libvirt.host().map_err(|e| e.message());
        // The KVM the launcher offers: /dev/kvm to the shim's own QEMU, libvirt's answer
        // to a domain.
        let direct = vmlet_shim::vmm::launcher_choice::choose(config).direct;
        let libvirt_kvm = kvm.dev_kvm
            && (direct
                || (libvirt_host.is_ok()
                    && libvirt.kvm_usable(&h.qemu.to_string_lossy(), &config.guest.machine)));
        let kvm_probe = (libvirt_kvm && config.accel != Accel::Tcg).then(|| {
            let state_dir = config
                .state_dir
                .is_dir()
                .then_some(config.state_dir.as_path());
            let probe = vmlet_shim::vmm::kvm_probe::guest_boots_on_kvm(
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
            libvirt_dir_passable: libvirt_dir_passable(&config.libvirt_uri),
            pod_users_taken: read_bounded(Path::new("/etc/passwd"), CONFIG_FILE_LIMIT)
                .map(|passwd| users_in(&passwd, config.pod_users))
                .unwrap_or_default(),
            vhost_vsock: Path::new("/dev/vhost-vsock").exists(),
            vhost_net: Path::new("/dev/vhost-net").exists(),
            lsm: vmlet_shim::host::qemu_apparmor::node_lsm(),
            apparmor_parser: h.apparmor_parser.is_file(),
            qemu: version_line(&h.qemu),
            vmwrapper: version_line(&h.vmwrapper),
            libvirt_helper: version_line(&h.libvirt),
            virtiofsd: version_line(&h.virtiofsd),
            vhost_device_vsock: version_line(&h.vhost_device_vsock),
            guest_image: guest_image(&config.guest.kernel, &config.guest.initrd),
            qemu_img: on_path("qemu-img"),
            xorrisofs: on_path("xorrisofs"),
            cgroup_v2: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
            containerd: {
                let version = containerd_bin
                    .ok_or_else(|| "no containerd on the PATH".to_owned())
                    .and_then(|bin| version_line(&bin));
                let release = Release::of_version_line(version.as_deref().unwrap_or_default());
                ContainerdFacts {
                    config: containerd_config.to_owned(),
                    vmlet_runtimes: read_bounded(containerd_config, CONFIG_FILE_LIMIT)
                        .and_then(|text| containerd_runtimes(containerd_config, &text, release)),
                    shim_on_path: on_path("containerd-shim-vmlet-v2"),
                    version,
                }
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
    pub(super) fn is_paravirtual(&self) -> bool {
        self.dev_kvm && !self.cpu_virtualisation && self.modules.iter().any(|m| m == "kvm_pvm")
    }

    /// Why a KVM that libvirt does not offer is unusable, as far as the host shows.
    pub(super) fn why_unusable(&self) -> String {
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

/// The users of `passwd` (`/etc/passwd`'s lines) whose uids lie in `range`, as `NAME (UID)`.
fn users_in(passwd: &str, range: vmlet_config::PodUsersConfig) -> Vec<String> {
    passwd
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let uid: u32 = fields.nth(1)?.parse().ok()?;
            range.holds(uid).then(|| format!("{name} ({uid})"))
        })
        .collect()
}

/// Whether libvirt's domain directory lets each pod's QEMU through, as the daemon behind
/// `uri` sees it (through `/proc/PID/root`: its mount namespace may be another), or as this
/// host's root has it where the system daemon's socket is not found (a socket started by
/// systemd names PID 1, whose root is the host's too).
fn libvirt_dir_passable(uri: &str) -> Result<bool, String> {
    let root = match vmlet_shim::vmm::libvirt_daemon::daemon_pid(uri)? {
        Some(pid) => std::path::PathBuf::from(format!("/proc/{pid}/root")),
        None => std::path::PathBuf::from("/"),
    };
    crate::libvirt_dir::passable(&root).map_err(|e| e.message())
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

/// The CRI runtimes that start vmlet in containerd's config (`text`, at `config`) and the
/// files it imports.
fn containerd_runtimes(config: &Path, text: &str, release: Release) -> Result<Vec<String>, String> {
    let config = std::path::absolute(config).map_err(|e| format!("{e}"))?;
    // An empty config names no runtime; one without a version (1) only 1.x reads whole.
    let layout = ConfigLayout::of(text, ConfigLayout::V3).unwrap_or(ConfigLayout::V2);
    match crate::containerd_imports::load(Path::new("/"), &config, text) {
        Ok(files) => Ok(taken_vmlet_runtimes(&files, layout, release)),
        // The config's own runtimes, where its imports cannot be followed and containerd
        // merges them (2.x); 1.6 and 1.7 may take the CRI table from one of those.
        Err(e) if whole_tables(layout, release) => Err(e),
        Err(e) => match crate::containerd_config::vmlet_runtimes(text)? {
            found if found.is_empty() => Err(e),
            found => Ok(found),
        },
    }
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

    const VMLET_V3: &str = include_str!("../../../deploy/containerd-vmlet-v3.toml");
    const VMLET_V2: &str = include_str!("../../../deploy/containerd-vmlet-v2.toml");

    #[test]
    fn the_users_in_the_pod_range_are_named() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1879048200:100::/home/alice:/bin/sh\nbroken\nbob:x:nope:1::/:/bin/sh\n";
        let range = vmlet_config::PodUsersConfig::default();
        assert_eq!(users_in(passwd, range), ["alice (1879048200)"]);
    }

    #[test]
    fn check_finds_vmlets_runtime_where_containerd_takes_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        std::fs::write(dir.path().join("conf.d/vmlet.toml"), VMLET_V3).unwrap();
        let config = dir.path().join("config.toml");
        let text = "version = 3\nimports = ['conf.d/*.toml']\n";
        let found = containerd_runtimes(&config, text, Release::Two).unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].ends_with("conf.d/vmlet.toml)"), "{found:?}");
        // 1.6 and 1.7 take the CRI table of the last file that has one: a runtime in the
        // config does not count beside an imported CRI table.
        std::fs::write(
            dir.path().join("conf.d/vmlet.toml"),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/x\"\n",
        )
        .unwrap();
        let shadowed = format!("version = 2\nimports = ['conf.d/*.toml']\n{VMLET_V2}");
        assert!(containerd_runtimes(&config, &shadowed, Release::One)
            .unwrap()
            .is_empty());
        assert_eq!(
            containerd_runtimes(&config, &shadowed, Release::Two)
                .unwrap()
                .len(),
            1
        );
        // Imports vmlet cannot follow: the config's own runtime counts on 2.x only.
        let own = format!("version = 2\nimports = ['/etc/*/x.toml']\n{VMLET_V2}");
        assert_eq!(
            containerd_runtimes(&config, &own, Release::Two)
                .unwrap()
                .len(),
            1
        );
        let err = containerd_runtimes(&config, &own, Release::One).unwrap_err();
        assert!(err.contains("globs of"), "{err}");
    }
}
