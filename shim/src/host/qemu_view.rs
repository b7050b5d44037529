//! What QEMU the shim starts (`launcher = "direct"`) sees of the node: a mount namespace of
//! its own, made in the child before its exec ([`MountView::enter`], still root), where
//! - `/dev` is a small tmpfs holding only the device nodes a VM of vmlet's opens (`null`,
//!   `zero`, `full`, `random`, `urandom`, and `kvm` where the VM runs on KVM), made as the
//!   node has them (numbers, owner, mode): not the node's disks, terminals, `/dev/shm` or
//!   another VM's devices;
//! - the state directory is a tmpfs holding the pod's own directory alone (bound from the
//!   node's, with its mounts): no other pod's sockets, logs or records, nor the node's
//!   claims and counters, whatever their modes;
//! - every mount is read-only and `nosuid` ([`read_only_everywhere`], the last step): QEMU
//!   writes only through the descriptors it is handed and connects its sockets (neither
//!   needs a writable mount), so it has nowhere to leave a file, not the node's `/tmp` or
//!   `/var/tmp`, not its pod's directory, not the small tmpfs of this view.
//!
//! Nothing propagates back to the node (the namespace's mounts are the node's slaves: they
//! receive what the node unmounts, so no copy keeps another pod's volume busy), and the view
//! goes with QEMU. libvirt gives its QEMU a private `/dev` the same way
//! (`namespaces = ["mount"]`). QEMU also gets an empty network namespace of its own (libvirt
//! gives none): its NICs are the taps it is handed and its sockets are files, so the node's
//! network, its abstract Unix sockets among it, is out of its reach.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::Error;

/// The device nodes every VM of vmlet's may open, beside `/dev/kvm` on KVM.
const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];
/// Where the pod's directory is bound while the state directory is covered.
const STAGE: &str = "/dev/.vmlet-pod";
/// The tmpfs options: small, bounded in files.
const DEV_OPTIONS: &str = "mode=0755,size=64k,nr_inodes=64";
const STATE_OPTIONS: &str = "mode=0711,size=64k,nr_inodes=16";

/// A device node as the node has it.
#[derive(Debug)]
struct Node {
    path: CString,
    /// `S_IFCHR` or `S_IFBLK`.
    kind: libc::mode_t,
    mode: libc::mode_t,
    rdev: libc::dev_t,
    uid: libc::uid_t,
    gid: libc::gid_t,
}

/// QEMU's view, made ready before the fork: the child only makes system calls.
#[derive(Debug)]
pub struct MountView {
    state_dir: CString,
    pod_dir: CString,
    stage: CString,
    nodes: Vec<Node>,
    dev_options: CString,
    state_options: CString,
}

fn c_path(path: &Path) -> Result<CString, Error> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Internal(format!("{}: a NUL in the path", path.display())))
}

