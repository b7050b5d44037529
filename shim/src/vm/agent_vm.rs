//! The booted VM as the task service sees it ([`PodVm`]): stdio, block devices, memory,
//! containers in the share, the VM's end, and its teardown.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;

use super::Vm;
use crate::devices::block_devices::BlockDevice;
use crate::devices::memory::Fit;
use crate::guest::stdio::{Copies, ProcessName, StdioPaths};
use crate::guest::Guest;
use crate::host::share::{self, RootfsSource};
use crate::host::undo::Made;
use crate::vm::pod_vm::{NotShared, PodVm, SharedVm};
use crate::Error;

#[async_trait]
impl PodVm for Vm {
    fn pod_id(&self) -> &str {
        &self.pod_id
    }

    fn host_pid(&self) -> u32 {
        self.host_pid
    }

    fn holder_pid(&self) -> Option<u32> {
        self.holder_pid
    }

    /// vmlet's guest runs every container of the pod.
    fn shared(&self) -> Result<&dyn SharedVm, NotShared> {
        Ok(self)
    }

    async fn attach_stdio(
        &self,
        process: ProcessName<'_>,
        namespace: &str,
        paths: &StdioPaths,
        terminal: bool,
    ) -> Result<Copies, Error> {
        crate::guest::stdio::attach(&self.endpoint, process, namespace, paths, terminal).await
    }

    /// Whether QEMU is gone.
    fn has_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Resolves when QEMU is gone; logs it when the shim did not stop the VM itself.
    async fn ended(&self) {
        let mut ended = self.ended.clone();
        // An error means the monitor's reader is gone, which it only is after QEMU ended.
        let _ = ended.wait_for(|e| *e).await;
    }

    /// The pod's agent.
    fn guest(&self) -> &dyn Guest {
        &*self.guest
    }

    /// Whether the shim is stopping the VM itself.
    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Ends the VM at once (libvirt destroys it: QEMU is killed), for a guest that did not
    /// obey a SIGKILL of the pod; every process of the pod then ends with status 137.
    async fn kill(&self) -> Result<(), Error> {
        self.stopping.store(true, Ordering::SeqCst);
        super::end_vm(&self.state, &self.vmm).await
    }

    /// Stops the VM (the guest asked to power off first) and removes everything the pod
    /// created.
    async fn teardown(&self) -> Result<(), Error> {
        if let Some(server) = &self.tap_server {
            server.stop();
        }
        if let Some(forward) = &self.port_forward {
            forward.stop();
        }
        self.stopping.store(true, Ordering::SeqCst);
        let state = self.state.lock().unwrap().clone();
        super::power_off_and_reclaim(self, state, self.vmm.clone()).await
    }
}

#[async_trait]
impl SharedVm for Vm {
    /// Hot-plugs `container_id`'s block devices and returns what the agent needs to find
    /// them (nothing stays attached on failure).
    async fn attach_block_devices(
        &self,
        container_id: &str,
        devices: &[BlockDevice],
    ) -> Result<Vec<vmlet_protocol::agent::BlockDevice>, Error> {
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let fds = devices
            .iter()
            .map(crate::devices::block_devices::open_host)
            .collect::<Result<Vec<_>, _>>()?;
        self.hotplug.attach(container_id, devices, fds).await
    }

    /// Grows the VM when it must so that it holds `container_id`'s memory limit (MiB; none:
    /// unlimited) beside the pod's other containers' (see [`crate::devices::memory`]), then records
    /// the limit. A VM sized by `vmlet.io/memory` refuses what does not fit.
    async fn fit_memory(&self, container_id: &str, limit_mib: Option<u64>) -> Result<(), Error> {
        let _one_at_a_time = self.growing.lock().await;
        let fit = self.memory.lock().unwrap().fit(container_id, limit_mib)?;
        if let Fit::Grow { plugged_mib } = fit {
            // The pod's cgroup as it is now (a kubelet raises it before a resize).
            let cgroup = self.state.lock().unwrap().cgroup().map(Path::to_owned);
            if let Some(limit) = cgroup
                .and_then(|path| crate::host::pod_cgroup::PodCgroup { path }.memory_limit_mib())
            {
                crate::host::pod_cgroup::vm_fits(
                    &self.pod_id,
                    self.shape.memory_mib + plugged_mib,
                    limit,
                )?;
            }
            self.check_running()?;
            let started = Instant::now();
            crate::devices::memory::plug(
                self.hotplug.qmp(),
                plugged_mib,
                crate::devices::memory::PLUG_TIMEOUT,
            )
            .await?;
            log::info!(
                "pod {}: the VM grew to {} MiB for {container_id} (limit {limit_mib:?} MiB) in {:?}",
                self.pod_id,
                self.shape.memory_mib + plugged_mib,
                started.elapsed()
            );
        }
        self.memory
            .lock()
            .unwrap()
            .commit(container_id, limit_mib, fit);
        Ok(())
    }

    /// Unplugs what [`SharedVm::attach_block_devices`] attached for `container_id`.
    async fn detach_block_devices(&self, container_id: &str) -> Result<(), Error> {
        self.hotplug.detach(container_id).await
    }

    /// Puts another container of the pod (rootfs and binds) into the running VM's share.
    /// On failure what was mounted is removed again.
    fn add_container(
        &self,
        container_id: &str,
        rootfs: &RootfsSource,
        binds: &[crate::spec::HostBind],
    ) -> Result<(), Error> {
        let added =
            share::mount_container(&self.paths.dir, container_id, rootfs, binds, &|target| {
                let mut state = self.state.lock().unwrap();
                state.record(Made::Mount(target.to_owned()));
                state.save()
            });
        if added.is_err() {
            let _ = self.remove_container(container_id);
        }
        added
    }

    /// Removes a container's rootfs and binds from the share (the VM goes on).
    fn remove_container(&self, container_id: &str) -> Result<(), Error> {
        self.memory.lock().unwrap().release(container_id);
        let dir = self.paths.dir.join(share::MOUNTS_DIR).join(container_id);
        let mut state = self.state.lock().unwrap();
        let theirs = state.take_mounts_below(&dir);
        let unmounted = share::unmount_recorded(&self.paths.dir, &theirs);
        state.save()?;
        unmounted.and(share::remove_container_dir(&self.paths.dir, container_id))
    }
}
