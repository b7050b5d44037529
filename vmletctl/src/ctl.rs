//! What `vmletctl` does: list the node's pods as vmlet sees them (state directories, marked
//! libvirt domains and marked taps in the named network namespaces, each with whether its
//! shim still runs), show a pod's console, and remove what a gone shim left behind (`gc`),
//! never touching a pod whose shim lives or anything without vmlet's mark.

use std::collections::BTreeMap;
use std::path::Path;

use vmlet_config::NodeConfig;
use vmlet_netns::MarkedTap;

use vmlet_shim::host::pod_lock::{self, HeldLock};
use vmlet_shim::host::pod_record::PodRecord;
use vmlet_shim::host::state::PodState;
use vmlet_shim::host::vhost_device_vsock;
use vmlet_shim::vmm::VmManager;
use vmlet_shim::Error;

/// One pod as found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub pod_id: String,
    /// The shim's PID when it still runs.
    pub shim_pid: Option<u32>,
    /// Its state directory exists.
    pub has_state: bool,
    /// Its domain: None when libvirt has none, else whether it runs.
    pub domain_active: Option<bool>,
    /// QEMU the shim started without libvirt (`launcher = "direct"`), its PID while it
    /// runs.
    pub qemu_pid: Option<u32>,
    /// Taps carrying its mark, in any of the named network namespaces.
    pub taps: Vec<MarkedTap>,
    /// PIDs of the `vhost-device-vsock` processes serving it (found by their socket in its
    /// state directory, so also when its `state.json` is lost).
    pub helpers: Vec<u32>,
    /// What its shim recorded of it for the operator (names, kind, shape, accelerator):
    /// none without one, else the record or why it could not be read.
    pub record: Option<Result<PodRecord, String>>,
}

impl PodView {
    /// Left behind: no live shim owns it.
    pub fn is_orphan(&self) -> bool {
        self.shim_pid.is_none()
    }
}

impl PodView {
    /// Its VM: `running` (a domain, or QEMU started without libvirt), `defined` (a domain
    /// that does not run), `none`.
    pub fn vm(&self) -> &'static str {
        match (self.domain_active, self.qemu_pid) {
            (Some(true), _) | (_, Some(_)) => "running",
            (Some(false), None) => "defined",
            (None, None) => "none",
        }
    }

    /// The pod as a whole: `running` (its shim and VM run), `stopped` (its shim runs, its
    /// VM was started and does not run: ended, or still starting), `no-vm` (its shim runs
    /// and no VM was started for it: a VM-mode pod's sandbox, whose VM is its container's,
    /// a pod still being set up, or one whose record cannot be read), `orphaned` (its shim
    /// is gone: `gc` removes it).
    pub fn state(&self) -> &'static str {
        match (self.shim_pid, self.vm(), self.record()) {
            (None, _, _) => "orphaned",
            (Some(_), "running", _) => "running",
            (Some(_), _, Some(_)) => "stopped",
            (Some(_), _, None) => "no-vm",
        }
    }

    /// Its record, when it has one that could be read.
    pub fn record(&self) -> Option<&PodRecord> {
        self.record.as_ref()?.as_ref().ok()
    }

    /// The pod as one JSON object (`vmletctl ps -o json`); `now` in seconds since the
    /// epoch, for its age.
    pub fn to_json(&self, now: u64) -> serde_json::Value {
        let record = self.record();
        serde_json::json!({
            "pod": self.pod_id,
            "namespace": record.map(|r| &r.names.namespace),
            "name": record.map(|r| &r.names.name),
            "kind": record.map(|r| r.kind.as_str()),
            "vcpus": record.map(|r| r.vcpus),
            "memory_mib": record.map(|r| r.memory_mib),
            "accel": record.map(|r| &r.accel),
            "started": record.map(|r| r.started),
            "age_seconds": record.map(|r| now.saturating_sub(r.started)),
            "record_error": self.record.as_ref().and_then(|r| r.as_ref().err()),
            "state": self.state(),
            "shim_pid": self.shim_pid,
            "has_state": self.has_state,
            "domain": self.vm(),
            "launcher": record.map_or(
                if self.qemu_pid.is_some() { "direct" } else { "libvirt" },
                |r| r.launcher.as_str(),
            ),
            "qemu_pid": self.qemu_pid,
            "taps": self.taps.iter().map(|t| serde_json::json!({
                "name": t.name,
                "netns": t.netns,
                "peer": t.peer,
            })).collect::<Vec<_>>(),
            "helpers": self.helpers,
        })
    }
}

