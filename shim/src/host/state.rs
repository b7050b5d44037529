//! What a pod created, persisted before each resource is created, so that `shim delete`
//! (containerd's cleanup after a shim died) can remove everything from the file alone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::pod_lock::HeldLock;
use crate::host::undo::Made;
use crate::Error;

/// File name inside the pod's state directory.
pub const STATE_FILE: &str = "state.json";
/// The state file's layout this version writes (files without one are of the versions
/// before it, read as [`StateFile`] says). A file of a newer version is refused by name: an
/// older shim or `vmletctl` could not know what it lists, and would leave that behind.
pub const STATE_VERSION: u32 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StateFile", into = "StateFile")]
pub struct PodState {
    /// The pod's state directory (removed last).
    pub dir: PathBuf,
    /// PID of the shim serving the pod: `shim delete` stops it if it still runs (containerd
    /// took it for dead, so nothing would ever talk to it again).
    pub shim_pid: Option<u32>,
    /// The id that shim was started with, when it is not this directory's name: a VM-mode
    /// pod's VM is its container's, served by the shim of the pod's sandbox.
    pub shim_id: Option<String>,
    /// What the pod made, in the order it made it ([`Made`]: the undo journal).
    pub made: Vec<Made>,
    /// The pod's lock ([`crate::host::pod_lock`]), while this process holds it.
    pub lock: HeldLock,
}

/// The state file: [`PodState`]'s journal, and beside it the record an earlier version of
/// vmlet kept (a field per kind of resource), so that its `shim delete` and `vmletctl gc`
/// still find everything of a pod should a node go back to it. Read, a file without a
/// journal (an earlier version's) becomes one in the order that version undid it.
#[derive(Serialize, Deserialize)]
struct StateFile {
    #[serde(default)]
    version: u32,
    dir: PathBuf,
    #[serde(default)]
    shim_pid: Option<u32>,
    #[serde(default)]
    shim_id: Option<String>,
    #[serde(default)]
    made: Option<Vec<Made>>,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    vsock_pid: Option<u32>,
    #[serde(default)]
    mounts: Vec<PathBuf>,
    #[serde(default)]
    netns: Option<PathBuf>,
    #[serde(default)]
    wirings: Vec<vmlet_netns::Wiring>,
    #[serde(default)]
    holder_pid: Option<u32>,
    #[serde(default)]
    cgroup: Option<PathBuf>,
    #[serde(default)]
    disk_dir: Option<PathBuf>,
}

impl TryFrom<StateFile> for PodState {
    type Error = String;

    fn try_from(f: StateFile) -> Result<Self, String> {
        if f.version > STATE_VERSION {
            return Err(format!(
                "a state file of version {}, newer than this vmlet's ({STATE_VERSION}): use \
                 the vmlet that wrote it",
                f.version
            ));
        }
        if let Some(made) = f.made {
            return Ok(PodState {
                dir: f.dir,
                shim_pid: f.shim_pid,
                shim_id: f.shim_id,
                made,
                lock: HeldLock::default(),
            });
        }
        // Undone last first: the domain, the network, the host process, the vsock backend,
        // the disk directory, the mounts (the last made first), the cgroup.
        let mut made: Vec<Made> = f.cgroup.into_iter().map(Made::Cgroup).collect();
        made.extend(f.mounts.into_iter().map(Made::Mount));
        made.extend(f.disk_dir.map(Made::DiskDir));
        made.extend(f.vsock_pid.map(Made::VsockBackend));
        made.extend(f.holder_pid.map(Made::HostProcess));
        made.extend(f.netns.map(|netns| Made::Network {
            netns,
            wirings: f.wirings,
        }));
        made.extend(f.domain.map(Made::Domain));
        Ok(PodState {
            dir: f.dir,
            shim_pid: f.shim_pid,
            shim_id: f.shim_id,
            made,
            lock: HeldLock::default(),
        })
    }
}

impl From<PodState> for StateFile {
    fn from(s: PodState) -> Self {
        let (netns, wirings) = s
            .made
            .iter()
            .find_map(|m| match m {
                Made::Network { netns, wirings } => Some((Some(netns.clone()), wirings.clone())),
                _ => None,
            })
            .unwrap_or_default();
        StateFile {
            version: STATE_VERSION,
            domain: s.domain().map(str::to_owned),
            vsock_pid: s.made.iter().find_map(|m| match m {
                Made::VsockBackend(pid) => Some(*pid),
                Made::Process(p) if p.what == crate::host::vhost_device_vsock::NAME => Some(p.pid),
                _ => None,
            }),
            mounts: s
                .made
                .iter()
                .filter_map(|m| match m {
                    Made::Mount(target) => Some(target.clone()),
                    _ => None,
                })
                .collect(),
            netns,
            wirings,
            holder_pid: s.holder_pid(),
            cgroup: s.cgroup().map(Path::to_owned),
            disk_dir: s.made.iter().find_map(|m| match m {
                Made::DiskDir(dir) => Some(dir.clone()),
                _ => None,
            }),
            dir: s.dir,
            shim_pid: s.shim_pid,
            shim_id: s.shim_id,
            made: Some(s.made),
        }
    }
}

