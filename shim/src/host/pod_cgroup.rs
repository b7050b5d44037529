//! The pod's host cgroup: the sandbox spec's `linux.cgroupsPath`, made in every cgroup
//! hierarchy of the host (v1 controllers and the unified v2 one), and every host process
//! of the pod's VM moved into it (QEMU, virtiofsd, vhost-device-vsock, the pod's host
//! process, `qemu-img` copying a VM image onto a persistent root), as Kata's
//! `sandbox_cgroup_only` does: kubelet's limits, eviction and stats
//! then see the VM. The sandbox's own resources (a pause container's) are not applied:
//! the pod's limits are on the parent cgroup kubelet made.

use std::path::{Component, Path, PathBuf};

use crate::Error;

/// The pod's cgroup: its path below each hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    pub path: PathBuf,
}

/// Where the host's cgroup hierarchies are mounted (cgroup v1 controllers and cgroup2),
/// from `/proc/self/mountinfo`.
pub fn hierarchies() -> Vec<PathBuf> {
    match crate::host::share::read_mountinfo() {
        Ok(info) => hierarchies_in(&info),
        Err(e) => {
            // Without them no pod cgroup is made or read: said, not taken silently.
            log::warn!("the node's cgroup hierarchies: read /proc/self/mountinfo: {e}");
            Vec::new()
        }
    }
}

fn hierarchies_in(mountinfo: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = after.split(' ').next().unwrap_or_default();
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        // Only a hierarchy's root (a bind of a sub-cgroup would misplace paths).
        let mut fields = before.split(' ');
        let (root, point) = (fields.nth(3), fields.next());
        if let (Some("/"), Some(point)) = (root, point) {
            found.push(PathBuf::from(point));
        }
    }
    found
}

impl PodCgroup {
    /// The cgroup a spec's `cgroupsPath` names: a cgroupfs path (`/kubepods/pod1/abc`), or
    /// systemd's `slice:prefix:name` expanded as runc expands it
    /// (`kubepods-pod1.slice:cri-containerd:abc` ->
    /// `/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope`). Anything that would
    /// leave the hierarchy (`..`) is INVALID_ARGUMENT.
    pub fn from_spec_path(cgroups_path: &str) -> Result<Self, Error> {
        let bad =
            |why: &str| Error::InvalidArgument(format!("cgroupsPath {cgroups_path:?}: {why}"));
        let path = match cgroups_path.split(':').collect::<Vec<_>>()[..] {
            [path] => PathBuf::from("/").join(path.trim_start_matches('/')),
            [slice, prefix, name] => {
                let mut path = expand_slice(slice).map_err(|why| bad(&why))?;
                let unit = if name.ends_with(".slice") {
                    name.to_owned()
                } else if prefix.is_empty() {
                    format!("{name}.scope")
                } else {
                    format!("{prefix}-{name}.scope")
                };
                path.push(unit);
                path
            }
            _ => return Err(bad("neither a path nor slice:prefix:name")),
        };
        let plain = path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain || path == Path::new("/") {
            return Err(bad("not a cgroup below the root"));
        }
        Ok(Self { path })
    }

    fn relative(&self) -> &Path {
        self.path.strip_prefix("/").unwrap_or(&self.path)
    }

    /// This cgroup in each hierarchy.
    pub fn dirs(&self) -> Vec<PathBuf> {
        hierarchies()
            .iter()
            .map(|h| h.join(self.relative()))
            .collect()
    }

    /// Makes the cgroup in every hierarchy, level by level (a new v1 cpuset cgroup gets
    /// its parent's CPUs and memory nodes, without which nothing can join it); where the
    /// hierarchy has the v1 memory controller, the charges of a process move with it.
    pub fn create(&self) -> Result<(), Error> {
        hierarchies()
            .iter()
            .try_for_each(|hierarchy| self.create_in(hierarchy))
    }

