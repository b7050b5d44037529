//! The ttrpc `Agent` service: requests become calls on [`Containers`] ([`wire`]: each
//! ttrpc method to its call here, errors to their ttrpc codes).

#[cfg(test)]
mod tests;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use vmlet_protocol::agent::{
    self as proto, ContainerRequest, CreateContainerRequest, CreateContainerResponse,
    CreateExecRequest, Empty, ProcessRef, RemoveContainerRequest, ResizeTerminalRequest,
    SignalProcessRequest, StartProcessRequest, StartProcessResponse, StatsResponse,
    UpdateResourcesRequest, WaitProcessRequest, WaitProcessResponse,
};
use vmlet_protocol::{agent_ttrpc, AGENT_PORT};

use crate::boot::Boot;
use crate::cgroup::Cgroup;
use crate::containers::{Container, Containers, Process};
use crate::exec_server_handle::ExecServer;
use crate::init_spec::{InitSpec, MountSpec, ProcessSpec};
use crate::launch::{launch, Helper};
use crate::pod_volumes::{PodVolumes, POD_VOLUMES_DIR};
use crate::process_stdio::{console_size, stdio_for, Terminal};
use crate::reaper::Reaper;
use crate::request_specs::{init_spec, process_spec};
use crate::Error;

/// What [`AgentService::launch`] starts.
enum Start<'a> {
    /// A container's init, by cloning this binary as `helper`.
    Init(Helper, &'a InitSpec),
    /// An exec process, cloned by its container's exec server, in the container whose init
    /// has the PID given.
    Exec(&'a ExecServer, &'a ProcessSpec, i32),
}

/// Runs `f` on tokio's blocking threads (it waits on a child or the kernel).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Boot(format!("join: {e}")))
}

pub struct AgentService {
    share: Option<PathBuf>,
    faults: crate::boot::Faults,
    containers: Arc<Containers>,
    reaper: Arc<Reaper>,
    pod_volumes: PodVolumes,
    clock: crate::clock::GuestClock,
}

/// Serves the agent until a fatal error.
pub async fn serve(boot: Boot) -> Result<(), Error> {
    if boot.faults.slow_boot {
        tokio::time::sleep(crate::boot::SLOW_BOOT).await;
    }
    if let Err(e) = crate::network::loopback_up().await {
        log::warn!("loopback: {e}");
    }
    // Without it every container create fails, naming the cgroup it could not make.
    if let Err(e) = crate::cgroup::init() {
        log::error!("cgroups: {e}");
    }
    let reaper = Arc::new(Reaper::default());
    tokio::spawn(reaper.clone().run());
    let containers = Arc::new(Containers::default());
    let service = Arc::new(AgentService {
        share: boot.share,
        faults: boot.faults,
        containers: containers.clone(),
        reaper,
        pod_volumes: PodVolumes::new(POD_VOLUMES_DIR),
        clock: Default::default(),
    });
    let gate = crate::host_gate::Gate::new(boot.key);
    // Every port is bound before the agent reports ready.
    let ttrpc_port = crate::host_gate::listen(AGENT_PORT, "ttrpc")?;
    let stream_port = crate::streams::listen()?;
    let forward_port = crate::forward::listen()?;
    // Kept for the agent's life: dropping the server stops it.
    let _server =
        crate::host_gate::start_ttrpc(gate.clone(), ttrpc_port, agent_ttrpc::create_agent(service))
            .await?;
    let forward = crate::forward::serve(gate.clone(), forward_port);
    tokio::spawn(async move {
        if let Err(e) = forward.await {
            log::error!("port-forward: {e}");
        }
    });
    log::info!("{} {AGENT_PORT}", vmlet_protocol::READY_LINE);
    crate::streams::serve(gate, stream_port, containers).await
}