impl PodState {
    pub fn save(&self) -> Result<(), Error> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Internal(e.to_string()))?;
        let tmp = self.dir.join(".state.json.tmp");
        std::fs::write(&tmp, json).map_err(|e| Error::io("write pod state", e))?;
        std::fs::rename(&tmp, self.dir.join(STATE_FILE)).map_err(|e| Error::io("save pod state", e))
    }

    /// Records `made` in the journal (the caller saves).
    pub fn record(&mut self, made: Made) {
        self.made.push(made);
    }

    /// The libvirt domain, once starting it was attempted.
    pub fn domain(&self) -> Option<&str> {
        self.made.iter().find_map(|m| match m {
            Made::Domain(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// QEMU started without libvirt, once it was.
    pub fn qemu(&self) -> Option<&crate::host::undo::ProcessId> {
        self.made.iter().find_map(|m| match m {
            Made::Qemu(process) => Some(process),
            _ => None,
        })
    }

    /// The pod's host process, when one was started.
    pub fn holder_pid(&self) -> Option<u32> {
        self.made.iter().find_map(|m| match m {
            Made::HostProcess(pid) => Some(*pid),
            _ => None,
        })
    }

    /// The pod's host cgroup, once making it was attempted.
    pub fn cgroup(&self) -> Option<&Path> {
        self.made.iter().find_map(|m| match m {
            Made::Cgroup(path) => Some(path.as_path()),
            _ => None,
        })
    }

    /// Records what was wired in `netns`, whose wiring the journal must have.
    pub fn wired(&mut self, netns: &Path, wired: Vec<vmlet_netns::Wiring>) -> Result<(), Error> {
        for made in &mut self.made {
            if let Made::Network { netns: n, wirings } = made {
                if n == netns {
                    *wirings = wired;
                    return Ok(());
                }
            }
        }
        Err(Error::Internal(format!(
            "the wiring of {} was not recorded before it was made",
            netns.display()
        )))
    }

    /// Takes the mounts at or below `dir` out of the journal (a container that goes takes
    /// its own), in the order they were made.
    pub fn take_mounts_below(&mut self, dir: &Path) -> Vec<PathBuf> {
        let mut taken = Vec::new();
        self.made.retain(|m| match m {
            Made::Mount(target) if target.starts_with(dir) => {
                taken.push(target.clone());
                false
            }
            _ => true,
        });
        taken
    }

    /// The id of the shim that serves this pod: [`PodState::shim_id`], else the
    /// directory's name.
    pub fn shim_id(&self) -> String {
        self.shim_id.clone().unwrap_or_else(|| {
            self.dir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
    }

    pub fn load(dir: &Path) -> Result<Self, Error> {
        let text = std::fs::read(dir.join(STATE_FILE))
            .map_err(|e| Error::io(format!("read {}", dir.join(STATE_FILE).display()), e))?;
        serde_json::from_slice(&text).map_err(|e| Error::Internal(format!("parse pod state: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().to_owned();
        let state = PodState {
            dir: dir.clone(),
            shim_pid: Some(44),
            shim_id: Some("p".into()),
            lock: HeldLock::default(),
            made: vec![
                Made::Cgroup("/kubepods/pod1/p".into()),
                Made::Mount(dir.join("share/c/rootfs")),
                Made::HostProcess(43),
                Made::VsockBackend(42),
                Made::DiskDir("/var/lib/vmlet/disks/p".into()),
                Made::Domain("vmlet-x".into()),
            ],
        };
        state.save().unwrap();
        assert_eq!(PodState::load(&dir).unwrap(), state);
        assert_eq!(state.domain(), Some("vmlet-x"));
        assert_eq!(state.holder_pid(), Some(43));
        assert_eq!(state.cgroup(), Some(Path::new("/kubepods/pod1/p")));
    }

    #[test]
    fn the_file_carries_its_version_and_a_newer_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let state = PodState {
            dir: dir.path().to_owned(),
            ..Default::default()
        };
        state.save().unwrap();
        let text = std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["version"], STATE_VERSION);
        json["version"] = (STATE_VERSION + 1).into();
        std::fs::write(dir.path().join(STATE_FILE), json.to_string()).unwrap();
        let err = PodState::load(dir.path()).unwrap_err().message();
        assert!(err.contains("newer than this vmlet's"), "{err}");
    }

    #[test]
    fn an_earlier_versions_record_is_a_journal_undone_in_that_versions_order() {
        let old = r#"{"dir": "/run/vmlet/p", "domain": "vmlet-p", "vsock_pid": 42,
            "mounts": ["/run/vmlet/p/log", "/run/vmlet/p/share"], "netns": "/var/run/netns/p",
            "wirings": [], "holder_pid": 43, "shim_pid": 44, "cgroup": "/kubepods/p",
            "disk_dir": "/var/lib/vmlet/disks/p"}"#;
        let state: PodState = serde_json::from_str(old).unwrap();
        assert_eq!(state.shim_pid, Some(44));
        let undone: Vec<Made> = state.made.into_iter().rev().collect();
        assert_eq!(
            undone,
            [
                Made::Domain("vmlet-p".into()),
                Made::Network {
                    netns: "/var/run/netns/p".into(),
                    wirings: vec![]
                },
                Made::HostProcess(43),
                Made::VsockBackend(42),
                Made::DiskDir("/var/lib/vmlet/disks/p".into()),
                Made::Mount("/run/vmlet/p/share".into()),
                Made::Mount("/run/vmlet/p/log".into()),
                Made::Cgroup("/kubepods/p".into()),
            ]
        );
        // What `vmletctl gc`'s test plants: a directory and a dead shim.
        let bare: PodState =
            serde_json::from_str(r#"{"dir": "/run/vmlet/q", "mounts": [], "shim_pid": 7}"#)
                .unwrap();
        assert_eq!((bare.shim_pid, bare.made.len()), (Some(7), 0));
    }

    #[test]
    fn an_earlier_version_reads_what_it_needs_from_a_journal() {
        // The record as the version before the journal read it (`mounts` required).
        #[derive(Deserialize)]
        struct Earlier {
            domain: Option<String>,
            vsock_pid: Option<u32>,
            mounts: Vec<PathBuf>,
            netns: Option<PathBuf>,
            holder_pid: Option<u32>,
            cgroup: Option<PathBuf>,
            disk_dir: Option<PathBuf>,
            shim_pid: Option<u32>,
        }
        let state = PodState {
            dir: "/run/vmlet/p".into(),
            shim_pid: Some(44),
            shim_id: None,
            lock: HeldLock::default(),
            made: vec![
                Made::Cgroup("/kubepods/p".into()),
                Made::Mount("/run/vmlet/p/log".into()),
                Made::HostProcess(43),
                Made::Network {
                    netns: "/var/run/netns/p".into(),
                    wirings: vec![],
                },
                // The vsock backend as vmlet records it now: by its start time too.
                Made::Process(crate::host::undo::ProcessId {
                    pid: 42,
                    start_time: 7,
                    what: crate::host::vhost_device_vsock::NAME.into(),
                }),
                Made::DiskDir("/var/lib/vmlet/disks/p".into()),
                Made::Domain("vmlet-p".into()),
                Made::Mount("/run/vmlet/p/mounts/c2/rootfs".into()),
            ],
        };
        let json = serde_json::to_string(&state).unwrap();
        let earlier: Earlier = serde_json::from_str(&json).unwrap();
        assert_eq!(earlier.domain.as_deref(), Some("vmlet-p"));
        assert_eq!(
            (earlier.vsock_pid, earlier.holder_pid, earlier.shim_pid),
            (Some(42), Some(43), Some(44))
        );
        assert_eq!(
            earlier.mounts,
            [
                PathBuf::from("/run/vmlet/p/log"),
                "/run/vmlet/p/mounts/c2/rootfs".into()
            ]
        );
        assert_eq!(
            earlier.netns.as_deref(),
            Some(Path::new("/var/run/netns/p"))
        );
        assert_eq!(earlier.cgroup.as_deref(), Some(Path::new("/kubepods/p")));
        assert!(earlier.disk_dir.is_some());
        // Read back, the journal is the one written, not one made from those fields.
        assert_eq!(serde_json::from_str::<PodState>(&json).unwrap(), state);
    }

    #[test]
    fn a_containers_mounts_leave_the_journal_with_it() {
        let mut state = PodState::default();
        for m in [
            "/p/log",
            "/p/mounts/c1/rootfs",
            "/p/mounts/c2/rootfs",
            "/p/mounts/c1/b",
        ] {
            state.record(Made::Mount(m.into()));
        }
        state.record(Made::Network {
            netns: "/n".into(),
            wirings: vec![],
        });
        let taken = state.take_mounts_below(Path::new("/p/mounts/c1"));
        assert_eq!(
            taken,
            [
                PathBuf::from("/p/mounts/c1/rootfs"),
                "/p/mounts/c1/b".into()
            ]
        );
        assert_eq!(state.made.len(), 3);
        state.wired(Path::new("/n"), vec![]).unwrap();
        let err = state.wired(Path::new("/elsewhere"), vec![]).unwrap_err();
        assert!(err.message().contains("/elsewhere"), "{err:?}");
        assert_eq!(state.made.len(), 3);
    }

    #[test]
    fn a_pod_is_served_by_the_shim_of_its_own_name_unless_it_says_otherwise() {
        let own = PodState {
            dir: PathBuf::from("/run/vmlet/p1"),
            ..Default::default()
        };
        assert_eq!(own.shim_id(), "p1");
        // A VM-mode pod's container's VM: the sandbox's shim serves it.
        let container = PodState {
            dir: PathBuf::from("/run/vmlet/c1"),
            shim_id: Some("p1".into()),
            ..Default::default()
        };
        assert_eq!(container.shim_id(), "p1");
    }
}
