//! The pod's `log/` directory: a tmpfs of the node's `pod_log_mib` for every file whose
//! contents the guest decides although a host process writes it (QEMU's serial console,
//! vhost-device-vsock's log). A guest that floods them fills this tmpfs and no more: the
//! logs stop growing, the pod runs on, and nothing else of the node's memory or of the state
//! directory's file system is taken. The tmpfs' pages are charged to the cgroup of the
//! process that writes them (the VM's, in the pod's cgroup).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::host::fd_mount;
use crate::Error;

/// The directory's name below the pod directory.
pub const LOG_DIR: &str = "log";
/// QEMU (as its own user) opens the console there: it may pass, not list.
const LOG_DIR_MODE: u32 = 0o711;
/// Files the directory may hold: the console, its rotated copies, the vsock log.
const MAX_FILES: u32 = 64;

/// `<pod dir>/log`.
pub fn path(pod_dir: &Path) -> PathBuf {
    pod_dir.join(LOG_DIR)
}

/// Makes `<pod dir>/log` and mounts a tmpfs of `size_mib` MiB on it (nosuid, nodev,
/// noexec). `record` is called with the mount point before it is mounted, so that teardown
/// finds it after a crash.
pub fn mount(
    pod_dir: &Path,
    size_mib: u64,
    record: &dyn Fn(&Path) -> Result<(), Error>,
) -> Result<(), Error> {
    let target = path(pod_dir);
    let what = format!("mount the log tmpfs on {}", target.display());
    let pod = fd_mount::open_dir(pod_dir).map_err(|e| Error::io(what.clone(), e))?;
    let dir = fd_mount::mkdirs_beneath(pod.as_fd(), Path::new(LOG_DIR), LOG_DIR_MODE)
        .map_err(|e| Error::io(what.clone(), e))?;
    record(&target)?;
    nix::mount::mount(
        Some("vmlet-pod-log"),
        &fd_mount::proc_path(dir.as_fd()),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(options(size_mib).as_str()),
    )
    .map_err(|e| Error::io(what, e.into()))
}

fn options(size_mib: u64) -> String {
    format!("size={size_mib}m,nr_inodes={MAX_FILES},mode={LOG_DIR_MODE:o}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_options_bound_size_and_files() {
        assert_eq!(options(8), "size=8m,nr_inodes=64,mode=711");
        assert_eq!(
            path(Path::new("/run/vmlet/p1")),
            Path::new("/run/vmlet/p1/log")
        );
    }
}