    fn create_in(&self, hierarchy: &Path) -> Result<(), Error> {
        // cgroup v2 has `cgroup.controllers` in every cgroup; its cpuset files start empty,
        // which means the parent's (and its root has no `cpuset.cpus` to copy).
        let v1 = !hierarchy.join("cgroup.controllers").exists();
        let mut dir = hierarchy.to_path_buf();
        for part in self.relative().iter() {
            let parent = dir.clone();
            dir.push(part);
            match std::fs::create_dir(&dir) {
                Ok(()) if v1 => inherit_cpuset(&parent, &dir)?,
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(format!("create cgroup {}", dir.display()), e)),
            }
        }
        let immigrate = dir.join("memory.move_charge_at_immigrate");
        if immigrate.exists() {
            // Deprecated in recent kernels, but where it works the VM's memory that
            // QEMU touched before it moved is counted for the pod too.
            let _ = std::fs::write(&immigrate, "3");
        }
        Ok(())
    }

    /// Moves the process `pid` (all its threads) into the cgroup in every hierarchy.
    pub fn add(&self, pid: u32, what: &str) -> Result<(), Error> {
        for dir in self.dirs() {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|e| {
                Error::io(
                    format!("move {what} ({pid}) into cgroup {}", dir.display()),
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// `cgroup.procs` of the cgroup in every hierarchy, open for writing: a child the shim
    /// starts joins the cgroup by writing `0` to each before its exec, so that nothing it
    /// forks runs outside it.
    pub fn procs_files(&self) -> Result<Vec<std::fs::File>, Error> {
        self.dirs()
            .into_iter()
            .map(|dir| {
                let path = dir.join("cgroup.procs");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| Error::io(format!("open {}", path.display()), e))
            })
            .collect()
    }

    /// Removes the cgroup from every hierarchy once its processes are gone (a process
    /// that is still exiting keeps it busy for a moment). Goes on past failures.
    pub fn remove(&self) -> Result<(), Error> {
        let deadline = std::time::Instant::now() + REMOVE_WAIT;
        let mut first = None;
        for dir in self.dirs().into_iter().rev() {
            if let Err(e) = remove_when_empty(&dir, deadline) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// A memory limit at or above this is none (cgroup v1 writes "unlimited" as 2^63 less a
/// page; v2 as `max`).
const UNLIMITED_BYTES: u64 = 1 << 62;

/// The memory limit on `path` in one hierarchy, `root`: the least of the limits of the
/// cgroup and its ancestors that exist there (v2 `memory.max`, v1 `memory.limit_in_bytes`).
fn memory_limit_in(root: &Path, path: &Path) -> Option<u64> {
    let mut least: Option<u64> = None;
    let mut dir = Some(path);
    while let Some(at) = dir {
        let cgroup = root.join(at.strip_prefix("/").unwrap_or(at));
        for file in ["memory.max", "memory.limit_in_bytes"] {
            let path = cgroup.join(file);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    // Not a limit that is not there: one that cannot be read.
                    log::warn!("memory limit of cgroup {}: {e}", path.display());
                    continue;
                }
            };
            if let Ok(bytes) = text.trim().parse::<u64>() {
                if bytes < UNLIMITED_BYTES {
                    least = Some(least.map_or(bytes, |l| l.min(bytes)));
                }
            }
        }
        dir = at.parent();
    }
    least
}

impl PodCgroup {
    /// What the pod's cgroup lets its processes use, in MiB: the least memory limit of the
    /// cgroup and its ancestors (the kubelet's pod cgroup: its containers' limits and the
    /// RuntimeClass's overhead), in any hierarchy; `None` when nothing limits it.
    pub fn memory_limit_mib(&self) -> Option<u64> {
        self.memory_limit_mib_under(&hierarchies())
    }

    fn memory_limit_mib_under(&self, hierarchies: &[PathBuf]) -> Option<u64> {
        hierarchies
            .iter()
            .filter_map(|h| memory_limit_in(h, &self.path))
            .min()
            .map(|bytes| bytes >> 20)
    }
}

/// Refuses a VM of `memory_mib` in a pod cgroup that allows less (`limit_mib`): the node's
/// OOM killer would end QEMU as soon as the guest touched it. A kubelet's pod cgroup holds
/// the containers' limits and the RuntimeClass's overhead; a pod that runs on vmlet without
/// a RuntimeClass (vmlet as containerd's default handler) has no overhead in it.
pub fn vm_fits(id: &str, memory_mib: u64, limit_mib: u64) -> Result<(), Error> {
    if memory_mib <= limit_mib {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "pod {id}: its VM needs {memory_mib} MiB of memory, but the pod's cgroup allows {limit_mib} MiB (its containers' limits, without room for the VM itself): give the pod a RuntimeClass whose handler is vmlet and whose overhead.podFixed covers the VM, as deploy/runtimeclass.yaml does"
    )))
}

/// A v1 cpuset cgroup starts with no CPUs and no memory nodes: copies its parent's.
fn inherit_cpuset(parent: &Path, dir: &Path) -> Result<(), Error> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        if !own.exists() {
            continue;
        }
        let value = std::fs::read_to_string(parent.join(file))
            .map_err(|e| Error::io(format!("read {}", parent.join(file).display()), e))?;
        std::fs::write(&own, value.trim())
            .map_err(|e| Error::io(format!("write {}", own.display()), e))?;
    }
    Ok(())
}