impl MountView {
    /// The view of the pod whose directory is `pod_dir` (in `state_dir`), with `/dev/kvm`
    /// when `kvm`.
    pub fn new(state_dir: &Path, pod_dir: &Path, kvm: bool) -> Result<Self, Error> {
        if pod_dir.parent() != Some(state_dir) || !state_dir.is_absolute() {
            return Err(Error::Internal(format!(
                "{} is not a pod's directory in {}",
                pod_dir.display(),
                state_dir.display()
            )));
        }
        let names = DEVICES.iter().chain(kvm.then_some(&"kvm"));
        let nodes = names
            .map(|name| {
                let path = Path::new("/dev").join(name);
                let meta = std::fs::symlink_metadata(&path)
                    .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
                if !meta.file_type().is_char_device() {
                    return Err(Error::FailedPrecondition(format!(
                        "{} is not a character device",
                        path.display()
                    )));
                }
                Ok(Node {
                    path: c_path(&path)?,
                    kind: libc::S_IFCHR,
                    mode: meta.mode() & 0o777,
                    rdev: meta.rdev(),
                    uid: meta.uid(),
                    gid: meta.gid(),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(MountView {
            state_dir: c_path(state_dir)?,
            pod_dir: c_path(pod_dir)?,
            stage: c_path(Path::new(STAGE))?,
            nodes,
            dev_options: CString::new(DEV_OPTIONS).expect("no NUL"),
            state_options: CString::new(STATE_OPTIONS).expect("no NUL"),
        })
    }

    /// The view with a block device node of its own too, `/dev/NAME` for the device
    /// `rdev`, owned by `uid` (mode 0600): a device a process that is not root may open in
    /// this view alone (`qemu-img` writing a pod's root volume as the pod's user).
    pub fn with_block_device(
        mut self,
        name: &str,
        rdev: libc::dev_t,
        uid: u32,
    ) -> Result<Self, Error> {
        if name.is_empty() || name.contains('/') || DEVICES.contains(&name) || name == "kvm" {
            return Err(Error::Internal(format!(
                "/dev/{name}: not a node of its own"
            )));
        }
        self.nodes.push(Node {
            path: c_path(&Path::new("/dev").join(name))?,
            kind: libc::S_IFBLK,
            mode: 0o600,
            rdev,
            uid,
            gid: 0,
        });
        Ok(self)
    }

    /// Makes the view in the calling process (the child, between fork and exec, before it
    /// drops root): whether every step took.
    ///
    /// # Safety
    /// Only what `unshare(2)`, `mount(2)`, `umount2(2)`, `mkdir(2)`, `rmdir(2)`,
    /// `mknod(2)`, `chown(2)`, `chmod(2)` and `mount_setattr(2)` require; it allocates
    /// nothing.
    pub unsafe fn enter(&self) -> bool {
        let none = std::ptr::null::<libc::c_char>();
        let tmpfs = c"tmpfs".as_ptr();
        let mount = |source: *const libc::c_char,
                     target: &CString,
                     fstype: *const libc::c_char,
                     flags: libc::c_ulong,
                     data: *const libc::c_char| {
            libc::mount(source, target.as_ptr(), fstype, flags, data.cast()) == 0
        };
        // A network namespace of its own too, empty: QEMU's NICs are taps it is handed and
        // its sockets are files, so nothing of the node's network (its abstract Unix
        // sockets, its addresses and ports) is within its reach.
        libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET) == 0
            // Nothing of what follows reaches the node, and what the node unmounts goes here
            // too (a copy kept would hold another pod's volume busy).
            && libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) == 0
            && libc::mount(
                tmpfs,
                c"/dev".as_ptr(),
                tmpfs,
                libc::MS_NOSUID | libc::MS_NOEXEC,
                self.dev_options.as_ptr().cast(),
            ) == 0
            // The pod's directory, with its mounts, aside while the state directory is
            // covered, then in its place.
            && libc::mkdir(self.stage.as_ptr(), 0o700) == 0
            && mount(self.pod_dir.as_ptr(), &self.stage, none, libc::MS_BIND | libc::MS_REC, none)
            && mount(
                tmpfs,
                &self.state_dir,
                tmpfs,
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                self.state_options.as_ptr(),
            )
            && libc::mkdir(self.pod_dir.as_ptr(), 0o711) == 0
            && mount(self.stage.as_ptr(), &self.pod_dir, none, libc::MS_BIND | libc::MS_REC, none)
            && libc::umount2(self.stage.as_ptr(), libc::MNT_DETACH) == 0
            && libc::rmdir(self.stage.as_ptr()) == 0
            && self.nodes.iter().all(|n| {
                libc::mknod(n.path.as_ptr(), n.kind | n.mode, n.rdev) == 0
                    && libc::chown(n.path.as_ptr(), n.uid, n.gid) == 0
                    // The umask took some of the mode.
                    && libc::chmod(n.path.as_ptr(), n.mode) == 0
            })
            && read_only_everywhere()
    }
}

/// Makes every mount of the calling process's namespace read-only and `nosuid`, in one
/// step (`mount_setattr(2)`, Linux 5.12, a year after `close_range`'s flag the launcher
/// needs too): whether it took. Mounts the node makes later reach the namespace as the
/// node has them.
///
/// # Safety
/// Only what `mount_setattr(2)` requires; it allocates nothing.
unsafe fn read_only_everywhere() -> bool {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    libc::syscall(
        libc::SYS_mount_setattr,
        libc::AT_FDCWD,
        c"/".as_ptr(),
        libc::AT_RECURSIVE,
        &attr as *const libc::mount_attr,
        std::mem::size_of::<libc::mount_attr>(),
    ) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_is_of_the_nodes_devices_and_one_pods_directory() {
        let view =
            MountView::new(Path::new("/run/vmlet"), Path::new("/run/vmlet/p1"), false).unwrap();
        let names: Vec<_> = view
            .nodes
            .iter()
            .map(|n| n.path.to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "/dev/null",
                "/dev/zero",
                "/dev/full",
                "/dev/random",
                "/dev/urandom"
            ]
        );
        let null = &view.nodes[0];
        assert_eq!((null.mode, null.uid), (0o666, 0));
        for (state, pod) in [
            ("/run/vmlet", "/run/other/p1"),
            ("run/vmlet", "run/vmlet/p1"),
        ] {
            assert!(MountView::new(Path::new(state), Path::new(pod), false).is_err());
        }
    }
}
