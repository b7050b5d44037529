//! The undo journal: each thing a pod makes on the node is an entry ([`Made`]), recorded in
//! the pod's state (and saved) before it is made, and undone here. The teardown
//! ([`crate::host::reclaim::teardown`]) ends the VM first (its domain or its QEMU: everything else
//! serves it, including a container's mounts made after the boot), then undoes the rest of
//! the journal in reverse, so what was made last goes first. A new kind of resource is a
//! variant and its arm in [`Made::undo`], nothing else.
//!
//! Who makes each entry: `vm/host_setup.rs` the cgroup, the log tmpfs and the share's mounts
//! and the host process; `vm/net.rs` the network; `vm/vsock_backend.rs` the vsock backend;
//! `vm/boot.rs` a VM image's disk bind and disk directory; `vm/launch.rs` the domain, or
//! (`vm/direct_start.rs`) QEMU and virtiofsd;
//! `vm/agent_vm.rs` each later container's mounts (and, as the container goes, their undo).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::{pidfd, share};
use crate::vmm::VmManager;
use crate::Error;

/// One thing a pod made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Made {
    /// The pod's host cgroup (below each hierarchy's root): removed.
    Cgroup(PathBuf),
    /// A mount point in the pod's directory: detached (only beneath the directory).
    Mount(PathBuf),
    /// The pod's host process (see `netns_holder`): stopped.
    HostProcess(u32),
    /// The pod network namespace's interfaces wired to taps (`wirings`, once wired): the
    /// taps removed and the interfaces given back, unless the namespace is gone.
    Network {
        netns: PathBuf,
        wirings: Vec<vmlet_netns::Wiring>,
    },
    /// A `vhost-device-vsock` process as vmlet recorded it before its start time was kept
    /// (now a [`Made::Process`]): killed, if that PID is still the pod's backend (held by a
    /// pidfd, then known by the pod's socket in its command line). Read from the state of a
    /// pod an earlier vmlet started, never written.
    VsockBackend(u32),
    /// A VM image's directory under the node's `vm_images.disk_dir`: removed.
    DiskDir(PathBuf),
    /// The libvirt domain: destroyed and undefined.
    Domain(String),
    /// QEMU started without libvirt ([`crate::host::qemu_process`]): killed, and awaited,
    /// if its PID is still that process. The VM, as a domain is.
    Qemu(ProcessId),
    /// A helper of the VM the shim started itself (virtiofsd, vhost-device-vsock): killed,
    /// and awaited, if its PID is still that process.
    Process(ProcessId),
    /// The pod's own uid ([`crate::host::pod_user`]), recorded first: given back last.
    PodUser(u32),
    /// The AppArmor profile of the QEMU the shim started ([`crate::host::qemu_apparmor`]),
    /// recorded before it is loaded: removed from the kernel, after QEMU.
    AppArmorProfile(String),
}

/// A process, told from any later one that takes its PID by its start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: u32,
    /// Clock ticks after the host's boot (`/proc/PID/stat`'s 22nd field).
    pub start_time: u64,
    /// What it is, for messages (`QEMU`).
    pub what: String,
}

/// How long an undone process may take to end once killed (QEMU frees the guest's memory).
const PROCESS_ENDS: std::time::Duration = std::time::Duration::from_secs(10);

impl ProcessId {
    /// `pid` as it runs now; `None` once it is gone.
    pub fn of(pid: u32, what: &str) -> Option<Self> {
        pidfd::start_time(pid).map(|start_time| ProcessId {
            pid,
            start_time,
            what: what.into(),
        })
    }

    /// `pid` as it runs now, when it is the calling process's child (a helper it has just
    /// started); `None` once it has ended: the shim's reaper may have collected it, and its
    /// PID may be another process's by then.
    pub fn of_child(pid: u32, what: &str) -> Option<Self> {
        let pidfd = pidfd::open_if_running(pid).ok()??;
        if pidfd::parent(pid) != Some(std::process::id()) {
            return None;
        }
        let process = Self::of(pid, what)?;
        // Not reaped after its start time was read: the start time was its.
        pidfd::not_reaped(&pidfd).then_some(process)
    }

    /// Whether the process still runs (its PID is not another's since).
    pub fn runs(&self) -> bool {
        pidfd::start_time(self.pid) == Some(self.start_time)
    }

    /// Kills the process if it still runs, and waits for its end. A PID that another
    /// process took since is left alone: the pidfd is opened first and the start time read
    /// after, so the signal reaches the process whose start time matched.
    pub fn kill(&self) -> Result<(), Error> {
        let Some(pidfd) = pidfd::open_if_running(self.pid)? else {
            return Ok(()); // gone
        };
        if pidfd::start_time(self.pid) != Some(self.start_time) {
            return Ok(()); // another process has the PID now
        }
        pidfd::signal(&pidfd, libc::SIGKILL, &self.what)?;
        if !pidfd::wait_ended(&pidfd, PROCESS_ENDS)? {
            return Err(Error::Timeout(format!(
                "{} {} did not end within {} s of SIGKILL",
                self.what,
                self.pid,
                PROCESS_ENDS.as_secs()
            )));
        }
        pidfd::reap(&pidfd);
        Ok(())
    }
}