/// The node's pods as Prometheus text: the figures of every pod whose shim serves them in
/// the metrics directory (`vmlet_scrape_errors` counts those that did not answer: a shim
/// killed before its teardown), and the node's counters published there. Only that
/// directory is read ([`vmlet_shim::task::metrics_dir`]), so a user of the node config's
/// `metrics_gid` alone can scrape: neither the pods' state directories, libvirt nor the
/// network namespaces are asked. The shims are asked all at once, so that a scrape takes
/// one shim's deadline however many guests are slow to answer theirs.
pub fn metrics(state_dir: &Path) -> String {
    use vmlet_shim::task::metrics_dir;
    let mut errors = 0;
    let sockets = match crate::gc_leftovers::published_sockets(state_dir) {
        Ok(sockets) => sockets,
        Err(e) => {
            log::warn!("{}: {e}", metrics_dir::path(state_dir).display());
            errors += 1;
            Vec::new()
        }
    };
    let answers: Vec<_> = std::thread::scope(|scope| {
        let asked: Vec<_> = sockets
            .iter()
            .map(|(pod_id, socket)| {
                (
                    pod_id,
                    scope.spawn(move || vmlet_shim::task::pod_metrics::fetch(socket)),
                )
            })
            .collect();
        asked
            .into_iter()
            .map(|(pod_id, asked)| {
                let answer = asked
                    .join()
                    .unwrap_or_else(|_| Err("the scrape's thread panicked".into()));
                (pod_id, answer)
            })
            .collect()
    });
    let mut figures = Vec::new();
    for (pod_id, answer) in answers {
        match answer {
            Ok(f) => figures.push(f),
            Err(e) => {
                log::warn!("pod {pod_id}: {e}");
                errors += 1;
            }
        }
    }
    let node = match vmlet_shim::task::node_counters::NodeCounters::load_published(state_dir) {
        Ok(node) => Some(node),
        Err(e) => {
            log::warn!("the node's counters: {e}");
            errors += 1;
            None
        }
    };
    vmlet_shim::task::pod_metrics::render(&figures, node.as_ref(), errors)
}

pub use vmlet_shim::host::pod_paths::check_pod_id;

/// Where `ip netns` and CNI (through containerd's CRI) keep named network namespaces.
pub const NAMED_NETNS_DIR: &str = "/run/netns";

/// Every pod with a state directory, a marked domain or a marked tap in a namespace under
/// `netns_dir`, by id.
pub fn survey(
    state_dir: &Path,
    netns_dir: &Path,
    vmm: &dyn VmManager,
) -> Result<Vec<PodView>, Error> {
    let mut pods: BTreeMap<String, PodView> = BTreeMap::new();
    let view = |id: &str| PodView {
        pod_id: id.to_owned(),
        shim_pid: None,
        has_state: false,
        domain_active: None,
        qemu_pid: None,
        taps: Vec::new(),
        helpers: Vec::new(),
        record: None,
    };
    for found in state_dirs(state_dir) {
        let id = found.pod_id;
        let pod = pods.entry(id.clone()).or_insert_with(|| view(&id));
        pod.has_state = true;
        pod.shim_pid = found.shim_pid;
        pod.qemu_pid = found.qemu_pid;
        pod.record = found.record;
    }
    for domain in vmm.vmlet_domains()? {
        let pod = pods
            .entry(domain.pod_id.clone())
            .or_insert_with(|| view(&domain.pod_id));
        pod.domain_active = Some(domain.active);
    }
    for (pid, id) in vsock_helpers(Path::new("/proc"), state_dir) {
        pods.entry(id.clone())
            .or_insert_with(|| view(&id))
            .helpers
            .push(pid);
    }
    for tap in marked_taps_under(netns_dir)? {
        pods.entry(tap.pod_id.clone())
            .or_insert_with(|| view(&tap.pod_id))
            .taps
            .push(tap);
    }
    Ok(pods.into_values().collect())
}

