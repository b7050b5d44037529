//! A VM image's filesystem volumes (docs/vm-mode.md, "Volumes"): the container's binds
//! (Kubernetes configMap, secret, downwardAPI, projected, emptyDir and PVC volumes) reach the
//! guest through one virtio-fs share, and the seed mounts each at its mount path as the
//! guest boots; a memory emptyDir is a tmpfs of the guest's.
//!
//! The shim binds each volume into the pod's share (`share/<container>/mounts/<n>`, with
//! the agent path's rules: [`crate::host::share`]) whatever the guest; for a VM image the
//! virtiofsd exports that container's `mounts/` only, so the guest sees its volumes and
//! not the image's root file system. A read-only volume is read-only on the host side: the
//! guest's remount only tells its own programs.
//!
//! The runtime's own binds (`/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf`, and
//! everything under `/dev`, `/proc` and `/sys`, such as the pod's `/dev/shm` and
//! `/dev/termination-log`) stay out: the seed gives the guest its name and DNS, and those
//! are the guest kernel's.

use std::fmt::Write as _;

use vmlet_protocol::agent::Mount;

use crate::spec::HostBind;

/// The share's virtio-fs tag.
pub const TAG: &str = "vmlet-volumes";
/// Where the guest mounts the share.
pub const GUEST_DIR: &str = "/run/vmlet/volumes";
/// Where the guest mounts its memory volumes' tmpfs.
const MEMORY_DIR: &str = "/run/vmlet/memory";
/// Mount paths that stay the guest's own.
const RUNTIME_FILES: [&str; 3] = ["/etc/hosts", "/etc/hostname", "/etc/resolv.conf"];
const KERNEL_TREES: [&str; 3] = ["/dev", "/proc", "/sys"];

/// One volume as the guest mounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestVolume {
    pub destination: String,
    pub readonly: bool,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A bind of the share: `path` below [`GUEST_DIR`]; `file` when it is a file.
    Shared { path: String, file: bool },
    /// A memory emptyDir: a tmpfs of `size_bytes` named `name`, of which `subpath` is bound.
    Memory {
        name: String,
        size_bytes: u64,
        mode: u32,
        uid: u32,
        gid: u32,
        subpath: String,
    },
}

/// The container's volumes among `mounts` (the agent's view of its spec) and `binds` (their
/// host sources): each bind of the share below `<container_id>/mounts/`, and each memory
/// emptyDir, in the spec's order.
pub fn from_mounts(container_id: &str, mounts: &[Mount], binds: &[HostBind]) -> Vec<GuestVolume> {
    let prefix = format!("{container_id}/mounts/");
    mounts
        .iter()
        .filter(|m| m.type_ == "bind" && !is_runtimes(&m.destination))
        .filter_map(|m| {
            let readonly = crate::spec::is_readonly(&m.options);
            let source = if let Some(v) = m.pod_volume.as_ref() {
                VolumeSource::Memory {
                    name: v.name.clone(),
                    size_bytes: v.size_bytes,
                    mode: v.mode,
                    uid: v.uid,
                    gid: v.gid,
                    subpath: m.source.clone(),
                }
            } else {
                let path = m.source.strip_prefix(&prefix)?.to_owned();
                let bind = binds.iter().find(|b| b.share_path == m.source)?;
                VolumeSource::Shared {
                    path,
                    file: !bind.source.is_dir(),
                }
            };
            Some(GuestVolume {
                destination: m.destination.clone(),
                readonly,
                source,
            })
        })
        .collect()
}

/// Of the container's `binds`, those [`from_mounts`] takes: the share holds nothing else.
pub fn guest_binds(mounts: &[Mount], binds: Vec<HostBind>) -> Vec<HostBind> {
    binds
        .into_iter()
        .filter(|b| {
            mounts
                .iter()
                .find(|m| m.type_ == "bind" && m.pod_volume.is_none() && m.source == b.share_path)
                .is_some_and(|m| !is_runtimes(&m.destination))
        })
        .collect()
}

fn is_runtimes(destination: &str) -> bool {
    let path = destination.trim_end_matches('/');
    RUNTIME_FILES.contains(&path)
        || KERNEL_TREES
            .iter()
            .any(|t| path == *t || path.starts_with(&format!("{t}/")))
}

/// Whether any of `volumes` comes through the share (the VM then needs its virtiofsd).
pub fn any_shared(volumes: &[GuestVolume]) -> bool {
    volumes
        .iter()
        .any(|v| matches!(v.source, VolumeSource::Shared { .. }))
}

