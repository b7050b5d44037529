//! A VM-mode CRI pod's sandbox (docs/vm-mode.md) as the task service sees it ([`PodVm`]
//! and its [`Guest`]): no VM (the pod's one container boots the VM image, which comes with
//! it), only the pod's host process holding the pod network namespace, in the pod's cgroup.
//! The host process is the sandbox's process: its PID is the sandbox's, a signal goes to
//! it, and the sandbox ends when it does, with its exit status as the shim's reaper saw it.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use containerd_shim::asynchronous::monitor::{monitor_subscribe, monitor_unsubscribe};
use containerd_shim::monitor::{Subject, Topic};
use tokio::sync::watch;
use vmlet_config::NodeConfig;
use vmlet_protocol::agent::CreateContainerRequest;

use super::{block, host_setup, new_pod_state, reclaim_failed_boot, Recorder};
use crate::guest::stdio::{Copies, ProcessName, StdioPaths};
use crate::guest::{AgentCalls, Guest, GuestExit, NoAgent, ProcessId};
use crate::host::pidfd;
use crate::host::state::PodState;
use crate::vm::pod_vm::{ImagePod, NotShared, PodHold, PodVm, SharedVm};
use crate::vmm::VmManager;
use crate::Error;

pub struct HeldPod {
    pod_id: String,
    pod: ImagePod,
    holder: u32,
    /// The holder, as a pidfd: a signal never reaches a process that took its PID.
    holder_fd: OwnedFd,
    state: Mutex<PodState>,
    vmm: Arc<dyn VmManager>,
    /// The holder's exit status, once the shim's reaper saw it.
    exit: watch::Receiver<Option<u32>>,
    /// Set when the holder was signalled (its end is then expected).
    stopping: AtomicBool,
}

impl HeldPod {
    /// Makes the pod's state directory and cgroup and starts its host process (then its
    /// create hooks). On failure everything made is removed before the error returns.
    pub async fn make(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        req: PodHold,
    ) -> Result<HeldPod, Error> {
        let (paths, state) = new_pod_state(config, &req.pod_id, None).await?;
        let recorder = Recorder {
            state: state.clone(),
            cgroup: req.cgroup.as_ref(),
        };
        let held = async {
            host_setup::dir_and_cgroup(&paths, req.cgroup.as_ref(), &recorder)?;
            // Subscribed before the start, so that the reaper's report cannot come first.
            let mut exits = monitor_subscribe(Topic::Pid)
                .await
                .map_err(|e| Error::Internal(format!("subscribe to exits: {e}")))?;
            let started = host_setup::spawn_host_process(
                req.netns.clone(),
                &req.create_hooks,
                &req.hook_state,
                &recorder,
            )
            .await
            .and_then(|pid| Ok((pid, pidfd::open(pid)?)));
            let (pid, fd) = match started {
                Ok(started) => started,
                Err(e) => {
                    let _ = monitor_unsubscribe(exits.id).await;
                    return Err(e);
                }
            };
            let (tx, rx) = watch::channel(None);
            tokio::spawn(async move {
                while let Some(event) = exits.rx.recv().await {
                    if matches!(event.subject, Subject::Pid(p) if p == pid as i32) {
                        tx.send_replace(Some(event.exit_code as u32));
                        break;
                    }
                }
                let _ = monitor_unsubscribe(exits.id).await;
            });
            Ok::<_, Error>((pid, fd, rx))
        }
        .await;
        let (holder, holder_fd, exit) = match held {
            Ok(held) => held,
            Err(e) => return Err(reclaim_failed_boot(&vmm, &state, &req.pod_id, e).await),
        };
        log::info!(
            "pod {}: a VM-mode pod, held by its host process {holder} until its container boots the VM",
            req.pod_id
        );
        let state = state.lock().unwrap().clone();
        Ok(HeldPod {
            pod_id: req.pod_id,
            pod: req.pod,
            holder,
            holder_fd,
            state: Mutex::new(state),
            vmm,
            exit,
            stopping: AtomicBool::new(false),
        })
    }