/// A pod state directory as found.
pub struct StateDir {
    pub pod_id: String,
    /// The shim that serves it, while it lives (a VM-mode pod's VM is served by its
    /// sandbox's shim).
    pub shim_pid: Option<u32>,
    /// QEMU the shim started without libvirt, while it runs.
    pub qemu_pid: Option<u32>,
    pub record: Option<Result<PodRecord, String>>,
}

/// Every pod state directory under `state_dir` (not the shims' own, such as the pods'
/// uid claims: their names start with a dot, which no containerd id does).
pub fn state_dirs(state_dir: &Path) -> Vec<StateDir> {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            entry.path().is_dir() && !entry.file_name().to_string_lossy().starts_with('.')
        })
        .map(|entry| {
            let state = PodState::load(&entry.path()).ok();
            let shim_pid = state.as_ref().and_then(|s| {
                s.shim_pid
                    .filter(|pid| vmlet_shim::host::reclaim::live_shim(*pid, &s.shim_id()))
            });
            let qemu_pid = state
                .as_ref()
                .and_then(|s| s.qemu().filter(|q| q.runs()).map(|q| q.pid));
            StateDir {
                pod_id: entry.file_name().to_string_lossy().into_owned(),
                shim_pid,
                qemu_pid,
                record: PodRecord::load(&entry.path()),
            }
        })
        .collect()
}

/// The `vhost-device-vsock` processes (PID, pod id) whose socket lies in a pod directory
/// under `state_dir`.
fn vsock_helpers(proc_dir: &Path, state_dir: &Path) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, vhost_device_vsock::serving_pod(&cmdline, state_dir)?))
        })
        .collect();
    found.sort();
    found
}

/// The marked taps of every namespace under `dir`. A file there that is no namespace (a
/// stale name whose mount is gone) cannot be entered and holds nothing.
fn marked_taps_under(dir: &Path) -> Result<Vec<MarkedTap>, Error> {
    let mut taps = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(taps);
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        match vmlet_netns::marked_taps(&path) {
            Ok(found) => taps.extend(found),
            Err(vmlet_netns::Error::Enter { .. }) => {}
            Err(e) => return Err(Error::Network(e)),
        }
    }
    Ok(taps)
}

/// One thing `gc` removes.
enum Removal {
    /// Everything the pod's state directory lists, as `shim delete` removes it.
    State(String),
    /// A marked domain without a state directory.
    Domain(String),
    Tap(MarkedTap),
    /// A pod's `vhost-device-vsock` (PID), stopped after checking it still serves the pod.
    Helper(u32, String),
}

impl Removal {
    fn of(pod: &PodView) -> Vec<Removal> {
        let mut all = Vec::new();
        if pod.has_state {
            all.push(Removal::State(pod.pod_id.clone()));
        } else if pod.domain_active.is_some() {
            all.push(Removal::Domain(domain_of(pod)));
        }
        all.extend(pod.taps.iter().cloned().map(Removal::Tap));
        all.extend(
            pod.helpers
                .iter()
                .map(|pid| Removal::Helper(*pid, pod.pod_id.clone())),
        );
        all
    }

    fn describe(&self, pod_id: &str) -> String {
        match self {
            Removal::State(_) => format!("pod {pod_id}: state directory and what it lists"),
            Removal::Domain(name) => format!("pod {pod_id}: domain {name}"),
            Removal::Tap(tap) => {
                format!("pod {pod_id}: tap {} in {}", tap.name, tap.netns.display())
            }
            Removal::Helper(pid, _) => format!("pod {pod_id}: vhost-device-vsock {pid}"),
        }
    }

    fn run(&self, config: &NodeConfig, vmm: &dyn VmManager, lock: &HeldLock) -> Result<(), Error> {
        match self {
            Removal::State(id) => {
                vmlet_shim::host::reclaim::cleanup_locked(config, vmm, id, lock.clone())
            }
            Removal::Domain(name) => vmm.remove(name),
            Removal::Tap(tap) => vmlet_netns::remove_marked_tap(tap).map_err(Error::Network),
            Removal::Helper(pid, pod_id) => vhost_device_vsock::kill_if_serving(
                *pid,
                &vmlet_shim::host::pod_paths::PodPaths::new(&config.state_dir, pod_id).dir,
            ),
        }
    }
}

