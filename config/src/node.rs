//! The node config file, owned by the operator.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Error, HelperPaths};

/// Where the shim looks for its config file unless [`CONFIG_ENV`] names another.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vmlet/config.toml";
/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "VMLET_CONFIG";

/// How the VM's CPU is virtualised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM when libvirt reports it usable for this host, TCG otherwise.
    Auto,
    /// Always KVM; fails where KVM is not usable.
    Kvm,
    /// Always TCG (software emulation).
    Tcg,
}

/// How the shim reaches the agent's vsock port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VsockTransport {
    /// `vhost` where `/dev/vhost-vsock` exists, `vhost-user` otherwise.
    Auto,
    /// The kernel's vhost-vsock (libvirt `<vsock>`, AF_VSOCK on the host).
    Vhost,
    /// A per-VM `vhost-device-vsock` process, reached through a unix socket.
    VhostUser,
}

/// What starts a pod's QEMU (vmlet's guest or a VM image; a CPU model libvirt expands always
/// goes through libvirt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// `direct` wherever the shim confines QEMU itself (the shim's `launcher_choice` says
    /// where), `libvirt` where the config or the node needs it.
    Auto,
    /// libvirt defines and starts a domain per pod.
    Libvirt,
    /// The shim starts QEMU and virtiofsd itself, as libvirt runs them (QEMU as the pod's
    /// own user; both in the pod's cgroup; under a profile of the pod's own where AppArmor
    /// is on); vhost-user vsock only, and not on a node with SELinux enforcing.
    Direct,
}

/// The guest: kernel, initramfs and default shape.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuestConfig {
    /// Guest kernel (`vmlet-image build` writes the lean `vmlinux`, or `vmlinuz` with
    /// `--kernel cloud`).
    pub kernel: PathBuf,
    /// Guest initramfs holding the agent and modules.
    pub initrd: PathBuf,
    /// QEMU machine type.
    pub machine: String,
    /// vCPUs of a pod that asks for nothing.
    pub vcpus: u32,
    /// Memory (MiB) of a pod that asks for nothing.
    pub memory_mib: u64,
    /// Largest vCPU count a pod may ask for.
    pub max_vcpus: u32,
    /// Largest memory (MiB) a pod may ask for.
    pub max_memory_mib: u64,
    /// Extra kernel command line parameters, appended to vmlet's own.
    pub kernel_params: String,
    /// vCPUs added to a pod's CPU limit when the VM is sized from limits.
    pub overhead_vcpus: u32,
    /// Memory (MiB) added to a pod's memory limit when the VM is sized from limits: the
    /// guest kernel and agent live beside the containers.
    pub overhead_memory_mib: u64,
    /// A cap (MiB) on QEMU's translation cache when it emulates the CPU (TCG, no KVM): the
    /// code it translated so far, which counts in every pod's host memory. Unset: QEMU's
    /// own default (up to 1 GiB, filled as the guest runs new code; ~42 MiB in an idle
    /// pod). A small cap saves memory and costs re-translation (`docs/performance.md`).
    pub tcg_translation_cache_mib: Option<u64>,
    /// Whether the guest reports the pages it frees so that the host takes them back (a
    /// `virtio-balloon` with free page reporting, never inflated). Off by default: it did
    /// not change an idle pod's memory, and it is the first suspect of a guest kernel fault
    /// seen once (`docs/performance.md`).
    pub free_page_reporting: bool,
}

impl Default for GuestConfig {
    fn default() -> Self {
        Self {
            kernel: PathBuf::from("/usr/local/share/vmlet/vmlinux"),
            initrd: PathBuf::from("/usr/local/share/vmlet/initrd.img"),
            machine: "q35".into(),
            vcpus: 1,
            memory_mib: 256,
            max_vcpus: 8,
            max_memory_mib: 16 * 1024,
            kernel_params: String::new(),
            overhead_vcpus: 0,
            overhead_memory_mib: 128,
            tcg_translation_cache_mib: None,
            free_page_reporting: false,
        }
    }
}