/// How long [`PodCgroup::remove`] waits, in all, for processes still on their way out.
const REMOVE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn remove_when_empty(dir: &Path, deadline: std::time::Instant) -> Result<(), Error> {
    let mut ended = false;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(Error::io(format!("remove cgroup {}", dir.display()), e))
            }
            Err(_) if !ended => {
                end_members(dir);
                ended = true;
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Ends what is still in the cgroup at `dir` of vmlet's own once the pod's teardown ended
/// what its journal recorded: a helper whose shim was killed between starting it and
/// recording it, or a process a helper forked (virtiofsd's sandbox). Only processes whose
/// executable is one of the programs the shim starts for a pod ([`HELPERS`]) are ended,
/// each through a pidfd taken while its PID is still listed in `cgroup.procs`: a cgroup
/// path a pod was given that holds anything else (only root can put a process there) keeps
/// it.
fn end_members(dir: &Path) {
    let members = || -> Vec<u32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    for pid in members() {
        let Ok(Some(pidfd)) = crate::host::pidfd::open_if_running(pid) else {
            continue;
        };
        // Still a member once the descriptor holds it: the descriptor's process is.
        if !members().contains(&pid) {
            continue;
        }
        let Some(program) = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|exe| Some(exe.file_name()?.to_string_lossy().into_owned()))
        else {
            continue;
        };
        if !is_helper(&program) {
            continue;
        }
        log::warn!(
            "cgroup {}: ending {pid} ({program}), left in it",
            dir.display()
        );
        let _ =
            crate::host::pidfd::signal(&pidfd, libc::SIGKILL, "a process left in the pod's cgroup");
    }
}

/// [`PodCgroup::procs_files`] of `cgroup`; none for a pod without a cgroup.
pub fn procs_files_of(cgroup: Option<&PodCgroup>) -> Result<Vec<std::fs::File>, Error> {
    cgroup.map_or(Ok(Vec::new()), PodCgroup::procs_files)
}

/// The programs the shim starts for a pod, by their executables' names, beside QEMU
/// (`qemu-system-ARCH`).
const HELPERS: [&str; 4] = ["virtiofsd", "vhost-device-vsock", "vmlet-netns", "qemu-img"];

fn is_helper(program: &str) -> bool {
    HELPERS.contains(&program)
        || program
            .strip_prefix("qemu-system-")
            .is_some_and(|arch| !arch.is_empty())
}

