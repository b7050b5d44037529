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

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::mount::{mount, MsFlags};
use nix::unistd::{chdir, chroot, sethostname};

use crate::become_process::become_process;
use crate::helper_fds::Handshake;
use crate::in_rootfs::{proc_path, Rootfs};
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
    // A cgroup namespace rooted at the container's cgroup (the agent put this process there
    // before it sent the spec), as runc gives one on a cgroup v2 node: the container's
    // `/sys/fs/cgroup` is its own cgroup, with its limits at the top (memory.max, cpu.max),
    // and `/proc/self/cgroup` says `0::/`.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| format!("make the container's cgroup namespace: {e}"))?;
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
    // Every path below is the image's and the spec's: resolved beneath the rootfs, as the
    // container will see it, never through a link out of it.
    let root =
        Rootfs::open(&rootfs).map_err(|e| format!("open rootfs {}: {e}", rootfs.display()))?;
    for m in &spec.mounts {
        mount_one(&root, m)?;
    }
    populate_dev(&root)?;
    if spec.all_guest_devices {
        copy_guest_devices(Path::new("/dev"), &root, "/dev")?;
    }
    for node in &spec.devices {
        make_device_node(&root, node)?;
    }
    for path in &spec.readonly_paths {
        readonly_path(&root, path)?;
    }
    for path in &spec.masked_paths {
        mask_path(&root, path)?;
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

fn mount_one(root: &Rootfs, m: &crate::init_spec::MountSpec) -> Result<(), String> {
    if m.fstype == "bind" {
        return bind_one(root, m);
    }
    let target = root
        .make_dir(&m.destination)
        .map_err(|e| format!("mkdir {}: {e}", m.destination))?;
    let (flags, data) = parse_mount_options(&m.options);
    // The guest runs cgroup v2 only; a v1 "cgroup" mount means the unified hierarchy.
    let (fstype, source) = match m.fstype.as_str() {
        "cgroup" => ("cgroup2", "cgroup2"),
        other => (other, m.source.as_str()),
    };
    let data = (!data.is_empty()).then_some(data.as_str());
    mount(Some(source), &proc_path(&target), Some(fstype), flags, data)
        .map_err(|e| format!("mount {} on {}: {e}", fstype, m.destination))
}

/// The spec's `path` in the rootfs (as the container sees it), or `None` when it does not
/// exist there (nothing to do, as runc does).
fn in_rootfs(root: &Rootfs, path: &str) -> Result<Option<OwnedFd>, String> {
    root.find(path).map_err(|e| format!("look up {path}: {e}"))
}

/// What is mounted at `path` now (the file a descriptor taken before the mount holds is
/// the one beneath it).
fn mounted_at(root: &Rootfs, path: &str) -> Result<OwnedFd, String> {
    in_rootfs(root, path)?.ok_or_else(|| format!("{path} is gone after its mount"))
}

/// A readonlyPaths entry: bound onto itself, then remounted read-only keeping its flags.
fn readonly_path(root: &Rootfs, path: &str) -> Result<(), String> {
    let Some(target) = in_rootfs(root, path)? else {
        return Ok(());
    };
    let bind = MsFlags::MS_BIND | MsFlags::MS_REC;
    let at = proc_path(&target);
    mount(Some(&at), &at, None::<&str>, bind, None::<&str>)
        .map_err(|e| format!("bind read-only path {path}: {e}"))?;
    // Held until the remount: its /proc/self/fd path is what names the mount.
    let mounted = mounted_at(root, path)?;
    let at = proc_path(&mounted);
    let kept = nix::sys::statvfs::statvfs(&at)
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
    mount(None::<&str>, &at, None::<&str>, remount, None::<&str>)
        .map_err(|e| format!("make {path} read-only: {e}"))
}

/// A maskedPaths entry: a directory gets an empty read-only tmpfs over it, anything else
/// the guest's `/dev/null`.
fn mask_path(root: &Rootfs, path: &str) -> Result<(), String> {
    let Some(target) = in_rootfs(root, path)? else {
        return Ok(());
    };
    let at = proc_path(&target);
    let masked = if at.is_dir() {
        mount(
            Some("tmpfs"),
            &at,
            Some("tmpfs"),
            MsFlags::MS_RDONLY,
            None::<&str>,
        )
    } else {
        mount(
            Some("/dev/null"),
            &at,
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
fn bind_one(root: &Rootfs, m: &crate::init_spec::MountSpec) -> Result<(), String> {
    // A subPath's file, held until the bind: mounted through its descriptor.
    let beneath;
    let source = match &m.source_beneath {
        Some(base) => {
            let base_dir =
                Rootfs::open(Path::new(base)).map_err(|e| format!("open {base}: {e}"))?;
            let found = base_dir
                .find(&m.source)
                .map_err(|e| format!("look up {} in {base}: {e}", m.source))?;
            beneath = match found {
                Some(fd) => fd,
                // As the kubelet makes a missing subPath: directories of the volume root's
                // permission bits (a non-root user of the pod's fsGroup writes there).
                None => {
                    let root_mode = nix::sys::stat::stat(Path::new(base))
                        .map_err(|e| format!("stat {base}: {e}"))?
                        .st_mode;
                    base_dir
                        .make_dir_with_mode(
                            &m.source,
                            nix::sys::stat::Mode::from_bits_truncate(root_mode & 0o777),
                        )
                        .map_err(|e| format!("make {} in {base}: {e}", m.source))?
                }
            };
            proc_path(&beneath)
        }
        None => PathBuf::from(&m.source),
    };
    let source = source.as_path();
    let target = if source.is_dir() {
        root.make_dir(&m.destination)
    } else {
        root.make_file(&m.destination)
    }
    .map_err(|e| format!("create mount point {}: {e}", m.destination))?;
    let (flags, _) = parse_mount_options(&m.options);
    mount(
        Some(source),
        &proc_path(&target),
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("bind {}: {e}", m.destination))?;
    let rro = m.options.iter().any(|o| o == "rro");
    if !rro && !flags.contains(MsFlags::MS_RDONLY) {
        return Ok(());
    }
    // Held until the remount: its /proc/self/fd path is what names the mount.
    let mounted = mounted_at(root, &m.destination)?;
    let at = proc_path(&mounted);
    if rro {
        return readonly_recursively(&at)
            .map_err(|e| format!("make {} read-only with its submounts: {e}", m.destination));
    }
    mount(
        None::<&str>,
        &at,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| format!("make {} read-only: {e}", m.destination))
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
/// and owner (whatever was at the path is replaced), in the directory the path resolves to
/// beneath the rootfs.
fn make_device_node(root: &Rootfs, node: &DeviceNode) -> Result<(), String> {
    use nix::sys::stat::{makedev, Mode, SFlag};
    let what = format!("device {} at {}", node.guest_name, node.path);
    let (dir, name) = root
        .parent_of(&node.path)
        .map_err(|e| format!("{what}: mkdir: {e}"))?
        .ok_or_else(|| format!("{what}: not a file's path"))?;
    if nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
        nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| format!("{what}: remove old: {e}"))?;
    }
    let mode = Mode::from_bits_truncate(node.file_mode);
    let device = makedev(node.major.into(), node.minor.into());
    make_node(&dir, name, SFlag::S_IFBLK, mode, device, node.uid, node.gid)
        .map_err(|e| format!("{what}: {e}"))
}

/// `mknodat` in `dir`, then the mode (mknod applies the umask) and the owner.
fn make_node(
    dir: &OwnedFd,
    name: &OsStr,
    kind: nix::sys::stat::SFlag,
    mode: nix::sys::stat::Mode,
    device: libc::dev_t,
    uid: u32,
    gid: u32,
) -> Result<(), String> {
    nix::sys::stat::mknodat(dir, name, kind, mode, device).map_err(|e| format!("mknod: {e}"))?;
    nix::sys::stat::fchmodat(
        dir,
        name,
        mode,
        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
    )
    .or_else(|e| match e {
        // Linux before 6.6 takes no flag here; the name is the node just made.
        nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EINVAL => nix::sys::stat::fchmodat(
            dir,
            name,
            mode,
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        ),
        other => Err(other),
    })
    .map_err(|e| format!("chmod: {e}"))?;
    nix::unistd::fchownat(
        dir,
        name,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| format!("chown: {e}"))
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
/// guest's `/dev` (`from`, recursively), with its mode and owner, as runc gives one the
/// host's, at `to` beneath the rootfs. The console stays the container's own; what the
/// container's /dev already has is kept, and a link there is not followed.
fn copy_guest_devices(from: &Path, root: &Rootfs, to: &str) -> Result<(), String> {
    use nix::sys::stat::{Mode, SFlag};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Some(dir) = in_rootfs(root, to)?.filter(|d| proc_path(d).is_dir()) else {
        return Ok(());
    };
    let entries = std::fs::read_dir(from).map_err(|e| format!("read {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("read {}: {e}", from.display()))?;
        let name = entry.file_name();
        let source = entry.path();
        let meta = entry
            .metadata()
            .map_err(|e| format!("stat {}: {e}", source.display()))?;
        let kind = meta.file_type();
        let there = nix::sys::stat::fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()));
        let target = format!("{to}/{}", name.to_string_lossy());
        if kind.is_dir() {
            if NOT_DEVICES.iter().any(|n| name == *n) {
                continue;
            }
            match there {
                None => {
                    nix::sys::stat::mkdirat(&dir, name.as_os_str(), Mode::from_bits_truncate(0o755))
                        .map_err(|e| format!("mkdir {target}: {e}"))?
                }
                Some(SFlag::S_IFDIR) => {}
                // A file or a link of the image's: left as it is.
                Some(_) => continue,
            }
            copy_guest_devices(&source, root, &target)?;
            continue;
        }
        let flag = if kind.is_char_device() {
            SFlag::S_IFCHR
        } else if kind.is_block_device() {
            SFlag::S_IFBLK
        } else {
            continue;
        };
        if name == "console" || there.is_some() {
            continue;
        }
        let mode = Mode::from_bits_truncate(meta.mode());
        make_node(&dir, &name, flag, mode, meta.rdev(), meta.uid(), meta.gid())
            .map_err(|e| format!("{target}: {e}"))?;
    }
    Ok(())
}

fn populate_dev(root: &Rootfs) -> Result<(), String> {
    let Some(dev) = in_rootfs(root, "/dev")?.filter(|d| proc_path(d).is_dir()) else {
        return Ok(());
    };
    for name in DEVICES {
        let target = root
            .make_file(&format!("/dev/{name}"))
            .map_err(|e| format!("create /dev/{name}: {e}"))?;
        let source = Path::new("/dev").join(name);
        mount(
            Some(&source),
            &proc_path(&target),
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
        if nix::sys::stat::fstatat(&dev, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_err() {
            nix::unistd::symlinkat(to, &dev, name)
                .map_err(|e| format!("symlink /dev/{name}: {e}"))?;
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
        let (from, to) = (dir.join("guest-dev"), dir.join("rootfs/dev"));
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

        let root = Rootfs::open(&dir.join("rootfs")).unwrap();
        copy_guest_devices(&from, &root, "/dev").unwrap();

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

    /// An image whose `/dev` is a link out of the rootfs (`../outside`) gets its devices
    /// beneath the rootfs or not at all, never beside it.
    #[test]
    fn devices_are_made_beneath_the_rootfs_whatever_its_links() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let dir = tempfile::tempdir().unwrap();
        let (from, rootfs, outside) = (
            dir.path().join("guest-dev"),
            dir.path().join("rootfs"),
            dir.path().join("outside"),
        );
        for d in [&from, &rootfs, &outside] {
            std::fs::create_dir_all(d).unwrap();
        }
        mknod(
            &from.join("vdb"),
            SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o660),
            makedev(254, 16),
        )
        .unwrap();
        std::os::unix::fs::symlink("../outside", rootfs.join("dev")).unwrap();
        let root = Rootfs::open(&rootfs).unwrap();
        copy_guest_devices(&from, &root, "/dev").unwrap();
        populate_dev(&root).unwrap();
        let node = DeviceNode {
            path: "/dev/../../outside/vdc".into(),
            guest_name: "vdc".into(),
            major: 254,
            minor: 32,
            file_mode: 0o600,
            uid: 0,
            gid: 0,
        };
        make_device_node(&root, &node).unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "made outside the rootfs"
        );
        // `/dev/../../outside/vdc` is `/outside/vdc` of the rootfs.
        assert!(rootfs.join("outside/vdc").symlink_metadata().is_ok());
    }
}