/// VM-image pods (`vmlet.io/image-type: vm`): where their root disks are written, and how
/// large one may be.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmImagesConfig {
    /// A disk-backed directory for each VM-image pod's root disk overlay (the copy-on-write
    /// file its guest writes): not the state directory, which is a tmpfs on a node.
    pub disk_dir: PathBuf,
    /// The largest root disk (MiB) a VM-image pod may have: its image's disk, or the size
    /// `vmlet.io/root-volume-size` grows it to. A guest writes its overlay up to that size
    /// and no more; a larger disk is refused by name.
    pub max_root_disk_mib: u64,
}

impl Default for VmImagesConfig {
    fn default() -> Self {
        Self {
            disk_dir: PathBuf::from("/var/lib/vmlet/disks"),
            max_root_disk_mib: 20 * 1024,
        }
    }
}

/// Template starts: a pod boots by loading a saved, booted guest of its VM shape instead of
/// booting its own (vmlet's guest on vhost-user vsock, with its NICs plugged in after the
/// load); the first pod of a shape boots and saves it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TemplatesConfig {
    /// Whether pods start from templates.
    pub enabled: bool,
    /// A disk-backed directory, root's and closed to others, for the saved guests.
    pub dir: PathBuf,
    /// How many saved guests (VM shapes) the directory may hold.
    pub max_count: u32,
    /// How many MiB of the disk they may take between them (a new one counted at its
    /// guest's memory until it is saved).
    pub max_mib: u64,
}

impl Default for TemplatesConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            dir: PathBuf::from("/var/lib/vmlet/templates"),
            max_count: 4,
            max_mib: 4096,
        }
    }
}

/// The uids pods' QEMUs run as: each pod takes one of its own from this range for its
/// life, so that no pod's QEMU (nor anything of its uid) can open another pod's files and
/// sockets. The range must hold no user of the node (`vmletctl check` verifies it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PodUsersConfig {
    /// The range's first uid.
    pub first_uid: u32,
    /// How many uids it holds: the most pods the node runs at once.
    pub count: u32,
}

impl PodUsersConfig {
    /// Whether `uid` is in the range.
    pub fn holds(&self, uid: u32) -> bool {
        uid >= self.first_uid && uid - self.first_uid < self.count
    }
}

impl Default for PodUsersConfig {
    /// 0x70000000 on: above the regular and system users, the dynamic service users and
    /// the container ranges systemd hands out (524288..1879048191), and below its foreign
    /// range (2147352576 on).
    fn default() -> Self {
        Self {
            first_uid: 0x7000_0000,
            count: 65536,
        }
    }
}

/// The default [`NodeConfig::metrics_gid`] (0x70010000, after the default pod uids).
pub const DEFAULT_METRICS_GID: u32 = 0x7001_0000;

/// Which pod annotations this node honours.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnnotationsConfig {
    /// Annotation names pods may set (see `ANNOTATION_KEYS`); a pod setting another known
    /// one is refused with PERMISSION_DENIED.
    pub allowed: Vec<String>,
    /// Whether `vmlet.io/vcpus` / `vmlet.io/memory` may size a pod's VM beyond its limits
    /// plus the overhead (off: refused with PERMISSION_DENIED, so a pod's VM never takes
    /// more than kubelet accounts for it).
    pub beyond_limits: bool,
}

impl Default for AnnotationsConfig {
    fn default() -> Self {
        Self {
            allowed: crate::DEFAULT_ALLOWED
                .iter()
                .map(|s| s.to_string())
                .collect(),
            beyond_limits: false,
        }
    }
}