impl Made {
    /// Undoes this entry of the pod whose state directory is `pod_dir`.
    pub fn undo(&self, vmm: &dyn VmManager, pod_dir: &Path) -> Result<(), Error> {
        match self {
            Made::Domain(name) => vmm.remove(name),
            Made::Qemu(process) | Made::Process(process) => process.kill(),
            Made::VsockBackend(pid) => {
                crate::host::vhost_device_vsock::kill_if_serving(*pid, pod_dir)
            }
            // After the domain, which QEMU wrote it for. Were that left running (its removal
            // failed), the disk's space comes back when `vmletctl gc` removes the marked
            // domain; the name goes now, with the state that records it.
            Made::DiskDir(dir) => crate::vm_mode::disk_dir::remove(dir),
            Made::Network { netns, wirings } => {
                let pod_id = pod_dir.file_name().unwrap_or_default().to_string_lossy();
                match vmlet_netns::unwire(netns, &pod_id, wirings) {
                    // The namespace is gone (CNI DEL ran first): so is everything in it.
                    Err(vmlet_netns::Error::Enter { .. }) => Ok(()),
                    other => other.map_err(Error::Network),
                }
            }
            Made::HostProcess(pid) => {
                crate::host::netns_holder::stop(*pid);
                Ok(())
            }
            Made::Mount(target) => share::unmount_recorded(pod_dir, std::slice::from_ref(target)),
            Made::Cgroup(path) => {
                crate::host::pod_cgroup::PodCgroup { path: path.clone() }.remove()
            }
            Made::PodUser(uid) => crate::host::pod_user::release(pod_dir, *uid),
            Made::AppArmorProfile(name) => crate::host::qemu_apparmor::unload(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_saved_by_kind() {
        let made = vec![
            Made::Cgroup("/kubepods/pod1/p".into()),
            Made::Mount("/run/vmlet/p/log".into()),
            Made::HostProcess(43),
            Made::Network {
                netns: "/var/run/netns/p".into(),
                wirings: vec![],
            },
            Made::Domain("vmlet-p".into()),
        ];
        let json = serde_json::to_string(&made).unwrap();
        assert_eq!(
            json,
            r#"[{"cgroup":"/kubepods/pod1/p"},{"mount":"/run/vmlet/p/log"},{"host_process":43},{"network":{"netns":"/var/run/netns/p","wirings":[]}},{"domain":"vmlet-p"}]"#
        );
        assert_eq!(serde_json::from_str::<Vec<Made>>(&json).unwrap(), made);
    }

    #[test]
    fn a_pid_that_is_not_a_vsock_backend_is_not_killed() {
        // The test itself: its command line names no vhost-device-vsock.
        Made::VsockBackend(std::process::id())
            .undo(&crate::vmm::FakeVmm::default(), Path::new("/run/vmlet/p"))
            .unwrap();
    }

    #[test]
    fn a_recorded_process_is_killed_and_awaited_and_a_pid_taken_since_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let recorded = ProcessId::of(child.id(), "sleep").unwrap();
        let json = serde_json::to_string(&Made::Qemu(recorded.clone())).unwrap();
        assert!(json.starts_with(r#"{"qemu":{"pid":"#), "{json}");
        // Another process that took the PID: another start time.
        let other = ProcessId {
            start_time: recorded.start_time + 1,
            ..recorded.clone()
        };
        let fake = crate::vmm::FakeVmm::default();
        Made::Qemu(other)
            .undo(&fake, Path::new("/nonexistent"))
            .unwrap();
        assert!(child.try_wait().unwrap().is_none(), "left alone");
        Made::Qemu(recorded.clone())
            .undo(&fake, Path::new("/nonexistent"))
            .unwrap();
        assert!(
            ProcessId::of(child.id(), "sleep").is_none(),
            "killed and reaped"
        );
        assert!(child.try_wait().is_err(), "collected by the undo");
        // Gone already: nothing to do.
        Made::Qemu(recorded)
            .undo(&fake, Path::new("/nonexistent"))
            .unwrap();
    }

    #[test]
    fn a_mount_outside_the_pods_directory_is_refused() {
        let err = Made::Mount("/etc".into())
            .undo(&crate::vmm::FakeVmm::default(), Path::new("/run/vmlet/p"))
            .unwrap_err();
        assert!(err.message().contains("not unmounting /etc"), "{err:?}");
    }
}
