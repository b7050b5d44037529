//! `vmletctl check`: what the node has and what vmlet will use, line by line. The facts are
//! gathered by [`HostFacts::gather`] (files, `/sys`, programs' `--version`, libvirt,
//! containerd's config) and judged by [`assess()`] (`assess.rs`), a pure function the unit tests drive with
//! made-up facts. A [`Verdict::Fail`] is something that keeps a pod from starting.

mod assess;
mod facts;
mod launcher;

use std::path::PathBuf;

use vmlet_libvirt::LibvirtHost;

pub use self::assess::{accelerator, assess};

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
    /// The runtimes in the config and the files it imports that start vmlet's shim, as
    /// `plugin.runtimes.NAME` (with the imported file's path), or why they could not be read.
    pub vmlet_runtimes: Result<Vec<String>, String>,
    /// Where `containerd-shim-vmlet-v2` is on the PATH (containerd finds the shim of
    /// `io.containerd.vmlet.v2` there).
    pub shim_on_path: Option<PathBuf>,
}

/// Everything [`assess`] judges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub kvm: KvmFacts,
    /// Whether the launcher offers KVM: under the direct launcher `/dev/kvm`, under libvirt
    /// its answer to "can this QEMU run a KVM domain of this machine type".
    pub libvirt_kvm: bool,
    /// Where libvirt offers KVM and the config may use it: whether a guest booted on it (its
    /// boot time in ms) or why not ([`vmlet_shim::vmm::kvm_probe`]); None where not probed.
    pub kvm_probe: Option<Result<u64, String>>,
    /// vmlet's rules for this config, as this version writes them, are in AppArmor's local
    /// files for libvirt.
    pub apparmor_rules: bool,
    pub libvirt: Result<LibvirtHost, String>,
    /// Whether libvirt's domain directory, as libvirt's daemon sees it, lets each pod's
    /// QEMU through ([`crate::libvirt_dir`]), or why that is unknown.
    pub libvirt_dir_passable: Result<bool, String>,
    /// The users of `/etc/passwd` whose uids lie in `pod_users`, as `NAME (UID)`.
    pub pod_users_taken: Vec<String>,
    pub vhost_vsock: bool,
    pub vhost_net: bool,
    /// The security module that confines processes (QEMU under `launcher = "direct"`).
    pub lsm: vmlet_shim::host::qemu_apparmor::NodeLsm,
    /// Whether the config's `helpers.apparmor_parser` is there.
    pub apparmor_parser: bool,
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