/// Removes what orphaned pods left: everything a state directory lists (as `shim delete`
/// does), or the bare domain, and the pod's marked taps. Each pod is removed with its lock
/// held ([`vmlet_shim::host::pod_lock`]) and looked at again once it is: a pod whose lock is
/// held (being made, served or removed) is left alone, so that a pod made while `gc`
/// looked is not taken for an orphan. Returns what was (or, with `dry_run`, would be)
/// removed, one line each.
pub fn gc(
    config: &NodeConfig,
    netns_dir: &Path,
    vmm: &dyn VmManager,
    dry_run: bool,
) -> Result<Vec<String>, Error> {
    let mut removed = Vec::new();
    let mut first = None;
    for found in survey(&config.state_dir, netns_dir, vmm)?
        .into_iter()
        .filter(PodView::is_orphan)
    {
        let id = &found.pod_id;
        // A dry run takes no lock (nothing of a create waits for it) and lists what it found.
        // An id no containerd id can be (a tap's mark a pod's container wrote, say) has no
        // shim that could be making it, nor a lock.
        if dry_run || check_pod_id(id).is_err() {
            for removal in Removal::of(&found) {
                if !dry_run {
                    if let Err(e) = removal.run(config, vmm, &HeldLock::default()) {
                        first.get_or_insert(e);
                        continue;
                    }
                }
                removed.push(removal.describe(id));
            }
            continue;
        }
        let lock = match pod_lock::try_take(&config.state_dir, id) {
            Ok(Some(lock)) => HeldLock::new(lock),
            Ok(None) => {
                log::info!("pod {id}: its lock is held (the pod is being made, served or removed): left alone");
                continue;
            }
            Err(e) => {
                first.get_or_insert(e);
                continue;
            }
        };
        let again = match survey(&config.state_dir, netns_dir, vmm) {
            Ok(pods) => pods.into_iter().find(|p| p.pod_id == *id && p.is_orphan()),
            Err(e) => {
                first.get_or_insert(e);
                continue;
            }
        };
        let mut failed = false;
        for removal in again.iter().flat_map(Removal::of) {
            if let Err(e) = removal.run(config, vmm, &lock) {
                first.get_or_insert(e);
                failed = true;
                continue;
            }
            removed.push(removal.describe(id));
        }
        // Its lock's file, which taking the lock may have made, goes with the pod.
        if !failed {
            if let Err(e) = lock.remove_file() {
                first.get_or_insert(e);
            }
        }
    }
    crate::gc_leftovers::collect(config, dry_run, &mut removed, &mut first);
    first.map_or(Ok(removed), Err)
}

