//! What a pod whose state directory is gone (its shim killed, its state lost) may have left
//! outside that directory, which `vmletctl gc` removes: its figures socket in the metrics
//! directory, the AppArmor profile of its QEMU (the shim's own launcher, on an AppArmor
//! node; removing it ends whatever still runs under it first), its lock's file, and a VM
//! image's disk under `vm_images.disk_dir` (which, unlike the state directory, outlives a
//! reboot).

use std::path::{Path, PathBuf};

use vmlet_config::NodeConfig;
use vmlet_shim::host::pod_paths::PodPaths;
use vmlet_shim::host::qemu_apparmor;
use vmlet_shim::vm_mode::disk_dir;
use vmlet_shim::Error;

/// Removes (or, with `dry_run`, only names) what pods without a state directory left,
/// one line each into `removed`; the first failure into `first`.
pub fn collect(
    config: &NodeConfig,
    dry_run: bool,
    removed: &mut Vec<String>,
    first: &mut Option<Error>,
) {
    let gone = |pod_id: &str| !PodPaths::new(&config.state_dir, pod_id).dir.exists();
    // A teardown removes the socket with the directory.
    for (pod_id, socket) in published_sockets(&config.state_dir).unwrap_or_default() {
        if !gone(&pod_id) {
            continue;
        }
        if !dry_run {
            if let Err(e) = std::fs::remove_file(&socket) {
                first.get_or_insert(Error::io(format!("remove {}", socket.display()), e));
                continue;
            }
        }
        removed.push(format!("pod {pod_id}: figures socket {}", socket.display()));
    }
    let loaded = match qemu_apparmor::loaded_pods() {
        Ok(loaded) => loaded,
        Err(e) => {
            first.get_or_insert(e);
            Vec::new()
        }
    };
    for pod_id in loaded.into_iter().filter(|p| gone(p)) {
        let Ok(name) = qemu_apparmor::profile_name(&pod_id) else {
            continue;
        };
        if !dry_run {
            if let Err(e) = qemu_apparmor::unload(&name) {
                first.get_or_insert(e);
                continue;
            }
        }
        removed.push(format!("pod {pod_id}: AppArmor profile {name}"));
    }
    orphan_disks(config, dry_run, removed, first);
    if !dry_run {
        if let Err(e) = unused_locks(&config.state_dir) {
            first.get_or_insert(e);
        }
    }
}

/// VM images' disks whose pods have no state directory (nor a held lock): see
/// [`disk_dir::reclaim_orphans`].
fn orphan_disks(
    config: &NodeConfig,
    dry_run: bool,
    removed: &mut Vec<String>,
    first: &mut Option<Error>,
) {
    let disks = &config.vm_images.disk_dir;
    let describe = |pod_id: &str| format!("pod {pod_id}: disk {}", disks.join(pod_id).display());
    if dry_run {
        for pod_id in disk_dir::orphans(disks, &config.state_dir) {
            removed.push(describe(&pod_id));
        }
        return;
    }
    for (pod_id, result) in disk_dir::reclaim_orphans(disks, &config.state_dir) {
        match result {
            Ok(()) => removed.push(describe(&pod_id)),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
}

/// Removes the lock files of pods with no state directory that no one holds (a pod's
/// teardown removes its own; one whose teardown failed leaves it).
fn unused_locks(state_dir: &Path) -> Result<(), Error> {
    use vmlet_shim::host::pod_lock;
    let entries = match std::fs::read_dir(state_dir.join(pod_lock::LOCKS_DIR)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("list {}", pod_lock::LOCKS_DIR), e)),
    };
    for entry in entries.flatten() {
        let pod_id = entry.file_name().to_string_lossy().into_owned();
        if crate::ctl::check_pod_id(&pod_id).is_err()
            || PodPaths::new(state_dir, &pod_id).dir.exists()
        {
            continue;
        }
        if let Some(lock) = pod_lock::try_take(state_dir, &pod_id)? {
            // Looked at again with the lock held: a pod made since has its directory.
            if !PodPaths::new(state_dir, &pod_id).dir.exists() {
                lock.remove_file()?;
            }
        }
    }
    Ok(())
}

/// The pods' figures sockets in the metrics directory, by pod id (other names skipped);
/// none where no pod has served figures since the node's boot (no directory).
pub fn published_sockets(state_dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let entries = match std::fs::read_dir(vmlet_shim::task::metrics_dir::path(state_dir)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pod_id = name.strip_suffix(".sock")?.to_owned();
            crate::ctl::check_pod_id(&pod_id).ok()?;
            Some((pod_id, entry.path()))
        })
        .collect())
}
