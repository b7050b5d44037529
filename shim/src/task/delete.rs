//! Deleting a task: a pod's sandbox goes last and takes the VM with it; a container's
//! host part (its mounts, its block devices) goes whatever the guest answers; a VM-mode
//! pod's container takes its own VM.

use containerd_shim::api;
use containerd_shim_protos::events::task::TaskDelete;
use containerd_shim_protos::topics;

use super::{exit, TaskEntry, TaskService};
use crate::Error;

impl TaskService {
    pub(super) async fn delete_task(
        &self,
        req: api::DeleteRequest,
    ) -> Result<api::DeleteResponse, Error> {
        let (task, process) = self.get(&req.id, &req.exec_id)?;
        if !req.exec_id.is_empty() {
            return self.delete_exec(&task, &process).await;
        }
        let exit = exit::for_delete(&process, task.vm.has_ended())?;
        if task.owns_vm {
            if let Some(meter) = self.meters.lock().unwrap().remove(&task.id) {
                meter.stop();
            }
        }
        if task.is_sandbox() {
            self.check_pod_is_empty(&task)?;
            task.vm.teardown().await?;
            self.vms.lock().unwrap().remove(&task.pod_id);
        } else if task.owns_vm {
            // A VM-mode pod's one container: its VM goes with it, and the pod may take
            // another.
            task.vm.teardown().await?;
            let sandbox = self.vms.lock().unwrap().get(&task.pod_id).cloned();
            if let Some(pod) = sandbox.as_ref().and_then(|s| s.image_pod()) {
                pod.release(&task.id);
            }
        } else {
            remove_container(&task).await?;
        }
        crate::spec::hooks::run_logged(&task.hooks.poststop, &task.hook_state, "stopped").await;
        self.tasks.lock().unwrap().remove(&req.id);
        self.publish(
            topics::TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: task.id.clone(),
                id: task.id.clone(),
                pid: process.pid,
                exit_status: exit.status,
                exited_at: Some(exit.at.clone()).into(),
                ..Default::default()
            }),
        );
        Ok(api::DeleteResponse {
            pid: process.pid,
            exit_status: exit.status,
            exited_at: Some(exit.at).into(),
            ..Default::default()
        })
    }

    /// A pod's sandbox is deleted after its containers.
    fn check_pod_is_empty(&self, sandbox: &TaskEntry) -> Result<(), Error> {
        let others: Vec<String> = self
            .tasks
            .lock()
            .unwrap()
            .values()
            .filter(|t| t.pod_id == sandbox.pod_id && t.id != sandbox.id)
            .map(|t| t.id.clone())
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        Err(Error::FailedPrecondition(format!(
            "pod {} still has containers {}; delete them first",
            sandbox.id,
            others.join(", ")
        )))
    }
}

/// Removes a container from its pod's VM: from the guest while the VM runs, then the
/// host's part, which goes whatever the guest answers (an agent that fails, or will not,
/// must not keep the container's mounts on the host).
async fn remove_container(task: &TaskEntry) -> Result<(), Error> {
    // Once the VM ended nothing of the container is left in the guest; the sandbox's
    // delete tears the rest down.
    let running = !task.vm.has_ended();
    if running {
        if let Err(e) = task.vm.guest().remove_container(&task.id).await {
            log::error!(
                "{}: the agent did not remove the container ({}); removing the host's part",
                task.id,
                e.message()
            );
        }
    }
    // A container has a host's part only in a VM its pod's containers share.
    let Ok(shared) = task.vm.shared() else {
        return Ok(());
    };
    shared.remove_container(&task.id)?;
    // The guest has let go of the devices with the container; the VM's end would release
    // one that fails to unplug.
    if running {
        if let Err(e) = shared.detach_block_devices(&task.id).await {
            log::error!("{}: {}", task.id, e.message());
        }
    }
    Ok(())
}
