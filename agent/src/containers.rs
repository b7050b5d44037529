//! The agent's table of containers and their processes.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::cgroup::Cgroup;
use crate::exec_server_handle::ExecServer;
use crate::helper_status::{read_ready, timed_out_or_io, Deadline, HELPER_DEADLINE};
use crate::init_spec::SeccompSpec;
use crate::process_stdio::HostEnds;
use crate::reaper::{ExitStatus, Reaper};
use crate::Error;

/// Where a process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Created,
    Running,
}

pub struct Process {
    /// The process's PID (a container init that handed over: its clone's, from then on).
    pid: AtomicI32,
    exit: Mutex<watch::Receiver<Option<ExitStatus>>>,
    phase: Mutex<Phase>,
    start: Mutex<Option<OwnedFd>>,
    status: Mutex<Option<OwnedFd>>,
    pub stdio: Mutex<HostEnds>,
    /// The pty master of a process with a terminal, for window-size changes.
    pub pty: Option<OwnedFd>,
    /// The container cgroup's OOM-kill count when this process was created.
    pub oom_kills_before: u64,
}

impl Process {
    pub fn new(
        pid: i32,
        exit: watch::Receiver<Option<ExitStatus>>,
        start: OwnedFd,
        status: OwnedFd,
        stdio: HostEnds,
        pty: Option<OwnedFd>,
        oom_kills_before: u64,
    ) -> Self {
        Self {
            pid: AtomicI32::new(pid),
            exit: Mutex::new(exit),
            phase: Mutex::new(Phase::Created),
            start: Mutex::new(Some(start)),
            status: Mutex::new(Some(status)),
            stdio: Mutex::new(stdio),
            pty,
            oom_kills_before,
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Whether the start signal was given (the process ran, or its exec failed).
    pub fn is_started(&self) -> bool {
        *self.phase.lock().unwrap() != Phase::Created || self.start.lock().unwrap().is_none()
    }

    /// Lets a helper that never got the start signal give up (it exits on EOF).
    pub fn abandon(&self) {
        drop(self.start.lock().unwrap().take());
        drop(self.status.lock().unwrap().take());
    }

    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.lock().unwrap().borrow()
    }

    /// Waits until the process has exited and returns its status.
    pub async fn wait(&self) -> ExitStatus {
        let mut rx = self.exit.lock().unwrap().clone();
        loop {
            if let Some(status) = *rx.borrow_and_update() {
                return status;
            }
            if rx.changed().await.is_err() {
                // The reaper never drops a sender without sending.
                return 255;
            }
        }
    }

    /// From now on this process is `pid` (a helper's CLONE_PARENT clone, which the agent's
    /// reaper collects): its PID and its exit.
    fn hand_over(&self, pid: i32, reaper: &Reaper) {
        self.pid.store(pid, Ordering::SeqCst);
        *self.exit.lock().unwrap() = reaper.adopt(pid);
    }

    /// Blocks until the init reports its rootfs ready, or returns its error. A helper that
    /// handed over to a clone of itself (`P<pid>` first) makes that clone this process;
    /// its PID is returned.
    pub fn await_ready(&self, id: &str, reaper: &Reaper) -> Result<Option<i32>, Error> {
        let mut guard = self.status.lock().unwrap();
        let fd = guard.as_ref().ok_or_else(|| Error::WrongState {
            id: id.into(),
            state: "not created",
            action: "wait for readiness",
        })?;
        let ready = read_ready(fd, id, |pid| self.hand_over(pid, reaper));
        if ready.is_err() {
            *guard = None;
        }
        ready
    }

    /// Tells the init (or exec process) to execute the process; blocks until the exec
    /// happened or failed.
    pub fn start(&self, id: &str) -> Result<(), Error> {
        let mut phase = self.phase.lock().unwrap();
        if *phase != Phase::Created {
            return Err(Error::WrongState {
                id: id.into(),
                state: "running",
                action: "start",
            });
        }
        let start = self.start.lock().unwrap().take();
        let status = self.status.lock().unwrap().take();
        let (Some(start), Some(status)) = (start, status) else {
            return Err(Error::WrongState {
                id: id.into(),
                state: "failed",
                action: "start",
            });
        };
        let mut start = std::fs::File::from(start);
        std::io::Write::write_all(&mut start, b"S")
            .map_err(|e| Error::io("signal container start", e))?;
        drop(start);
        let mut message = String::new();
        Deadline::new(std::fs::File::from(status), HELPER_DEADLINE)
            .take(64 * 1024)
            .read_to_string(&mut message)
            .map_err(|e| timed_out_or_io(e, id, "execute its process"))?;
        if let Some(error) = message.strip_prefix('E') {
            return Err(Error::ContainerSetup {
                id: id.into(),
                message: error.to_owned(),
            });
        }
        *phase = Phase::Running;
        Ok(())
    }
}

pub struct Container {
    pub init: Arc<Process>,
    pub execs: Mutex<HashMap<String, Arc<Process>>>,
    pub cgroup: Cgroup,
    /// The container's seccomp filter, which its execs take too.
    pub seccomp: Option<SeccompSpec>,
    /// Started at the first exec; dropping it (the container's removal) stops it.
    pub exec_server: tokio::sync::Mutex<Option<Arc<ExecServer>>>,
}

impl Container {
    pub fn new(init: Arc<Process>, cgroup: Cgroup, seccomp: Option<SeccompSpec>) -> Self {
        Self {
            init,
            execs: Mutex::new(HashMap::new()),
            cgroup,
            seccomp,
            exec_server: tokio::sync::Mutex::new(None),
        }
    }
}

#[derive(Default)]
pub struct Containers {
    map: Mutex<HashMap<String, Arc<Container>>>,
}

impl Containers {
    pub fn get(&self, id: &str) -> Result<Arc<Container>, Error> {
        self.map
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::ContainerNotFound(id.into()))
    }

    pub fn insert(&self, id: &str, container: Container) -> Result<(), Error> {
        let mut map = self.map.lock().unwrap();
        if map.contains_key(id) {
            return Err(Error::ContainerExists(id.into()));
        }
        map.insert(id.into(), Arc::new(container));
        Ok(())
    }

    pub fn contains(&self, id: &str) -> bool {
        self.map.lock().unwrap().contains_key(id)
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Container>> {
        self.map.lock().unwrap().remove(id)
    }

    /// The process named by a container id and an exec id (empty for the init).
    pub fn process(&self, container_id: &str, exec_id: &str) -> Result<Arc<Process>, Error> {
        let container = self.get(container_id)?;
        if exec_id.is_empty() {
            return Ok(container.init.clone());
        }
        let execs = container.execs.lock().unwrap();
        execs
            .get(exec_id)
            .cloned()
            .ok_or_else(|| Error::ProcessNotFound(format!("{container_id}/{exec_id}")))
    }
}