impl AgentService {
    async fn create(&self, req: CreateContainerRequest) -> Result<CreateContainerResponse, Error> {
        let id = req.container_id.clone();
        if id.is_empty() {
            return Err(Error::InvalidRequest("empty container id".into()));
        }
        if self.containers.contains(&id) {
            return Err(Error::ContainerExists(id));
        }
        let share = self
            .share
            .as_deref()
            .ok_or_else(|| Error::InvalidRequest("this VM has no shared directory".into()))?;
        let mut spec = init_spec(share, &self.pod_volumes, &req)?;
        for volume in req.mounts.iter().filter_map(|m| m.pod_volume.as_ref()) {
            self.pod_volumes.ensure(volume)?;
        }
        if self.faults.share_in_containers {
            // A compromised guest: every container can write where the agent can.
            spec.mounts.push(MountSpec {
                destination: crate::boot::EXPOSED_SHARE.into(),
                fstype: "bind".into(),
                source: share.to_string_lossy().into_owned(),
                options: vec!["rbind".into()],
                source_beneath: None,
            });
        }
        if !req.join_namespaces.is_empty() {
            let sandbox = self.containers.get(&req.join_namespaces_of)?;
            if sandbox.init.exit_status().is_some() {
                return Err(Error::WrongState {
                    id: req.join_namespaces_of.clone(),
                    state: "stopped",
                    action: "share its namespaces",
                });
            }
            spec.join_namespaces = req.join_namespaces.clone();
            spec.join_pid = sandbox.init.pid();
        }
        spec.devices = crate::block_devices::resolve(&req.block_devices).await?;
        let helper = if spec.join_namespaces.iter().any(|n| n == "pid") {
            Helper::ContainerInitInPodPidNamespace
        } else {
            Helper::ContainerInit
        };
        let cgroup = Cgroup::create(&id)?;
        let launched = async {
            cgroup.apply(&req.resources.clone().unwrap_or_default())?;
            self.launch(
                Start::Init(helper, &spec),
                // The rootfs is not set up yet: the guest's devpts.
                if spec.process.terminal {
                    Terminal::Guest(console_size(req.process.as_ref()))
                } else {
                    Terminal::None
                },
                req.stdio.as_ref(),
                &cgroup,
                &id,
            )
            .await
        }
        .await;
        let process = match launched {
            Ok(p) => p,
            Err(e) => {
                let _ = cgroup.remove();
                return Err(e);
            }
        };
        let pid = process.pid();
        self.containers.insert(
            &id,
            Container::new(process, cgroup, spec.process.seccomp.clone()),
        )?;
        log::info!("container {id} created, pid {pid}");
        Ok(CreateContainerResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    /// Starts a container init, or an exec process through its container's exec server,
    /// with its stdio and waits until it is ready for the start signal.
    async fn launch(
        &self,
        start: Start<'_>,
        terminal: Terminal<'_>,
        stdio: Option<&proto::Stdio>,
        cgroup: &Cgroup,
        id: &str,
    ) -> Result<Arc<Process>, Error> {
        let (child, host, pty) = stdio_for(stdio, terminal)?;
        let (pid, launched, exit) = match start {
            // In its cgroup before it reads its spec: its cgroup namespace is rooted there.
            Start::Init(helper, spec) => self
                .reaper
                .track(|| launch(helper, spec, child, |pid| cgroup.add(pid)))?,
            Start::Exec(server, spec, init) => {
                // A round trip to the server (a clone), bounded by its answer timeout.
                let (pid, launched) =
                    tokio::task::block_in_place(|| server.request(id, spec, child))?;
                let exit = self.reaper.adopt(pid);
                // Before it may start: everything it forks is counted there.
                if let Err(e) = cgroup.add_exec(pid, init) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    return Err(e);
                }
                (pid, launched, exit)
            }
        };
        let process = Arc::new(Process::new(
            pid,
            exit,
            launched.start,
            launched.status,
            host,
            pty,
            cgroup.oom_kills(),
        ));
        let ready = {
            let process = process.clone();
            let id = id.to_owned();
            let reaper = self.reaper.clone();
            blocking(move || process.await_ready(&id, &reaper)).await?
        };
        // A helper that handed over may have cloned before it was in the cgroup.
        let ready = ready.and_then(|handed_over| handed_over.map_or(Ok(()), |p| cgroup.add(p)));
        if let Err(e) = ready {
            let _ = kill(Pid::from_raw(process.pid()), Signal::SIGKILL);
            return Err(e);
        }
        Ok(process)
    }

    async fn create_exec(&self, req: CreateExecRequest) -> Result<Empty, Error> {
        let container = self.containers.get(&req.container_id)?;
        if req.exec_id.is_empty() || req.exec_id.contains(char::is_whitespace) {
            return Err(Error::InvalidRequest(format!(
                "exec id {:?} must be non-empty and without spaces",
                req.exec_id
            )));
        }
        let name = format!("{}/{}", req.container_id, req.exec_id);
        if container.execs.lock().unwrap().contains_key(&req.exec_id) {
            return Err(Error::ContainerExists(name));
        }
        if container.init.exit_status().is_some() {
            return Err(Error::WrongState {
                id: req.container_id.clone(),
                state: "stopped",
                action: "exec in it",
            });
        }
        let spec = ProcessSpec {
            // As runc: an exec runs under its container's filter.
            seccomp: container.seccomp.clone(),
            ..process_spec(req.process.as_ref())?
        };
        // An exec's terminal comes from its container's devpts where it has one, so that
        // `tty` inside names it.
        let ptmx = PathBuf::from(format!("/proc/{}/root/dev/pts/ptmx", container.init.pid()));
        let size = console_size(req.process.as_ref());
        let terminal = match (spec.terminal, ptmx.exists()) {
            (false, _) => Terminal::None,
            (true, true) => Terminal::Devpts(&ptmx, size),
            (true, false) => Terminal::Guest(size),
        };
        let server = self.exec_server(&container, &req.container_id).await?;
        let process = self
            .launch(
                Start::Exec(&server, &spec, container.init.pid()),
                terminal,
                req.stdio.as_ref(),
                &container.cgroup,
                &name,
            )
            .await?;
        let mut execs = container.execs.lock().unwrap();
        if execs.contains_key(&req.exec_id) {
            let _ = kill(Pid::from_raw(process.pid()), Signal::SIGKILL);
            return Err(Error::ContainerExists(name));
        }
        execs.insert(req.exec_id.clone(), process);
        log::info!("exec {name} created");
        Ok(Empty::default())
    }

    /// The container's exec server, started (or started again, if it died) here.
    async fn exec_server(&self, container: &Container, id: &str) -> Result<Arc<ExecServer>, Error> {
        let mut slot = container.exec_server.lock().await;
        if let Some(server) = slot.as_ref().filter(|s| s.is_running()) {
            return Ok(server.clone());
        }
        let (reaper, init_pid, id) = (self.reaper.clone(), container.init.pid(), id.to_owned());
        let server = blocking(move || ExecServer::start(&reaper, init_pid, &id)).await??;
        let server = Arc::new(server);
        *slot = Some(server.clone());
        Ok(server)
    }

    fn remove_exec(&self, req: ProcessRef) -> Result<Empty, Error> {
        let container = self.containers.get(&req.container_id)?;
        let mut execs = container.execs.lock().unwrap();
        let name = format!("{}/{}", req.container_id, req.exec_id);
        let process = execs
            .get(&req.exec_id)
            .ok_or_else(|| Error::ProcessNotFound(name.clone()))?;
        if process.exit_status().is_none() && process.is_started() {
            return Err(Error::WrongState {
                id: name,
                state: "running",
                action: "remove it",
            });
        }
        if let Some(p) = execs.remove(&req.exec_id) {
            if !p.is_started() {
                // A helper that never got the start signal gives up when its pipe closes.
                p.abandon();
            }
        }
        Ok(Empty::default())
    }

    fn resize(&self, req: ResizeTerminalRequest) -> Result<Empty, Error> {
        let r = req.process.unwrap_or_default();
        let process = self.containers.process(&r.container_id, &r.exec_id)?;
        let master = process.pty.as_ref().ok_or_else(|| {
            Error::InvalidRequest(format!(
                "process {}/{} has no terminal",
                r.container_id, r.exec_id
            ))
        })?;
        crate::pty::resize(master, req.width, req.height)?;
        Ok(Empty::default())
    }

    async fn start(&self, req: StartProcessRequest) -> Result<StartProcessResponse, Error> {
        let r = req.process.unwrap_or_default();
        let process = self.containers.process(&r.container_id, &r.exec_id)?;
        let id = if r.exec_id.is_empty() {
            r.container_id.clone()
        } else {
            format!("{}/{}", r.container_id, r.exec_id)
        };
        let p = process.clone();
        blocking(move || p.start(&id)).await??;
        Ok(StartProcessResponse {
            pid: process.pid() as u32,
            ..Default::default()
        })
    }

    async fn wait(&self, req: WaitProcessRequest) -> Result<WaitProcessResponse, Error> {
        let r = req.process.unwrap_or_default();
        let container = self.containers.get(&r.container_id)?;
        let process = self.containers.process(&r.container_id, &r.exec_id)?;
        let exit_status = process.wait().await;
        Ok(WaitProcessResponse {
            exit_status,
            oom_killed: container.cgroup.oom_kills() > process.oom_kills_before,
            ..Default::default()
        })
    }

    fn stats(&self, req: ContainerRequest) -> Result<StatsResponse, Error> {
        self.containers.get(&req.container_id)?.cgroup.stats()
    }

    async fn freeze(&self, req: ContainerRequest, frozen: bool) -> Result<Empty, Error> {
        let container = self.containers.get(&req.container_id)?;
        if container.init.exit_status().is_some() {
            return Err(Error::WrongState {
                id: req.container_id,
                state: "stopped",
                action: if frozen { "pause it" } else { "resume it" },
            });
        }
        let cgroup = container.cgroup.clone();
        blocking(move || cgroup.freeze(frozen)).await??;
        Ok(Empty::default())
    }

    fn update(&self, req: UpdateResourcesRequest) -> Result<Empty, Error> {
        let container = self.containers.get(&req.container_id)?;
        container.cgroup.apply(&req.resources.unwrap_or_default())?;
        Ok(Empty::default())
    }

    fn signal(&self, req: SignalProcessRequest) -> Result<Empty, Error> {
        let r = req.process.clone().unwrap_or_default();
        let process = self.containers.process(&r.container_id, &r.exec_id)?;
        let signal = Signal::try_from(req.signal as i32)
            .map_err(|_| Error::InvalidRequest(format!("unknown signal {}", req.signal)))?;
        if process.exit_status().is_some() {
            return Err(Error::ProcessNotFound(r.container_id));
        }
        if self.faults.ignore_signals {
            log::warn!(
                "fault ignore-signals: not sending {signal} to {}",
                r.container_id
            );
            return Ok(Empty::default());
        }
        let own = process.pid();
        let targets = if req.all {
            let mut pids = self.containers.get(&r.container_id)?.cgroup.pids();
            if !pids.contains(&own) {
                pids.push(own);
            }
            pids
        } else {
            vec![own]
        };
        for pid in targets {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) => {}
                Err(nix::errno::Errno::ESRCH) if pid != own => {}
                Err(nix::errno::Errno::ESRCH) => {
                    return Err(Error::ProcessNotFound(r.container_id.clone()))
                }
                Err(e) => return Err(Error::io("kill", e.into())),
            }
        }
        Ok(Empty::default())
    }

    async fn remove(&self, req: RemoveContainerRequest) -> Result<Empty, Error> {
        let container = self.containers.get(&req.container_id)?;
        // Its exec server exits when its socket closes.
        drop(container.exec_server.lock().await.take());
        if container.init.exit_status().is_none() {
            let _ = kill(Pid::from_raw(container.init.pid()), Signal::SIGKILL);
            container.init.wait().await;
        }
        self.containers.remove(&req.container_id);
        // What the init left (in a pod's shared PID namespace its children outlive it), and
        // what the container moved into cgroups of its own; the removal waits (2 s at most)
        // for them to be reaped, off the runtime's threads.
        let cgroup = container.cgroup.clone();
        let removed = blocking(move || {
            cgroup.kill_all();
            cgroup.remove()
        })
        .await?;
        if let Err(e) = removed {
            log::warn!("container {}: {e}", req.container_id);
        }
        Ok(Empty::default())
    }
}
