//! Containers' cgroups (v2, the guest's only hierarchy): one directory per container below
//! `/sys/fs/cgroup/vmlet`, holding its init and its exec processes. Limits, figures, the
//! OOM-kill count and freezing all come from these files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmlet_protocol::agent::{Resources, StatsResponse};
use vmlet_protocol::cgroup_stats::keyed;

use crate::Error;

const ROOT: &str = "/sys/fs/cgroup";
/// Parent of every container's cgroup; holds no processes itself (cgroup v2's rule).
const PARENT: &str = "vmlet";
/// Controllers containers get, where the kernel has them.
const CONTROLLERS: &[&str] = &["cpu", "memory", "pids", "io"];
/// The most cgroups a container may make below its own (`cgroup.max.descendants`), and
/// how deep (`cgroup.max.depth`): its processes are searched, and its cgroups removed, there.
const MAX_CGROUPS: usize = 256;
const MAX_DEPTH: usize = 8;

/// Enables the controllers for the containers' parent. Called once at boot.
pub fn init() -> Result<(), Error> {
    init_at(Path::new(ROOT))
}

fn init_at(root: &Path) -> Result<(), Error> {
    let available = read(&root.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<&str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    let missing: Vec<&str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !wanted.contains(c))
        .collect();
    if !missing.is_empty() {
        log::warn!(
            "cgroup controllers not in this kernel: {}",
            missing.join(" ")
        );
    }
    let enable = wanted
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    let parent = root.join(PARENT);
    write(&root.join("cgroup.subtree_control"), &enable)?;
    mkdir(&parent)?;
    write(&parent.join("cgroup.subtree_control"), &enable)
}

/// One container's cgroup.
#[derive(Debug, Clone)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Creates the cgroup of container `id` (an existing one is reused: a previous
    /// container of that id left it empty).
    pub fn create(id: &str) -> Result<Self, Error> {
        Self::create_at(&Path::new(ROOT).join(PARENT), id)
    }

    pub(crate) fn create_at(parent: &Path, id: &str) -> Result<Self, Error> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(Error::InvalidRequest(format!(
                "container id {id:?} cannot name a cgroup"
            )));
        }
        let cgroup = Self {
            path: parent.join(id),
        };
        if cgroup.path.exists() {
            // A container of that id whose removal failed left it: nothing of it (processes,
            // cgroups below, limits, a freeze) carries over to the new one.
            cgroup.kill_all();
            cgroup.remove()?;
        }
        mkdir(&cgroup.path)?;
        // What a privileged container may make below its own (which [`Cgroup::pids`] and
        // [`Cgroup::remove`] then walk); best effort where the kernel lacks the files.
        let _ = cgroup.set("cgroup.max.depth", &MAX_DEPTH.to_string());
        let _ = cgroup.set("cgroup.max.descendants", &MAX_CGROUPS.to_string());
        Ok(cgroup)
    }

    /// Kills every process of the cgroup and below it at once (`cgroup.kill`: no fork
    /// escapes it, no PID is looked up); a kernel without it gets the PIDs killed one by one.
    pub fn kill_all(&self) {
        if self.set("cgroup.kill", "1").is_err() {
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Applies limits; a zero or negative value means "no limit".
    pub fn apply(&self, r: &Resources) -> Result<(), Error> {
        let limit = |v: i64| {
            if v > 0 {
                v.to_string()
            } else {
                "max".to_owned()
            }
        };
        self.set("memory.max", &limit(r.memory_limit))?;
        let period = if r.cpu_period > 0 {
            r.cpu_period
        } else {
            100_000
        };
        self.set("cpu.max", &format!("{} {period}", limit(r.cpu_quota)))?;
        if r.cpu_weight > 0 {
            self.set("cpu.weight", &r.cpu_weight.clamp(1, 10_000).to_string())?;
        }
        self.set("pids.max", &limit(r.pids_limit))
    }

    /// Moves a process (and so its future children) into the cgroup.
    pub fn add(&self, pid: i32) -> Result<(), Error> {
        self.set("cgroup.procs", &pid.to_string())
    }

    /// Moves an exec process into the cgroup, or, when the container has made its cgroup a
    /// parent (controllers enabled below it: it may hold no process, EBUSY), into its init's
    /// cgroup below it, as runc does.
    pub fn add_exec(&self, pid: i32, init: i32) -> Result<(), Error> {
        match self.add(pid) {
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
                let text = read(Path::new(&format!("/proc/{init}/cgroup")))?;
                let beside = self.below(&text).ok_or_else(|| {
                    Error::InvalidRequest(format!(
                        "{} holds no process and the container's init is not below it",
                        self.path.display()
                    ))
                })?;
                // A frozen cgroup would hold the exec before it could say it is ready.
                let events = keyed(&read(&beside.join("cgroup.events"))?);
                if events.get("frozen") == Some(&1) {
                    return Err(Error::InvalidRequest(format!(
                        "the container's init is in {}, which is frozen",
                        beside.display()
                    )));
                }
                Cgroup { path: beside }.add(pid)
            }
            other => other,
        }
    }

    /// The directory of a `/proc/PID/cgroup` text's v2 cgroup (`0::/path`, read from the
    /// agent's cgroup namespace) when it is this one or below it.
    fn below(&self, proc_cgroup: &str) -> Option<PathBuf> {
        let relative = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
        let path = Path::new(ROOT).join(relative.trim_start_matches('/'));
        let clean = path.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
        (clean && path.starts_with(&self.path)).then_some(path)
    }

    /// The container's cgroup and those it made below itself (a privileged container may),
    /// deepest last; at most [`MAX_CGROUPS`] below it (what the kernel lets it make). What
    /// cannot be read is logged.
    fn tree(&self) -> Vec<PathBuf> {
        let mut found = vec![self.path.clone()];
        let mut next = 0;
        while next < found.len() {
            match std::fs::read_dir(&found[next]) {
                Ok(entries) => {
                    for entry in entries.flatten() {
                        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                            continue;
                        }
                        if found.len() > MAX_CGROUPS {
                            log::warn!(
                                "{}: more than {MAX_CGROUPS} cgroups below it; the rest are not searched",
                                self.path.display()
                            );
                            return found;
                        }
                        found.push(entry.path());
                    }
                }
                Err(e) if next > 0 => log::warn!("read {}: {e}", found[next].display()),
                Err(_) => {}
            }
            next += 1;
        }
        found
    }

    /// The guest PIDs of every process in the cgroup and below it (what `ps` and "signal
    /// all" cover, as for runc: also right when the container shares the pod's PID
    /// namespace, or has moved processes into cgroups of its own).
    pub fn pids(&self) -> Vec<i32> {
        self.tree()
            .iter()
            .flat_map(|dir| {
                read(&dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }

    /// How many processes of the cgroup the OOM killer killed so far.
    pub fn oom_kills(&self) -> u64 {
        keyed(&read(&self.path.join("memory.events")).unwrap_or_default())
            .get("oom_kill")
            .copied()
            .unwrap_or(0)
    }

    pub fn stats(&self) -> Result<StatsResponse, Error> {
        vmlet_protocol::cgroup_stats::read_stats(&self.path)
            .map_err(|e| Error::io(format!("read {}", e.path.display()), e.source))
    }

    /// Freezes (or thaws) every process of the cgroup and waits until the kernel reports it
    /// done.
    pub fn freeze(&self, frozen: bool) -> Result<(), Error> {
        let want = if frozen { "1" } else { "0" };
        self.set("cgroup.freeze", want)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let events = keyed(&read(&self.path.join("cgroup.events"))?);
            if events.get("frozen").copied() == Some(frozen as u64) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::io(
                    format!("{} did not report frozen={want}", self.path.display()),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Removes the (empty) cgroup and those below it, deepest first; processes that are
    /// still being reaped keep one busy for a moment.
    pub fn remove(&self) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(2);
        for dir in self.tree().iter().rev() {
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e)
                        if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) =>
                    {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(Error::io(format!("remove {}", dir.display()), e)),
                }
            }
        }
        Ok(())
    }

    fn set(&self, file: &str, value: &str) -> Result<(), Error> {
        write(&self.path.join(file), value)
    }
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|e| Error::io(format!("read {}", path.display()), e))
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(path, value)
        .map_err(|e| Error::io(format!("write {value:?} to {}", path.display()), e))
}

