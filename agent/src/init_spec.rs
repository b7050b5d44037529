//! What the agent hands to a container's init or an exec process (as JSON on fd 3), and the
//! parsing of mount options into flags and data.

use nix::mount::MsFlags;
use serde::{Deserialize, Serialize};

/// One guest-local mount inside the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    pub destination: String,
    pub fstype: String,
    pub source: String,
    pub options: Vec<String>,
    /// A bind's `source` is a path resolved beneath this directory (never out of it), made
    /// a directory where missing: a subPath of a pod volume.
    #[serde(default)]
    pub source_beneath: Option<String>,
}

/// One rlimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitSpec {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// The process to become: identity, limits, program. Already validated by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSpec {
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
    pub rlimits: Vec<RlimitSpec>,
    /// stdio is a terminal, which becomes the controlling terminal.
    pub terminal: bool,
    /// The capability sets to end with (none: keep all, as runc does without them).
    #[serde(default)]
    pub capabilities: Option<CapabilitySpec>,
    #[serde(default)]
    pub no_new_privileges: bool,
    /// The seccomp filter to install last (none: no filter).
    #[serde(default)]
    pub seccomp: Option<SeccompSpec>,
}

/// A compiled seccomp filter: `struct sock_filter` bytes and `seccomp(2)` flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompSpec {
    pub program: Vec<u8>,
    pub flags: u32,
}

/// Capability sets, as capability numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilitySpec {
    pub bounding: Vec<u32>,
    pub effective: Vec<u32>,
    pub permitted: Vec<u32>,
    pub inheritable: Vec<u32>,
    pub ambient: Vec<u32>,
}

/// Everything the container init needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitSpec {
    /// Absolute guest path of the rootfs.
    pub rootfs: String,
    pub readonly_rootfs: bool,
    pub hostname: String,
    pub mounts: Vec<MountSpec>,
    pub process: ProcessSpec,
    /// Namespaces ("ipc", "uts", "pid") to join instead of the new ones, and whose: the guest PID
    /// of the pod sandbox's init.
    #[serde(default)]
    pub join_namespaces: Vec<String>,
    #[serde(default)]
    pub join_pid: i32,
    /// Block device nodes to make in the container (hot-plugged disks).
    #[serde(default)]
    pub devices: Vec<DeviceNode>,
    /// Paths hidden in the container (maskedPaths) and made read-only (readonlyPaths).
    #[serde(default)]
    pub masked_paths: Vec<String>,
    #[serde(default)]
    pub readonly_paths: Vec<String>,
    /// The spec's sysctls, written under /proc/sys in the container's namespaces.
    #[serde(default)]
    pub sysctls: std::collections::BTreeMap<String, String>,
    /// A privileged container: a node for every device of the guest in its /dev.
    #[serde(default)]
    pub all_guest_devices: bool,
}

