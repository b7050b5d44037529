//! The container's first process, inside its new mount, PID, UTS and IPC namespaces.
//!
//! File descriptors set up by [`crate::launch`]: 0-2 stdio, 3 the [`InitSpec`] as JSON,
//! 4 the start pipe (one byte means "start", EOF means "give up"), 5 the status pipe
//! (close-on-exec: `R` when the rootfs is ready, `E<message>` on failure, EOF on a
//! successful exec).
//!
//! A container that shares the pod's PID namespace is launched without a new one: this
//! helper joins the sandbox's IPC, UTS and (for its children) PID namespaces, then clones
//! the container's init with CLONE_PARENT (a child of the agent, a member of the pod's PID
//! namespace, so its `/proc` mount shows the pod's processes), reports `P<pid>\n` and
//! exits; the init carries on with the same handshake.

use std::fs::File;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::unistd::{chdir, chroot, sethostname};

use crate::become_process::become_process;
use crate::helper_fds::Handshake;
use crate::init_spec::{parse_mount_options, DeviceNode, InitSpec};

/// Device nodes every container gets, bind-mounted from the guest's devtmpfs.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Entry point of `vmlet-agent __container-init`. Never returns.
pub fn run() -> ! {
    let mut handshake = Handshake::take();
    let spec = match handshake
        .read_spec::<InitSpec>("init spec")
        .and_then(|spec| join_namespaces(&spec).map(|()| spec))
    {
        Ok(spec) => spec,
        Err(message) => handshake.fail(&message, 1),
    };
    if spec.join_namespaces.iter().any(|n| n == "pid") {
        handshake.continue_as_agent_child();
    }
    if let Err(message) = prepare(&spec) {
        handshake.fail(&message, 1);
    }
    handshake.ready_then_wait_for_start();
    let message = become_process(&spec.process);
    handshake.fail(&message, 127)
}

/// Everything that needs the guest's view: mounts, devices, hostname, then the move into
/// the rootfs.
fn prepare(spec: &InitSpec) -> Result<(), String> {
    let rootfs = PathBuf::from(&spec.rootfs);
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make / private: {e}"))?;
    mount(
        Some(&rootfs),
        &rootfs,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("bind rootfs {}: {e}", rootfs.display()))?;
    for m in &spec.mounts {
        mount_one(&rootfs, m)?;
    }
    populate_dev(&rootfs)?;
    if spec.all_guest_devices {
        copy_guest_devices(Path::new("/dev"), &rootfs.join("dev"))?;
    }
    for node in &spec.devices {
        make_device_node(&rootfs, node)?;
    }
    for path in &spec.readonly_paths {
        readonly_path(&rootfs, path)?;
    }
    for path in &spec.masked_paths {
        mask_path(&rootfs, path)?;
    }
    let shares_uts = spec.join_namespaces.iter().any(|n| n == "uts");
    if !spec.hostname.is_empty() && !shares_uts {
        sethostname(&spec.hostname).map_err(|e| format!("sethostname: {e}"))?;
    }
    // The guest's procfs, opened in the container's namespaces: namespaced sysctls (net.*,
    // the IPC ones) land in the container's; the others in the pod's own kernel.
    for (key, value) in &spec.sysctls {
        write_sysctl(key, value)?;
    }
    if spec.readonly_rootfs {
        mount(
            Some(&rootfs),
            &rootfs,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| format!("remount rootfs read-only: {e}"))?;
    }
    // The guest's root is the initramfs, where pivot_root(2) is refused: move the rootfs
    // over / and chroot into it, as runc does with --no-pivot. The VM is the boundary.
    chdir(&rootfs).map_err(|e| format!("chdir rootfs: {e}"))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|e| format!("move rootfs to /: {e}"))?;
    chroot(".").map_err(|e| format!("chroot: {e}"))?;
    chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// Enters the pod sandbox's IPC and UTS namespaces where the spec shares them (the new ones