/// The shell script that mounts `volumes` in the guest (run by cloud-init's `bootcmd` at
/// every boot, as root); none without volumes. It stops at the first failure, which
/// cloud-init logs to the console.
pub fn mount_script(volumes: &[GuestVolume]) -> Option<String> {
    if volumes.is_empty() {
        return None;
    }
    let mut script = String::from("set -e\n");
    if any_shared(volumes) {
        let _ = writeln!(
            script,
            "mkdir -p {GUEST_DIR}\nmount -t virtiofs {TAG} {GUEST_DIR}"
        );
    }
    for volume in volumes {
        let destination = quote(&volume.destination);
        let (source, file) = match &volume.source {
            VolumeSource::Shared { path, file } => (quote(&format!("{GUEST_DIR}/{path}")), *file),
            VolumeSource::Memory {
                name,
                size_bytes,
                mode,
                uid,
                gid,
                subpath,
            } => {
                let dir = quote(&format!("{MEMORY_DIR}/{name}"));
                let _ = writeln!(
                    script,
                    "if [ ! -d {dir} ]; then mkdir -p {dir} && mount -t tmpfs -o size={size_bytes},mode={mode:o},uid={uid},gid={gid} tmpfs {dir}; fi"
                );
                let source = quote(&format!("{MEMORY_DIR}/{name}/{subpath}"));
                let _ = writeln!(script, "mkdir -p {source}");
                (source, false)
            }
        };
        if file {
            let _ = writeln!(
                script,
                "mkdir -p \"$(dirname {destination})\"\n[ -e {destination} ] || : > {destination}"
            );
        } else {
            let _ = writeln!(script, "mkdir -p {destination}");
        }
        let _ = writeln!(script, "mount --bind {source} {destination}");
        if volume.readonly {
            let _ = writeln!(script, "mount -o remount,bind,ro {destination}");
        }
    }
    Some(script)
}

/// `text` as one shell word.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmlet_protocol::agent::PodVolume;

    fn bind(destination: &str, source: &str, options: &[&str]) -> Mount {
        Mount {
            destination: destination.into(),
            type_: "bind".into(),
            source: source.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_containers_volumes_reach_the_guest_and_the_runtimes_files_do_not() {
        let dir = std::env::temp_dir();
        let file = std::env::current_exe().unwrap();
        let host = |n: usize, source: &std::path::Path| HostBind {
            source: source.to_owned(),
            share_path: format!("c1/mounts/{n}"),
            readonly: false,
        };
        let mut memory = bind("/cache", "sub", &["rbind"]);
        memory.pod_volume = Some(PodVolume {
            name: "cache".into(),
            size_bytes: 1 << 20,
            mode: 0o777,
            ..Default::default()
        })
        .into();
        let mounts = [
            bind("/etc/hosts", "c1/mounts/0", &["rbind", "rw"]),
            bind("/etc/config", "c1/mounts/1", &["rbind", "ro"]),
            bind("/dev/termination-log", "c1/mounts/2", &["rbind"]),
            bind("/data/key", "c1/mounts/3", &["rbind", "rw"]),
            Mount {
                destination: "/proc".into(),
                type_: "proc".into(),
                ..Default::default()
            },
            memory,
        ];
        let binds = [
            host(0, &file),
            host(1, &dir),
            host(2, &file),
            host(3, &file),
        ];
        let shared: Vec<_> = guest_binds(&mounts, binds.to_vec())
            .into_iter()
            .map(|b| b.share_path)
            .collect();
        assert_eq!(
            shared,
            ["c1/mounts/1", "c1/mounts/3"],
            "the share holds the volumes only"
        );
        let volumes = from_mounts("c1", &mounts, &binds);
        assert_eq!(
            volumes[..2],
            [
                GuestVolume {
                    destination: "/etc/config".into(),
                    readonly: true,
                    source: VolumeSource::Shared {
                        path: "1".into(),
                        file: false
                    },
                },
                GuestVolume {
                    destination: "/data/key".into(),
                    readonly: false,
                    source: VolumeSource::Shared {
                        path: "3".into(),
                        file: true
                    },
                },
            ]
        );
        assert!(matches!(&volumes[2].source, VolumeSource::Memory { name, .. } if name == "cache"));
        assert_eq!(volumes.len(), 3);
    }

    #[test]
    fn the_script_mounts_each_volume_with_every_path_quoted() {
        let volumes = [
            GuestVolume {
                destination: "/etc/it's here".into(),
                readonly: true,
                source: VolumeSource::Shared {
                    path: "0".into(),
                    file: false,
                },
            },
            GuestVolume {
                destination: "/cache".into(),
                readonly: false,
                source: VolumeSource::Memory {
                    name: "cache".into(),
                    size_bytes: 4096,
                    mode: 0o1777,
                    uid: 0,
                    gid: 2000,
                    subpath: String::new(),
                },
            },
        ];
        let script = mount_script(&volumes).unwrap();
        assert_eq!(
            script,
            "set -e\n\
             mkdir -p /run/vmlet/volumes\n\
             mount -t virtiofs vmlet-volumes /run/vmlet/volumes\n\
             mkdir -p '/etc/it'\\''s here'\n\
             mount --bind '/run/vmlet/volumes/0' '/etc/it'\\''s here'\n\
             mount -o remount,bind,ro '/etc/it'\\''s here'\n\
             if [ ! -d '/run/vmlet/memory/cache' ]; then mkdir -p '/run/vmlet/memory/cache' && mount -t tmpfs -o size=4096,mode=1777,uid=0,gid=2000 tmpfs '/run/vmlet/memory/cache'; fi\n\
             mkdir -p '/run/vmlet/memory/cache/'\n\
             mkdir -p '/cache'\n\
             mount --bind '/run/vmlet/memory/cache/' '/cache'\n"
        );
        assert_eq!(mount_script(&[]), None);
    }
}