fn domain_of(pod: &PodView) -> String {
    vmlet_shim::host::pod_paths::domain_name(&pod.pod_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmlet_shim::vmm::FakeVmm;

    /// A node config of `state_dir`, whose VM images' disks are beside it too (never the
    /// node's own: gc removes the disks no pod has).
    fn config_of(state_dir: &Path) -> NodeConfig {
        let mut config = NodeConfig {
            state_dir: state_dir.to_owned(),
            ..Default::default()
        };
        config.vm_images.disk_dir = state_dir.join(".test-disks");
        config
    }

    #[test]
    fn a_figures_socket_without_its_pods_state_is_collected() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_of(dir.path());
        let published = vmlet_shim::task::metrics_dir::path(dir.path());
        std::fs::create_dir(&published).unwrap();
        for name in ["gone.sock", "node-counters.json"] {
            std::fs::write(published.join(name), "").unwrap();
        }
        let netns = tempfile::tempdir().unwrap();
        let vmm = FakeVmm::default();
        let listed = gc(&config, netns.path(), &vmm, true).unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(
            published.join("gone.sock").exists(),
            "a dry run removes nothing"
        );
        let removed = gc(&config, netns.path(), &vmm, false).unwrap();
        assert_eq!(removed, listed);
        assert!(
            removed[0].starts_with("pod gone: figures socket"),
            "{removed:?}"
        );
        assert!(!published.join("gone.sock").exists());
        assert!(published.join("node-counters.json").exists());
    }

    #[test]
    fn the_shims_own_directories_are_no_pods() {
        let dir = tempfile::tempdir().unwrap();
        for name in [".pod-users", "pod-a"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        let pods: Vec<String> = state_dirs(dir.path())
            .into_iter()
            .map(|d| d.pod_id)
            .collect();
        assert_eq!(pods, ["pod-a"]);
    }

    #[test]
    fn orphans_are_found_and_removed_and_live_pods_kept() {
        let dir = std::env::temp_dir().join(format!("vmlet-ctl-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let vmm = FakeVmm::default();
        // A pod whose shim is gone (PID 0 is never a shim), with its domain.
        let orphan = PodState {
            dir: dir.join("gone"),
            made: vec![vmlet_shim::host::undo::Made::Domain("vmlet-gone".into())],
            shim_pid: Some(0),
            ..Default::default()
        };
        std::fs::create_dir_all(&orphan.dir).unwrap();
        orphan.save().unwrap();
        vmm.start(&vmlet_shim::vmm::StartDomain::named("vmlet-gone", "gone"))
            .unwrap();
        // A domain without a state directory.
        vmm.start(&vmlet_shim::vmm::StartDomain::named("vmlet-bare", "bare"))
            .unwrap();
        let config = config_of(&dir);
        // The disks of both pods (of a VM image): a reboot left the bare one's.
        for pod in ["gone", "bare"] {
            use std::os::unix::fs::PermissionsExt;
            let disk = config.vm_images.disk_dir.join(pod);
            std::fs::create_dir_all(&disk).unwrap();
            std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        let no_netns = dir.join("netns");
        let pods = survey(&dir, &no_netns, &vmm).unwrap();
        let ids: Vec<_> = pods.iter().map(|p| p.pod_id.as_str()).collect();
        assert_eq!(ids, ["bare", "gone"]);
        assert!(pods.iter().all(PodView::is_orphan));

        let would = gc(&config, &no_netns, &vmm, true).unwrap();
        assert_eq!(would.len(), 3, "{would:?}");
        assert!(would[2].starts_with("pod bare: disk "), "{would:?}");
        assert_eq!(
            vmm.running.lock().unwrap().len(),
            2,
            "dry run removes nothing"
        );
        gc(&config, &no_netns, &vmm, false).unwrap();
        assert!(vmm.running.lock().unwrap().is_empty());
        assert!(!orphan.dir.exists());
        let disks = std::fs::read_dir(&config.vm_images.disk_dir)
            .unwrap()
            .count();
        assert_eq!(disks, 0, "the disks of both pods are gone");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_pod_whose_lock_is_held_is_left_alone_until_it_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let vmm = FakeVmm::default();
        // A pod being made: its shim holds its lock and has started its domain, and its
        // state directory is not there yet (or `gc` looked before it was).
        vmm.start(&vmlet_shim::vmm::StartDomain::named("vmlet-new", "new"))
            .unwrap();
        let config = config_of(dir.path());
        let no_netns = dir.path().join("netns");
        let held = pod_lock::try_take(dir.path(), "new").unwrap().unwrap();
        assert!(gc(&config, &no_netns, &vmm, false).unwrap().is_empty());
        assert_eq!(*vmm.running.lock().unwrap(), ["vmlet-new"]);
        // Let go (its shim died): an orphan, removed with its lock's file.
        drop(held);
        let removed = gc(&config, &no_netns, &vmm, false).unwrap();
        assert_eq!(removed, ["pod new: domain vmlet-new"]);
        assert!(vmm.running.lock().unwrap().is_empty());
        assert!(!pod_lock::path(dir.path(), "new").exists());
        // A lock file no pod has is swept.
        drop(pod_lock::try_take(dir.path(), "stale").unwrap().unwrap());
        gc(&config, &no_netns, &vmm, false).unwrap();
        assert!(!pod_lock::path(dir.path(), "stale").exists());
    }
}