/// from the clone are then left behind), and its PID namespace for the children.
fn join_namespaces(spec: &InitSpec) -> Result<(), String> {
    for name in &spec.join_namespaces {
        if !matches!(name.as_str(), "ipc" | "uts" | "pid") {
            return Err(format!("cannot join a {name} namespace"));
        }
        let path = format!("/proc/{}/ns/{name}", spec.join_pid);
        let file = File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
        nix::sched::setns(file, nix::sched::CloneFlags::empty())
            .map_err(|e| format!("join the pod's {name} namespace: {e}"))?;
    }
    Ok(())
}

fn mount_one(rootfs: &Path, m: &crate::init_spec::MountSpec) -> Result<(), String> {
    let target = rootfs.join(m.destination.trim_start_matches('/'));
    if m.fstype == "bind" {
        return bind_one(&target, m);
    }
    std::fs::create_dir_all(&target).map_err(|e| format!("mkdir {}: {e}", m.destination))?;
    let (flags, data) = parse_mount_options(&m.options);
    // The guest runs cgroup v2 only; a v1 "cgroup" mount means the unified hierarchy.
    let (fstype, source) = match m.fstype.as_str() {
        "cgroup" => ("cgroup2", "cgroup2"),
        other => (other, m.source.as_str()),
    };
    let data = (!data.is_empty()).then_some(data.as_str());
    mount(Some(source), &target, Some(fstype), flags, data)
        .map_err(|e| format!("mount {} on {}: {e}", fstype, m.destination))
}

/// The spec's path inside the rootfs; `None` when it does not exist there (nothing to do,
/// as runc does).
fn in_rootfs(rootfs: &Path, path: &str) -> Option<PathBuf> {
    let target = rootfs.join(path.trim_start_matches('/'));
    target.symlink_metadata().is_ok().then_some(target)
}

/// A readonlyPaths entry: bound onto itself, then remounted read-only keeping its flags.
fn readonly_path(rootfs: &Path, path: &str) -> Result<(), String> {
    let Some(target) = in_rootfs(rootfs, path) else {
        return Ok(());
    };
    let bind = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(&target), &target, None::<&str>, bind, None::<&str>)
        .map_err(|e| format!("bind read-only path {path}: {e}"))?;
    let kept = nix::sys::statvfs::statvfs(&target)
        .map(|v| {
            let f = v.flags();
            let mut kept = MsFlags::empty();
            for (vfs, ms) in [
                (nix::sys::statvfs::FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                (nix::sys::statvfs::FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (nix::sys::statvfs::FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            ] {
                if f.contains(vfs) {
                    kept |= ms;
                }
            }
            kept
        })
        .unwrap_or(MsFlags::empty());
    let remount = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | kept;
    mount(None::<&str>, &target, None::<&str>, remount, None::<&str>)
        .map_err(|e| format!("make {path} read-only: {e}"))
}

/// A maskedPaths entry: a directory gets an empty read-only tmpfs over it, anything else
/// the guest's `/dev/null`.
fn mask_path(rootfs: &Path, path: &str) -> Result<(), String> {
    let Some(target) = in_rootfs(rootfs, path) else {
        return Ok(());
    };
    let masked = if target.is_dir() {
        mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::MS_RDONLY,
            None::<&str>,
        )
    } else {
        mount(
            Some("/dev/null"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    };
    masked.map_err(|e| format!("mask {path}: {e}"))
}

/// A bind from the share: the mount point is a file or a directory like its source; `ro`
/// needs a second, remounting call (the kernel ignores MS_RDONLY on the first), `rro` a
/// `mount_setattr(2)` over the bind and every mount below it.
fn bind_one(target: &Path, m: &crate::init_spec::MountSpec) -> Result<(), String> {
    let source = Path::new(&m.source);
    let made = if source.is_dir() {
        std::fs::create_dir_all(target)
    } else {
        target
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                if target.exists() {
                    Ok(())
                } else {
                    File::create(target).map(drop)
                }
            })
    };
    made.map_err(|e| format!("create mount point {}: {e}", m.destination))?;
    let (flags, _) = parse_mount_options(&m.options);
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("bind {}: {e}", m.destination))?;
    if m.options.iter().any(|o| o == "rro") {
        return readonly_recursively(target)
            .map_err(|e| format!("make {} read-only with its submounts: {e}", m.destination));
    }
    if flags.contains(MsFlags::MS_RDONLY) {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| format!("make {} read-only: {e}", m.destination))?;
    }
    Ok(())
}