/// The whole node config. Every key has a default; unknown keys are refused.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// libvirt connection URI.
    pub libvirt_uri: String,
    /// Where the shim keeps per-pod state (shared dirs, sockets, state files).
    pub state_dir: PathBuf,
    /// CPU virtualisation.
    pub accel: Accel,
    /// Agent channel transport.
    pub vsock: VsockTransport,
    /// What starts a pod's QEMU.
    pub launcher: Launcher,
    /// The user whose groups pods' QEMUs run with (its primary group, which on Debian is
    /// `kvm`, and its supplementary ones: the device nodes'); each pod's QEMU has a uid of its
    /// own ([`PodUsersConfig`]), whichever launcher starts it.
    pub qemu_user: String,
    /// The uids of pods' QEMUs.
    pub pod_users: PodUsersConfig,
    /// The group that may read what the shims publish for metrics (`STATE_DIR/.metrics`:
    /// each pod's figures socket and the node's counters) and nothing else of vmlet's, so
    /// that `vmletctl metrics` runs unprivileged, as the uid and gid of this number (the
    /// DaemonSet's metrics container), which nothing else on the node is: outside
    /// `pod_users`.
    pub metrics_gid: u32,
    /// Seconds to wait for the agent to answer after the VM started.
    pub agent_timeout_secs: u64,
    /// Size in MiB of each pod's `log/` directory, a tmpfs holding every file the guest can
    /// make a host process write (its serial console, the vsock backend's log): the most of
    /// the node's memory and state file system a guest can take that way.
    pub pod_log_mib: u64,
    /// Guest image and default shape.
    pub guest: GuestConfig,
    /// Helper programs.
    pub helpers: HelperPaths,
    /// Pod annotations the node honours.
    pub annotations: AnnotationsConfig,
    /// VM-image pods' root disks.
    pub vm_images: VmImagesConfig,
    /// Template starts.
    pub templates: TemplatesConfig,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            libvirt_uri: "qemu:///system".into(),
            state_dir: PathBuf::from("/run/vmlet"),
            accel: Accel::Auto,
            vsock: VsockTransport::Auto,
            launcher: Launcher::Auto,
            qemu_user: "libvirt-qemu".into(),
            pod_users: PodUsersConfig::default(),
            // Clear of system groups and systemd's ranges, as the pods' uids are.
            metrics_gid: DEFAULT_METRICS_GID,
            agent_timeout_secs: 30,
            pod_log_mib: 8,
            guest: GuestConfig::default(),
            helpers: HelperPaths::default(),
            annotations: AnnotationsConfig::default(),
            vm_images: VmImagesConfig::default(),
            templates: TemplatesConfig::default(),
        }
    }
}