    fn signal(&self, signal: i32) -> Result<(), Error> {
        self.stopping.store(true, Ordering::SeqCst);
        // Gone already is no error: its end is on its way.
        pidfd::signal(
            &self.holder_fd,
            signal,
            &format!("pod {}'s host process", self.pod_id),
        )
    }

    fn runs_nothing(&self, what: &str) -> Error {
        Error::Unimplemented(format!(
            "{what} in the sandbox of pod {}: a VM-mode pod's (vmlet.io/image-type: vm) sandbox runs nothing, its container is the VM",
            self.pod_id
        ))
    }
}

#[async_trait]
impl PodVm for HeldPod {
    fn pod_id(&self) -> &str {
        &self.pod_id
    }

    fn guest(&self) -> &dyn Guest {
        self
    }

    fn host_pid(&self) -> u32 {
        self.holder
    }

    fn holder_pid(&self) -> Option<u32> {
        Some(self.holder)
    }

    fn has_ended(&self) -> bool {
        self.exit.borrow().is_some()
    }

    async fn ended(&self) {
        let mut exit = self.exit.clone();
        let _ = exit.wait_for(Option::is_some).await;
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// The host process's own status (a signal's 128 + its number).
    fn end_status(&self) -> u32 {
        self.exit
            .borrow()
            .unwrap_or(crate::vm::pod_vm::VM_ENDED_STATUS)
    }

    async fn kill(&self) -> Result<(), Error> {
        self.signal(libc::SIGKILL)
    }

    /// Ends the host process and removes the state directory and the cgroup.
    async fn teardown(&self) -> Result<(), Error> {
        if !self.has_ended() {
            self.signal(libc::SIGKILL)?;
        }
        let state = self.state.lock().unwrap().clone();
        let vmm = self.vmm.clone();
        block(move || crate::host::reclaim::teardown(&*vmm, &state)).await?
    }

    /// It runs nothing: the pod's one container boots the VM.
    fn shared(&self) -> Result<&dyn SharedVm, NotShared> {
        Err(NotShared(
            "a VM-mode pod's (vmlet.io/image-type: vm) sandbox runs nothing, its container is the VM"
                .into(),
        ))
    }

    /// The host process writes nothing: no stream is copied.
    async fn attach_stdio(
        &self,
        _process: ProcessName<'_>,
        _namespace: &str,
        _paths: &StdioPaths,
        _terminal: bool,
    ) -> Result<Copies, Error> {
        Ok(Copies::default())
    }

    fn image_pod(&self) -> Option<&ImagePod> {
        Some(&self.pod)
    }
}

/// The sandbox's one process is the host process.
#[async_trait]
impl Guest for HeldPod {
    fn agent(&self) -> Result<&dyn AgentCalls, NoAgent> {
        Err(NoAgent(format!(
            "the sandbox of pod {} runs nothing: a VM-mode pod's (vmlet.io/image-type: vm) container is the VM",
            self.pod_id
        )))
    }

    async fn create_container(&self, _request: &CreateContainerRequest) -> Result<u32, Error> {
        Ok(self.holder)
    }

    async fn start_process(&self, process: &ProcessId) -> Result<u32, Error> {
        if !process.exec_id.is_empty() {
            return Err(self.runs_nothing("an exec"));
        }
        Ok(self.holder)
    }

    async fn wait_process(&self, _process: &ProcessId) -> Result<GuestExit, Error> {
        self.ended().await;
        Ok(GuestExit {
            status: self.end_status(),
            oom_killed: false,
        })
    }

    async fn signal_process(
        &self,
        _process: &ProcessId,
        signal: u32,
        _all: bool,
    ) -> Result<(), Error> {
        let signal = i32::try_from(signal)
            .ok()
            .filter(|s| (1..=64).contains(s))
            .ok_or_else(|| Error::InvalidArgument(format!("signal {signal}")))?;
        self.signal(signal)
    }

    async fn remove_container(&self, _container_id: &str) -> Result<(), Error> {
        Ok(())
    }

    /// Nothing to power off.
    async fn shutdown(&self) -> Result<(), Error> {
        Ok(())
    }
}