/// A block device node: where in the container, which guest disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    pub path: String,
    /// The guest's name for it (`vda`, `sdb`, `nvme0n1`), for messages.
    pub guest_name: String,
    pub major: u32,
    pub minor: u32,
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Splits mount options into mount(2) flags and the data string the file system gets.
pub fn parse_mount_options(options: &[String]) -> (MsFlags, String) {
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for option in options {
        let (set, clear) = match option.as_str() {
            // `rro` is also a bind's recursive read-only (container_init::bind_one).
            "ro" | "rro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
            "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
            "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
            "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
            "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
            "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
            "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
            "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
            "sync" => (MsFlags::MS_SYNCHRONOUS, MsFlags::empty()),
            "async" => (MsFlags::empty(), MsFlags::MS_SYNCHRONOUS),
            "dirsync" => (MsFlags::MS_DIRSYNC, MsFlags::empty()),
            "noatime" => (MsFlags::MS_NOATIME, MsFlags::empty()),
            "atime" => (MsFlags::empty(), MsFlags::MS_NOATIME),
            "nodiratime" => (MsFlags::MS_NODIRATIME, MsFlags::empty()),
            "diratime" => (MsFlags::empty(), MsFlags::MS_NODIRATIME),
            "relatime" => (MsFlags::MS_RELATIME, MsFlags::empty()),
            "norelatime" => (MsFlags::empty(), MsFlags::MS_RELATIME),
            "strictatime" => (MsFlags::MS_STRICTATIME, MsFlags::empty()),
            "nostrictatime" => (MsFlags::empty(), MsFlags::MS_STRICTATIME),
            "bind" => (MsFlags::MS_BIND, MsFlags::empty()),
            "rbind" => (MsFlags::MS_BIND | MsFlags::MS_REC, MsFlags::empty()),
            "private" | "rprivate" | "shared" | "rshared" | "slave" | "rslave" => {
                (MsFlags::empty(), MsFlags::empty())
            }
            other => {
                data.push(other.to_owned());
                (MsFlags::empty(), MsFlags::empty())
            }
        };
        flags.insert(set);
        flags.remove(clear);
    }
    (flags, data.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_and_data_are_separated() {
        let (flags, data) =
            parse_mount_options(&opts(&["nosuid", "strictatime", "mode=755", "size=65536k"]));
        assert!(flags.contains(MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME));
        assert_eq!(data, "mode=755,size=65536k");
    }

    #[test]
    fn every_option_the_shim_lists_is_applied_not_passed_as_data() {
        for option in vmlet_protocol::MOUNT_OPTIONS {
            let (_, data) = parse_mount_options(&opts(&[option]));
            assert_eq!(data, "", "{option} would reach the file system as data");
        }
        let (flags, _) = parse_mount_options(&opts(&["rbind", "rro"]));
        assert!(flags.contains(MsFlags::MS_RDONLY));
    }

    #[test]
    fn later_option_wins() {
        let (flags, _) = parse_mount_options(&opts(&["ro", "rw"]));
        assert!(!flags.contains(MsFlags::MS_RDONLY));
    }

    #[test]
    fn spec_round_trips_as_json() {
        let spec = InitSpec {
            rootfs: "/run/vmlet/share/c/rootfs".into(),
            readonly_rootfs: false,
            hostname: "h".into(),
            mounts: vec![MountSpec {
                destination: "/proc".into(),
                fstype: "proc".into(),
                source: "proc".into(),
                options: vec![],
                source_beneath: None,
            }],
            process: ProcessSpec {
                args: vec!["sh".into()],
                env: vec!["PATH=/bin".into()],
                cwd: "/".into(),
                uid: 0,
                gid: 0,
                additional_gids: vec![],
                rlimits: vec![RlimitSpec {
                    resource: 7,
                    soft: 1024,
                    hard: 1024,
                }],
                terminal: false,
                capabilities: Some(CapabilitySpec {
                    bounding: vec![0, 21],
                    effective: vec![0],
                    ..Default::default()
                }),
                no_new_privileges: true,
                seccomp: Some(SeccompSpec {
                    program: vec![6, 0, 0, 0, 0, 0, 0xff, 0x7f],
                    flags: 2,
                }),
            },
            join_namespaces: vec!["ipc".into()],
            join_pid: 7,
            devices: vec![DeviceNode {
                path: "/dev/xvda".into(),
                guest_name: "sda".into(),
                major: 8,
                minor: 0,
                file_mode: 0o660,
                uid: 0,
                gid: 6,
            }],
            masked_paths: vec!["/proc/kcore".into()],
            readonly_paths: vec!["/proc/sys".into()],
            sysctls: [("net.ipv4.ip_forward".to_owned(), "1".to_owned())].into(),
            all_guest_devices: true,
        };
        let json = serde_json::to_vec(&spec).unwrap();
        assert_eq!(serde_json::from_slice::<InitSpec>(&json).unwrap(), spec);
    }
}