/// systemd's slice name to its path: `a-b-c.slice` -> `/a.slice/a-b.slice/a-b-c.slice`.
fn expand_slice(slice: &str) -> Result<PathBuf, String> {
    let mut path = PathBuf::from("/");
    if slice.is_empty() || slice == "-.slice" {
        return Ok(path);
    }
    let Some(name) = slice.strip_suffix(".slice") else {
        return Err(format!("{slice:?} is not a slice"));
    };
    if name.contains('/') || name.starts_with('-') || name.contains("--") {
        return Err(format!("bad slice name {slice:?}"));
    }
    let mut prefix = String::new();
    for part in name.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On cgroup v2 the root has no `cpuset.cpus` and a new cgroup's empty one is its
    /// parent's: nothing is copied (a CRI pod on Debian 13 failed here). On v1 the parent's
    /// CPUs and memory nodes are copied, without which no process could join.
    #[test]
    fn cpusets_are_copied_on_v1_only() {
        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cgroup.controllers"), "cpuset cpu memory\n").unwrap();
        let cgroup = PodCgroup::from_spec_path("/kubepods/pod1").unwrap();
        cgroup.create_in(v2.path()).unwrap();
        assert!(v2.path().join("kubepods/pod1").is_dir());

        let v1 = tempfile::tempdir().unwrap();
        std::fs::write(v1.path().join("cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(v1.path().join("cpuset.mems"), "0\n").unwrap();
        // A real v1 cgroupfs gives a new cgroup empty cpuset files; here the first level
        // has them already, made as the kernel would.
        std::fs::create_dir(v1.path().join("kubepods")).unwrap();
        for file in ["cpuset.cpus", "cpuset.mems"] {
            std::fs::write(v1.path().join("kubepods").join(file), "0-1").unwrap();
        }
        cgroup.create_in(v1.path()).unwrap();
        assert!(v1.path().join("kubepods/pod1").is_dir());
    }

    #[test]
    fn only_vmlets_helpers_left_in_the_cgroup_are_ended() {
        // A cgroup v1 directory as the teardown finds it, listing a helper the journal did
        // not record (a copy of sleep named as vhost-device-vsock) and a process that is
        // none of vmlet's (sleep itself).
        let dir = tempfile::tempdir().unwrap();
        let helper = dir.path().join("vhost-device-vsock");
        std::fs::copy("/bin/sleep", &helper).unwrap();
        let mut left = std::process::Command::new(&helper)
            .arg("100")
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        std::fs::write(
            dir.path().join("cgroup.procs"),
            format!("{}\n{}\n", left.id(), other.id()),
        )
        .unwrap();
        end_members(dir.path());
        let status = left.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(
            other.try_wait().unwrap().is_none(),
            "not vmlet's: left alone"
        );
        let _ = other.kill();
        let _ = other.wait();
        assert!(is_helper("qemu-system-x86_64") && is_helper("virtiofsd"));
        assert!(!is_helper("qemu-system-") && !is_helper("containerd") && !is_helper("virtiofsd2"));
    }

    #[test]
    fn cgroupfs_paths_and_systemd_slices() {
        let p = |s: &str| PodCgroup::from_spec_path(s).map(|c| c.path);
        assert_eq!(p("/default/t1").unwrap(), PathBuf::from("/default/t1"));
        assert_eq!(
            p("kubepods/besteffort/pod1/abc").unwrap(),
            PathBuf::from("/kubepods/besteffort/pod1/abc")
        );
        assert_eq!(
            p("kubepods-besteffort-pod1.slice:cri-containerd:abc").unwrap(),
            PathBuf::from(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            p("system.slice::x").unwrap(),
            PathBuf::from("/system.slice/x.scope")
        );
        for bad in ["/", "/a/../../etc", "a:b", "nots:p:n", "bad--x.slice:p:n"] {
            let err = PodCgroup::from_spec_path(bad).unwrap_err();
            assert!(
                err.message().contains("cgroupsPath"),
                "{bad}: {}",
                err.message()
            );
        }
    }

    #[test]
    fn a_vm_larger_than_the_pods_cgroup_is_refused_with_the_remedy() {
        vm_fits("p", 256, 416).unwrap();
        vm_fits("p", 256, 256).unwrap();
        let err = vm_fits("p", 256, 128).unwrap_err();
        assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
        let text = err.to_string();
        for part in [
            "256 MiB",
            "allows 128 MiB",
            "RuntimeClass",
            "overhead.podFixed",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    #[test]
    fn the_memory_limit_is_the_least_of_the_cgroup_and_its_ancestors() {
        let dir = tempfile::tempdir().unwrap();
        let (v1, v2) = (dir.path().join("memory"), dir.path().join("unified"));
        let write = |at: PathBuf, file: &str, value: &str| {
            std::fs::create_dir_all(&at).unwrap();
            std::fs::write(at.join(file), value).unwrap();
        };
        let cgroup = PodCgroup {
            path: PathBuf::from("/kubepods/burstable/pod1/sandbox"),
        };
        // Nothing limits it: the sandbox's own cgroup is not made yet, "max" and v1's
        // unlimited are none.
        write(v2.join("kubepods"), "memory.max", "max\n");
        write(
            v1.join("kubepods"),
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        assert_eq!(
            cgroup.memory_limit_mib_under(&[v1.clone(), v2.clone()]),
            None
        );
        // The kubelet's pod cgroup (v1) and a larger limit above it (v2).
        write(
            v1.join("kubepods/burstable/pod1"),
            "memory.limit_in_bytes",
            "134217728\n",
        );
        write(v2.join("kubepods/burstable"), "memory.max", "1073741824\n");
        assert_eq!(cgroup.memory_limit_mib_under(&[v1, v2]), Some(128));
    }

    #[test]
    fn hierarchies_are_cgroup_mount_roots() {
        let info = "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    32 25 0:27 /sub /mnt/sub rw - cgroup2 cgroup2 rw\n\
                    33 25 0:28 / /run rw - tmpfs tmpfs rw\n";
        assert_eq!(
            hierarchies_in(info),
            [
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/unified")
            ]
        );
    }
}