/// `mount_setattr(target, AT_RECURSIVE, MOUNT_ATTR_RDONLY)` (Linux 5.12).
fn readonly_recursively(target: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(target.as_os_str().as_bytes())?;
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is NUL-terminated and `attr` a valid `mount_attr` of the size given;
    // both outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A block device node at the spec's path, as runc makes one: mknod with the spec's mode
/// and owner (whatever was at the path is replaced).
fn make_device_node(rootfs: &Path, node: &DeviceNode) -> Result<(), String> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let target = rootfs.join(node.path.trim_start_matches('/'));
    let what = format!("device {} at {}", node.guest_name, node.path);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{what}: mkdir: {e}"))?;
    }
    if target.symlink_metadata().is_ok() {
        std::fs::remove_file(&target).map_err(|e| format!("{what}: remove old: {e}"))?;
    }
    mknod(
        &target,
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(node.file_mode),
        makedev(node.major.into(), node.minor.into()),
    )
    .map_err(|e| format!("{what}: mknod: {e}"))?;
    // mknod applies the umask: set the mode the spec asked for.
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &target,
        Mode::from_bits_truncate(node.file_mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(|e| format!("{what}: chmod: {e}"))?;
    nix::unistd::chown(
        &target,
        Some(nix::unistd::Uid::from_raw(node.uid)),
        Some(nix::unistd::Gid::from_raw(node.gid)),
    )
    .map_err(|e| format!("{what}: chown: {e}"))
}

/// Writes one sysctl (`net.ipv4.ip_forward` is `/proc/sys/net/ipv4/ip_forward`, as runc
/// spells it). A key that is not a plain relative path is refused, named.
fn write_sysctl(key: &str, value: &str) -> Result<(), String> {
    let plain = key
        .split(['.', '/'])
        .all(|part| !part.is_empty() && part != "..");
    let rel = PathBuf::from(key.replace('.', "/"));
    if !plain {
        return Err(format!("sysctl {key:?} is not a sysctl name"));
    }
    std::fs::write(Path::new("/proc/sys").join(&rel), value)
        .map_err(|e| format!("sysctl {key}={value}: {e}"))
}

/// Directories of /dev that are not device nodes the container should get (runc skips the
/// same ones of the host's): its own pts, shm and mqueue come from the spec's mounts.
const NOT_DEVICES: &[&str] = &["pts", "shm", "mqueue", "fd"];

/// A privileged container's /dev: a node for every character and block device of the
/// guest's `/dev` (recursively), with its mode and owner, as runc gives one the host's.
/// The console stays the container's own; what the container's /dev already has is kept.
fn copy_guest_devices(from: &Path, to: &Path) -> Result<(), String> {
    use nix::sys::stat::{mknod, Mode, SFlag};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !to.is_dir() {
        return Ok(());
    }
    let entries = std::fs::read_dir(from).map_err(|e| format!("read {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("read {}: {e}", from.display()))?;
        let name = entry.file_name();
        let (source, target) = (entry.path(), to.join(&name));
        let meta = entry
            .metadata()
            .map_err(|e| format!("stat {}: {e}", source.display()))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            if NOT_DEVICES.iter().any(|n| name == *n) {
                continue;
            }
            if target.symlink_metadata().is_err() {
                std::fs::create_dir(&target)
                    .map_err(|e| format!("mkdir {}: {e}", target.display()))?;
            }
            if target.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                copy_guest_devices(&source, &target)?;
            }
            continue;
        }
        let flag = if kind.is_char_device() {
            SFlag::S_IFCHR
        } else if kind.is_block_device() {
            SFlag::S_IFBLK
        } else {
            continue;
        };
        if name == "console" || target.symlink_metadata().is_ok() {
            continue;
        }
        let mode = Mode::from_bits_truncate(meta.mode());
        mknod(&target, flag, mode, meta.rdev())
            .map_err(|e| format!("mknod {}: {e}", target.display()))?;
        // mknod applies the umask.
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            &target,
            mode,
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| format!("chmod {}: {e}", target.display()))?;
        nix::unistd::chown(
            &target,
            Some(nix::unistd::Uid::from_raw(meta.uid())),
            Some(nix::unistd::Gid::from_raw(meta.gid())),
        )
        .map_err(|e| format!("chown {}: {e}", target.display()))?;
    }
    Ok(())
}

