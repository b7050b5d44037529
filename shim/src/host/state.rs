//! What a pod created, persisted before each resource is created, so that `shim delete`
//! (containerd's cleanup after a shim died) can remove everything from the file alone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// File name inside the pod's state directory.
pub const STATE_FILE: &str = "state.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    /// The pod's state directory (removed last).
    pub dir: PathBuf,
    /// libvirt domain name, once defining it was attempted.
    pub domain: Option<String>,
    /// PID of the pod's `vhost-device-vsock`, if one was started.
    pub vsock_pid: Option<u32>,
    /// Mount points created, in creation order.
    pub mounts: Vec<PathBuf>,
    /// The pod network namespace whose interfaces were wired to taps.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// What was wired there (removed again by teardown).
    #[serde(default)]
    pub wirings: Vec<vmlet_netns::Wiring>,
    /// PID of the pod's host process (see `netns_holder`), when its spec has OCI hooks.
    #[serde(default)]
    pub holder_pid: Option<u32>,
    /// PID of the shim serving the pod: `shim delete` stops it if it still runs (containerd
    /// took it for dead, so nothing would ever talk to it again).
    #[serde(default)]
    pub shim_pid: Option<u32>,
    /// The id that shim was started with, when it is not this directory's name: a VM-mode
    /// pod's VM is its container's, served by the shim of the pod's sandbox.
    #[serde(default)]
    pub shim_id: Option<String>,
    /// The pod's host cgroup (below each hierarchy's root), once it was made.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// A VM image's directory under the node's `vm_images.disk_dir` (its root disk), once
    /// making it was attempted.
    #[serde(default)]
    pub disk_dir: Option<PathBuf>,
}

impl PodState {
    pub fn save(&self) -> Result<(), Error> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Internal(e.to_string()))?;
        let tmp = self.dir.join(".state.json.tmp");
        std::fs::write(&tmp, json).map_err(|e| Error::io("write pod state", e))?;
        std::fs::rename(&tmp, self.dir.join(STATE_FILE)).map_err(|e| Error::io("save pod state", e))
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
        let dir = std::env::temp_dir().join(format!("vmlet-state-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = PodState {
            dir: dir.clone(),
            domain: Some("vmlet-x".into()),
            vsock_pid: Some(42),
            mounts: vec![dir.join("share/c/rootfs")],
            netns: None,
            wirings: vec![],
            holder_pid: Some(43),
            shim_pid: Some(44),
            shim_id: Some("p".into()),
            cgroup: Some(PathBuf::from("/kubepods/pod1/p")),
            disk_dir: Some(PathBuf::from("/var/lib/vmlet/disks/p")),
        };
        state.save().unwrap();
        assert_eq!(PodState::load(&dir).unwrap(), state);
        std::fs::remove_dir_all(&dir).unwrap();
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