fn mkdir(path: &Path) -> Result<(), Error> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io(format!("create {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_written_as_the_kernel_expects() {
        let dir = std::env::temp_dir().join(format!("vmlet-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cg = Cgroup::create_at(&dir, "c1").unwrap();
        cg.apply(&Resources {
            memory_limit: 64 << 20,
            cpu_quota: 50_000,
            cpu_period: 0,
            cpu_weight: 20_000,
            pids_limit: -1,
            ..Default::default()
        })
        .unwrap();
        let file = |f: &str| std::fs::read_to_string(dir.join("c1").join(f)).unwrap();
        assert_eq!(file("memory.max"), "67108864");
        assert_eq!(file("cpu.max"), "50000 100000");
        assert_eq!(file("cpu.weight"), "10000");
        assert_eq!(file("pids.max"), "max");
        assert!(Cgroup::create_at(&dir, "../x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn processes_in_cgroups_the_container_made_below_its_own_are_its() {
        let dir = std::env::temp_dir().join(format!("vmlet-cg-tree-{}", std::process::id()));
        let c1 = dir.join("c1");
        std::fs::create_dir_all(c1.join("a/deeper")).unwrap();
        std::fs::create_dir_all(c1.join("b")).unwrap();
        std::fs::write(c1.join("cgroup.procs"), "").unwrap();
        std::fs::write(c1.join("a/cgroup.procs"), "7\n8\n").unwrap();
        std::fs::write(c1.join("a/deeper/cgroup.procs"), "9\n").unwrap();
        std::fs::write(c1.join("b/cgroup.procs"), "10\n").unwrap();
        let cg = Cgroup { path: c1 };
        let mut pids = cg.pids();
        pids.sort();
        assert_eq!(pids, vec![7, 8, 9, 10]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_exec_goes_beside_the_init_only_below_the_container() {
        let cg = Cgroup {
            path: PathBuf::from("/sys/fs/cgroup/vmlet/c1"),
        };
        assert_eq!(
            cg.below("0::/vmlet/c1/leaf\n"),
            Some(PathBuf::from("/sys/fs/cgroup/vmlet/c1/leaf"))
        );
        assert_eq!(
            cg.below("0::/vmlet/c1\n"),
            Some(PathBuf::from("/sys/fs/cgroup/vmlet/c1"))
        );
        assert_eq!(cg.below("0::/vmlet/c10/leaf\n"), None);
        assert_eq!(cg.below("0::/vmlet/c1/../c2\n"), None);
        assert_eq!(cg.below("0::/\n"), None);
        assert_eq!(cg.below("1:name=systemd:/vmlet/c1/x\n"), None);
    }
}