impl NodeConfig {
    /// Parses and validates a config file's text. `path` only names the file in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, Error> {
        let config: NodeConfig = toml::from_str(text).map_err(|e| Error::ParseConfig {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Loads the config from [`CONFIG_ENV`] or [`DEFAULT_CONFIG_PATH`]. A missing file at the
    /// default path means "all defaults"; a missing file named by the environment is an error.
    pub fn load() -> Result<Self, Error> {
        match std::env::var_os(CONFIG_ENV) {
            Some(path) => Self::load_from(Path::new(&path)),
            None => match std::fs::read_to_string(DEFAULT_CONFIG_PATH) {
                Ok(text) => Self::from_toml(&text, Path::new(DEFAULT_CONFIG_PATH)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let config = Self::default();
                    config.validate()?;
                    Ok(config)
                }
                Err(source) => Err(Error::ReadConfig {
                    path: DEFAULT_CONFIG_PATH.into(),
                    source,
                }),
            },
        }
    }

    /// Loads and validates the config file at `path`.
    pub fn load_from(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// `dir` (the value of `key`) is absolute and apart from `state_dir` (`why` ends the
    /// message).
    fn disk_backed(&self, key: &'static str, dir: &Path, why: &str) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::InvalidConfig { key, reason });
        if !dir.is_absolute() {
            return invalid("must be an absolute path".into());
        }
        if dir.starts_with(&self.state_dir) || self.state_dir.starts_with(dir) {
            return invalid(format!(
                "{} must lie apart from state_dir ({}){why}",
                dir.display(),
                self.state_dir.display()
            ));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), Error> {
        let g = &self.guest;
        let invalid = |key, reason: String| Err(Error::InvalidConfig { key, reason });
        if g.vcpus == 0 {
            return invalid("guest.vcpus", "must be at least 1".into());
        }
        if g.max_vcpus < g.vcpus {
            return invalid(
                "guest.max_vcpus",
                format!("{} is below guest.vcpus ({})", g.max_vcpus, g.vcpus),
            );
        }
        if g.memory_mib < 64 {
            return invalid("guest.memory_mib", "must be at least 64".into());
        }
        if g.max_memory_mib < g.memory_mib {
            return invalid(
                "guest.max_memory_mib",
                format!(
                    "{} is below guest.memory_mib ({})",
                    g.max_memory_mib, g.memory_mib
                ),
            );
        }
        if g.tcg_translation_cache_mib == Some(0) {
            return invalid(
                "guest.tcg_translation_cache_mib",
                "must be at least 1".into(),
            );
        }
        if self.agent_timeout_secs == 0 {
            return invalid("agent_timeout_secs", "must be at least 1".into());
        }
        let users = &self.pod_users;
        if users.count == 0 {
            return invalid("pod_users.count", "must be at least 1".into());
        }
        if users.first_uid < 1000 {
            return invalid(
                "pod_users.first_uid",
                format!("{} is a system user's uid (below 1000)", users.first_uid),
            );
        }
        // 4294967295 is (uid_t)-1, "no change" to chown and setresuid.
        if u64::from(users.first_uid) + u64::from(users.count) > u64::from(u32::MAX) {
            return invalid(
                "pod_users.count",
                format!(
                    "{} from {} passes the last uid (4294967294)",
                    users.count, users.first_uid
                ),
            );
        }
        if self.pod_users.holds(self.metrics_gid) {
            return invalid(
                "metrics_gid",
                format!(
                    "{} is in pod_users: the metrics run as this uid, which no pod's QEMU may have",
                    self.metrics_gid
                ),
            );
        }
        if self.metrics_gid < 1000 || self.metrics_gid == u32::MAX {
            return invalid(
                "metrics_gid",
                format!(
                    "{} is a system group's gid (below 1000) or no gid",
                    self.metrics_gid
                ),
            );
        }
        if self.pod_log_mib == 0 {
            return invalid("pod_log_mib", "must be at least 1".into());
        }
        if !self.state_dir.is_absolute() {
            return invalid("state_dir", "must be an absolute path".into());
        }
        // QEMU's options are comma-separated: a comma in a path its command line names
        // would end the option there and start another.
        for (key, path) in [
            ("state_dir", &self.state_dir),
            ("guest.kernel", &g.kernel),
            ("guest.initrd", &g.initrd),
        ] {
            if path.to_string_lossy().contains(',') {
                return invalid(
                    key,
                    "must not contain a comma (QEMU's option separator)".into(),
                );
            }
        }
        self.disk_backed(
            "vm_images.disk_dir",
            &self.vm_images.disk_dir,
            ": guests write their disks there",
        )?;
        if self.vm_images.max_root_disk_mib == 0 {
            return invalid("vm_images.max_root_disk_mib", "must be at least 1".into());
        }
        self.disk_backed("templates.dir", &self.templates.dir, ", a tmpfs on a node")?;
        if self.templates.max_count == 0 {
            return invalid("templates.max_count", "must be at least 1".into());
        }
        if self.templates.max_mib == 0 {
            return invalid("templates.max_mib", "must be at least 1".into());
        }
        if self.templates.enabled && self.vsock == VsockTransport::Vhost {
            return invalid(
                "templates.enabled",
                "template starts need vsock = \"vhost-user\" (or \"auto\" on a node \
                 without /dev/vhost-vsock): the kernel's vsock device cannot be plugged in \
                 after a load"
                    .into(),
            );
        }
        if self.launcher == Launcher::Direct && self.vsock == VsockTransport::Vhost {
            return invalid(
                "launcher",
                "launcher = \"direct\" needs vsock = \"vhost-user\" (or \"auto\"): the \
                 kernel's vsock device wants a CID, which libvirt allocates"
                    .into(),
            );
        }
        if let Some(unknown) = self
            .annotations
            .allowed
            .iter()
            .find(|a| !crate::annotation_keys::is_known(a))
        {
            return invalid(
                "annotations.allowed",
                format!("{unknown:?} is not an annotation vmlet knows"),
            );
        }
        if !crate::annotations::is_q35(&g.machine) {
            return invalid(
                "guest.machine",
                format!("{:?}: vmlet's devices need a q35 machine", g.machine),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NodeConfig, Error> {
        NodeConfig::from_toml(text, Path::new("/test/config.toml"))
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(parse("").unwrap(), NodeConfig::default());
    }

    #[test]
    fn overrides_nested_keys() {
        let c = parse(
            "libvirt_uri = \"qemu:///system?socket=/x\"\naccel = \"tcg\"\nvsock = \"vhost-user\"\n\
             [guest]\nmemory_mib = 512\n[helpers]\nqemu = \"/opt/qemu\"\n",
        )
        .unwrap();
        assert_eq!(c.libvirt_uri, "qemu:///system?socket=/x");
        assert_eq!(c.accel, Accel::Tcg);
        assert_eq!(c.vsock, VsockTransport::VhostUser);
        assert_eq!(c.guest.memory_mib, 512);
        assert_eq!(c.guest.vcpus, 1);
        assert_eq!(c.helpers.qemu, PathBuf::from("/opt/qemu"));
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let err = parse("accel = \"tcg\"\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bogus"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("/test/config.toml"), "{err}");
    }

    #[test]
    fn bad_enum_value_names_value() {
        let err = parse("accel = \"fast\"\n").unwrap_err().to_string();
        assert!(err.contains("fast"), "{err}");
    }

    #[test]
    fn out_of_range_value_names_key() {
        let err = parse("[guest]\nvcpus = 4\nmax_vcpus = 2\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("guest.max_vcpus"), "{err}");
        let err = parse("pod_log_mib = 0\n").unwrap_err().to_string();
        assert!(err.contains("pod_log_mib"), "{err}");
        assert_eq!(parse("pod_log_mib = 2\n").unwrap().pod_log_mib, 2);
        let err = parse("[guest]\ntcg_translation_cache_mib = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("guest.tcg_translation_cache_mib"), "{err}");
        let capped = parse("[guest]\ntcg_translation_cache_mib = 16\n").unwrap();
        assert_eq!(capped.guest.tcg_translation_cache_mib, Some(16));
        assert_eq!(parse("").unwrap().guest.tcg_translation_cache_mib, None);
    }

    #[test]
    fn vm_image_disks_live_apart_from_the_state_directory() {
        let c =
            parse("[vm_images]\ndisk_dir = \"/srv/disks\"\nmax_root_disk_mib = 4096\n").unwrap();
        assert_eq!(c.vm_images.disk_dir, PathBuf::from("/srv/disks"));
        assert_eq!(c.vm_images.max_root_disk_mib, 4096);
        for bad in [
            "[vm_images]\ndisk_dir = \"/run/vmlet/disks\"\n",
            "state_dir = \"/var/lib/vmlet/disks/state\"\n",
            "[vm_images]\ndisk_dir = \"disks\"\n",
            "[vm_images]\nmax_root_disk_mib = 0\n",
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("vm_images."), "{bad}: {err}");
        }
    }

    #[test]
    fn the_metrics_group_is_not_a_system_group() {
        assert_eq!(parse("").unwrap().metrics_gid, DEFAULT_METRICS_GID);
        for bad in [
            "metrics_gid = 0\n",
            "metrics_gid = 999\n",
            "metrics_gid = 4294967295\n",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("metrics_gid"), "{bad}: {e}");
        }
        assert_eq!(parse("metrics_gid = 5000\n").unwrap().metrics_gid, 5000);
        let e = parse("metrics_gid = 1879048200\n").unwrap_err().to_string();
        assert!(e.contains("pod_users"), "{e}");
    }

    #[test]
    fn pod_users_are_a_range_clear_of_system_users_and_the_last_uid() {
        let users = parse("").unwrap().pod_users;
        assert_eq!((users.first_uid, users.count), (0x7000_0000, 65536));
        assert!(users.holds(0x7000_0000) && users.holds(0x7000_ffff));
        assert!(!users.holds(0x6fff_ffff) && !users.holds(0x7001_0000));
        for (text, key) in [
            ("[pod_users]\ncount = 0\n", "pod_users.count"),
            ("[pod_users]\nfirst_uid = 999\n", "pod_users.first_uid"),
            (
                "[pod_users]\nfirst_uid = 4294967290\ncount = 6\n",
                "pod_users.count",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let last = parse("[pod_users]\nfirst_uid = 4294967290\ncount = 5\n").unwrap();
        assert!(last.pod_users.holds(4_294_967_294));
    }

    #[test]
    fn the_launcher_is_auto_unless_asked_and_direct_only_on_vhost_user_vsock() {
        assert_eq!(parse("").unwrap().launcher, Launcher::Auto);
        let c = parse("launcher = \"direct\"\n").unwrap();
        assert_eq!(c.launcher, Launcher::Direct);
        let c = parse("launcher = \"auto\"\nvsock = \"vhost\"\n").unwrap();
        assert_eq!(c.launcher, Launcher::Auto, "auto chooses libvirt there");
        let err = parse("launcher = \"direct\"\nvsock = \"vhost\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("launcher") && err.contains("vhost-user"),
            "{err}"
        );
        let err = parse("launcher = \"qemu\"\n").unwrap_err().to_string();
        assert!(err.contains("launcher") || err.contains("qemu"), "{err}");
    }

    #[test]
    fn templates_are_off_unless_enabled_and_their_directory_and_limits_are_checked() {
        let off = parse("").unwrap();
        assert!(!off.templates.enabled);
        let c = parse("[templates]\nenabled = true\ndir = \"/srv/templates\"\nmax_count = 2\nmax_mib = 1024\n")
            .unwrap();
        assert!(c.templates.enabled);
        assert_eq!(c.templates.dir, PathBuf::from("/srv/templates"));
        assert_eq!((c.templates.max_count, c.templates.max_mib), (2, 1024));
        for bad in [
            "[templates]\ndir = \"/run/vmlet/templates\"\n",
            "[templates]\ndir = \"templates\"\n",
            "[templates]\nmax_count = 0\n",
            "[templates]\nmax_mib = 0\n",
            "[templates]\nenable = true\n",
            "vsock = \"vhost\"\n[templates]\nenabled = true\n",
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("templates") || err.contains("enable"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn paths_on_qemus_command_line_take_no_comma() {
        for (bad, key) in [
            ("state_dir = \"/run/vm,let\"\n", "state_dir"),
            ("[guest]\nkernel = \"/boot/vm,linux\"\n", "guest.kernel"),
            ("[guest]\ninitrd = \"/boot/init,rd\"\n", "guest.initrd"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("comma"), "{bad}: {err}");
        }
    }

    #[test]
    fn allowlist_entries_must_be_known() {
        let c = parse("[annotations]\nallowed = [\"vmlet.io/kernel-params\"]\n").unwrap();
        assert_eq!(c.annotations.allowed, ["vmlet.io/kernel-params"]);
        let err = parse("[annotations]\nallowed = [\"vmlet.io/kernel-param\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("annotations.allowed"), "{err}");
        assert!(err.contains("vmlet.io/kernel-param"), "{err}");
    }

    #[test]
    fn bad_value_type_names_key_and_line() {
        let err = parse("accel = \"tcg\"\n[guest]\nvcpus = \"two\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("vcpus"), "{err}");
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn missing_file_named_by_path_is_an_error() {
        let err = NodeConfig::load_from(Path::new("/nonexistent/vmlet.toml")).unwrap_err();
        assert!(matches!(err, Error::ReadConfig { .. }));
    }
}