fn populate_dev(rootfs: &Path) -> Result<(), String> {
    let dev = rootfs.join("dev");
    if !dev.is_dir() {
        return Ok(());
    }
    for name in DEVICES {
        let target = dev.join(name);
        if !target.exists() {
            File::create(&target).map_err(|e| format!("create /dev/{name}: {e}"))?;
        }
        let source = Path::new("/dev").join(name);
        mount(
            Some(&source),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind /dev/{name}: {e}"))?;
    }
    let links = [
        ("/proc/self/fd", "fd"),
        ("/proc/self/fd/0", "stdin"),
        ("/proc/self/fd/1", "stdout"),
        ("/proc/self/fd/2", "stderr"),
        ("pts/ptmx", "ptmx"),
    ];
    for (to, name) in links {
        let link = dev.join(name);
        if link.symlink_metadata().is_err() {
            symlink(to, &link).map_err(|e| format!("symlink /dev/{name}: {e}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_names_stay_below_proc_sys() {
        for bad in ["", "..", "net/../../etc/x", "/etc/passwd", "net..x"] {
            let err = write_sysctl(bad, "1").unwrap_err();
            assert!(err.contains("not a sysctl name"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_privileged_container_gets_every_device_but_the_console_and_pts() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dir = std::env::temp_dir().join(format!("vmlet-agent-devs-{}", std::process::id()));
        let (from, to) = (dir.join("guest-dev"), dir.join("rootfs-dev"));
        for d in [&from.join("snd"), &from.join("pts"), &to] {
            std::fs::create_dir_all(d).unwrap();
        }
        let node = |path: &Path, kind, major, minor, mode| {
            use std::os::unix::fs::PermissionsExt;
            mknod(
                path,
                kind,
                Mode::from_bits_truncate(mode),
                makedev(major, minor),
            )
            .unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        node(&from.join("kmsg"), SFlag::S_IFCHR, 1, 11, 0o644);
        node(&from.join("vda"), SFlag::S_IFBLK, 254, 0, 0o660);
        node(&from.join("snd/timer"), SFlag::S_IFCHR, 116, 33, 0o660);
        node(&from.join("pts/0"), SFlag::S_IFCHR, 136, 0, 0o620);
        node(&from.join("console"), SFlag::S_IFCHR, 5, 1, 0o600);
        std::fs::write(from.join("not-a-device"), "x").unwrap();
        // What the container's /dev has (the spec's, the defaults) stays.
        std::fs::write(to.join("kmsg"), "").unwrap();

        copy_guest_devices(&from, &to).unwrap();

        let meta = std::fs::metadata(to.join("vda")).unwrap();
        assert!(meta.file_type().is_block_device());
        assert_eq!(
            (meta.rdev(), meta.mode() & 0o7777),
            (makedev(254, 0), 0o660)
        );
        let timer = std::fs::metadata(to.join("snd/timer")).unwrap();
        assert!(timer.file_type().is_char_device());
        assert!(std::fs::metadata(to.join("kmsg")).unwrap().is_file());
        for absent in ["pts", "console", "not-a-device"] {
            assert!(to.join(absent).symlink_metadata().is_err(), "{absent}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
