//! A VM-mode pod's VM (docs/vm-mode.md) as the task service sees it ([`PodVm`]): one
//! container, which is the VM; its serial console is the container's stdout; it ends when
//! the guest powers off (status 0) or vmlet ends it (137). It has no agent, no share for
//! more containers, no hot-plugged devices and does not grow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use vmlet_config::NodeConfig;

use super::image_guest::ImageGuest;
use super::{boot, new_pod_state, reclaim_failed_boot, Recorder};
use crate::guest::stdio::{Copies, ProcessName, StdioPaths};
use crate::guest::Guest;
use crate::host::pod_cgroup::PodCgroup;
use crate::host::state::PodState;
use crate::task::phases::Phases;
use crate::vm::pod_vm::{BootRequest, NotShared, PodVm, SharedVm};
use crate::vmm::VmManager;
use crate::Error;

pub struct ImageVm {
    pod_id: String,
    container_id: String,
    host_pid: u32,
    holder_pid: Option<u32>,
    state: Mutex<PodState>,
    vmm: Arc<dyn VmManager>,
    tap_server: Option<super::net::TapServer>,
    dhcp: Mutex<Vec<vmlet_netns::dhcp_server::DhcpServer>>,
    guest: ImageGuest,
    /// The serial console: the container's stdout and stdin.
    console: crate::vm_mode::serial_console::SerialConsole,
    ended: tokio::sync::watch::Receiver<bool>,
    stopping: AtomicBool,
    /// The cgroup QEMU runs in (the container's), whose figures are the VM's stats.
    cgroup: Option<PodCgroup>,
    port_forward: Option<crate::guest::port_forward::PortForward>,
    /// QEMU, when the shim started it itself: held for the VM's life (dropped, it is
    /// killed).
    _qemu: Option<crate::host::qemu_process::QemuProcess>,
}

impl ImageVm {
    /// Boots the image in the rootfs of `req` with the pod network wired in. On failure
    /// everything created so far is removed before the error returns.
    pub async fn boot(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        req: BootRequest,
        phases: &Phases,
    ) -> Result<ImageVm, Error> {
        let image = req
            .image
            .clone()
            .ok_or_else(|| Error::Internal("a VM image's boot without an image".into()))?;
        let (paths, state) = new_pod_state(config, &req.pod_id, req.sandbox_id.as_deref()).await?;
        let recorder = Recorder {
            state: state.clone(),
            cgroup: req.cgroup.as_ref(),
        };
        let booted =
            match boot::run_image(config, vmm.clone(), &req, &image, &paths, &recorder, phases)
                .await
            {
                Ok(booted) => booted,
                Err(e) => return Err(reclaim_failed_boot(&vmm, &state, &req.pod_id, e).await),
            };
        let state = state.lock().unwrap().clone();
        Ok(ImageVm {
            cgroup: req.cgroup.clone(),
            pod_id: req.pod_id,
            container_id: req.container_id,
            host_pid: booted.qemu_pid,
            holder_pid: state.holder_pid(),
            state: Mutex::new(state),
            vmm,
            tap_server: booted.tap_server,
            port_forward: booted.port_forward,
            dhcp: Mutex::new(booted.dhcp),
            guest: ImageGuest {
                qmp: booted.hotplug.qmp().clone(),
                killed: Arc::new(AtomicBool::new(false)),
                execs: super::image_exec::ImageExecs::new(
                    crate::guest::guest_agent::GuestAgent::new(booted.guest_agent),
                ),
            },
            console: booted.console,
            ended: booted.ended,
            stopping: AtomicBool::new(false),
            _qemu: booted.qemu,
        })
    }
}

#[async_trait]
impl PodVm for ImageVm {
    fn pod_id(&self) -> &str {
        &self.pod_id
    }

    fn guest(&self) -> &dyn Guest {
        &self.guest
    }

    fn host_pid(&self) -> u32 {
        self.host_pid
    }

    fn holder_pid(&self) -> Option<u32> {
        self.holder_pid
    }

    fn has_ended(&self) -> bool {
        *self.ended.borrow()
    }

    async fn ended(&self) {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|e| *e).await;
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// QEMU's cgroup's figures: the VM's CPU and memory as the node sees them.
    fn host_stats(&self) -> Option<Result<vmlet_protocol::agent::StatsResponse, Error>> {
        let stats = match self.cgroup.as_ref() {
            None => Err(Error::Unimplemented(format!(
                "stats of {}: its spec names no cgroup for QEMU, whose figures would be the VM's",
                self.container_id
            ))),
            Some(cgroup) => crate::host::cgroup_stats::read(&cgroup.dirs()),
        };
        Some(stats)
    }

    fn end_status(&self) -> u32 {
        if self.is_stopping() {
            crate::vm::pod_vm::VM_ENDED_STATUS
        } else {
            self.guest.end_status()
        }
    }

    async fn kill(&self) -> Result<(), Error> {
        self.stopping.store(true, Ordering::SeqCst);
        super::end_vm(&self.state, &self.vmm).await
    }

    /// Stops the VM (the power button first, then libvirt's destroy) and removes everything
    /// the pod created: the overlay and the seed go with the state directory.
    async fn teardown(&self) -> Result<(), Error> {
        if let Some(server) = &self.tap_server {
            server.stop();
        }
        if let Some(forward) = &self.port_forward {
            forward.stop();
        }
        self.dhcp.lock().unwrap().clear();
        self.stopping.store(true, Ordering::SeqCst);
        let state = self.state.lock().unwrap().clone();
        super::power_off_and_reclaim(self, state, self.vmm.clone()).await
    }

    /// Its one container is the VM: no other joins it, and no memory limit reaches it (its
    /// size is its annotations'); its block devices are its own disks, plugged in by its
    /// boot.
    fn shared(&self) -> Result<&dyn SharedVm, NotShared> {
        Err(NotShared(format!(
            "a VM-mode pod (vmlet.io/image-type: vm) runs its one container, {}, as the VM and takes nothing else into it yet",
            self.container_id
        )))
    }

    /// The serial console as the container's stdout (from its first byte), and its stdin
    /// as the console's input.
    async fn attach_stdio(
        &self,
        process: ProcessName<'_>,
        namespace: &str,
        paths: &StdioPaths,
        _terminal: bool,
    ) -> Result<Copies, Error> {
        if !process.exec_id.is_empty() {
            // The QEMU guest agent's: its output once it exited, no stdin (refused at its
            // create).
            let outputs =
                crate::guest::stdio::open_outputs(paths, process.container_id, namespace)?;
            return self.guest.execs.attach(process.exec_id, outputs);
        }
        crate::vm_mode::serial_console::attach_console(&self.console, process, namespace, paths)
    }
}
