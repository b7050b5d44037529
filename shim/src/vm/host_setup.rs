//! The pod's host side, before the VM: the state directory's mode, the pod's cgroup, the
//! log tmpfs, the share with the first container's rootfs and binds, and the pod's host
//! process with the OCI hooks that need it (a VM-mode pod's sandbox is only the directory,
//! the cgroup and the host process).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use vmlet_config::NodeConfig;

use super::{block, BootRequest, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::share;
use crate::host::undo::Made;
use crate::Error;

/// Makes the host side of the pod's share and logs, each mount recorded first.
pub(super) fn prepare(
    config: &NodeConfig,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
) -> Result<(), Error> {
    dir_and_cgroup(paths, req.cgroup.as_ref(), rec)?;
    let record = |target: &Path| rec.mount(target);
    crate::host::log_dir::mount(&paths.dir, config.pod_log_mib, &record)?;
    share::prepare(&paths.dir, &record)?;
    share::mount_container(
        &paths.dir,
        &req.container_id,
        &req.rootfs,
        &req.binds,
        &record,
    )
}

/// Saves the pod's first state, gives its directory its mode and makes its cgroup
/// (recorded first).
pub(super) fn dir_and_cgroup(
    paths: &PodPaths,
    cgroup: Option<&crate::host::pod_cgroup::PodCgroup>,
    rec: &Recorder<'_>,
) -> Result<(), Error> {
    rec.save(|_| {})?;
    std::fs::set_permissions(
        &paths.dir,
        std::fs::Permissions::from_mode(share::POD_DIR_MODE),
    )
    .map_err(|e| Error::io("chmod pod dir", e))?;
    if let Some(cgroup) = cgroup {
        rec.record(Made::Cgroup(cgroup.path.clone()))?;
        cgroup.create()?;
    }
    Ok(())
}

/// The network namespace whose interfaces the VM gets.
pub(super) struct PodNetns {
    pub path: PathBuf,
    /// A new namespace the hooks were to fill: it may have no interface.
    pub may_be_empty: bool,
}

/// Starts the pod's host process when the spec has host hooks (in the pod's namespace, or
/// a new one) and runs its create hooks; returns the namespace to wire into the VM.
pub(super) async fn start_host_process(
    req: &BootRequest,
    rec: &Recorder<'_>,
) -> Result<Option<PodNetns>, Error> {
    let given = req.netns.clone().map(|path| PodNetns {
        path,
        may_be_empty: false,
    });
    let Some(host) = &req.host_process else {
        return Ok(given);
    };
    let pid = spawn_host_process(req.netns.clone(), &host.create_hooks, &host.state, rec).await?;
    // The spec asked for a new namespace: whatever the hooks put there.
    Ok(Some(given.unwrap_or_else(|| PodNetns {
        path: crate::host::netns_holder::netns_path(pid),
        may_be_empty: true,
    })))
}

/// Starts the pod's host process in `netns` (none: a new namespace), recorded and in the
/// pod's cgroup, then runs `create_hooks` with its PID in `state`. Returns the PID.
pub(super) async fn spawn_host_process(
    netns: Option<PathBuf>,
    create_hooks: &[oci_spec::runtime::Hook],
    state: &crate::spec::hooks::HookState,
    rec: &Recorder<'_>,
) -> Result<u32, Error> {
    let pid = block(move || crate::host::netns_holder::spawn(netns.as_deref())).await??;
    rec.record(Made::HostProcess(pid))?;
    rec.place(pid, "the pod's host process")?;
    let state = crate::spec::hooks::HookState {
        pid,
        ..state.clone()
    };
    crate::spec::hooks::run(create_hooks, &state, "creating").await?;
    Ok(pid)
}
