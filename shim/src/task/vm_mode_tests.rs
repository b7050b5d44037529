//! A VM-mode CRI pod's lifecycle (docs/vm-mode.md) through the task service's seams: the
//! sandbox holds the pod and boots nothing, its one container boots its own VM with the
//! pod's identity and network namespace, and each task's delete takes what is its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;

use super::fakes::FakeVm;
use super::harness::{harness, settle, Harness, SANDBOX};
use super::KILL_GRACE;
use crate::guest::ProcessId;
use crate::spec::{
    CONTAINER_TYPE_ANNOTATION, SANDBOX_ID_ANNOTATION, SANDBOX_NAME_ANNOTATION,
    SANDBOX_UID_ANNOTATION,
};
use crate::Error;

const VM_MODE: &str = "vmlet.io/image-type";

/// A harness whose VM-mode pod's sandbox is created and started.
async fn held_pod() -> Harness {
    let h = harness();
    h.create_annotated(
        SANDBOX,
        json!({VM_MODE: "vm", CONTAINER_TYPE_ANNOTATION: "sandbox",
               SANDBOX_UID_ANNOTATION: "uid-1", SANDBOX_NAME_ANNOTATION: "web"}),
    )
    .await
    .unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h
}

async fn create_vm_container(h: &Harness, id: &str) -> Result<u32, Error> {
    h.create_annotated(
        id,
        json!({VM_MODE: "vm", CONTAINER_TYPE_ANNOTATION: "container",
               SANDBOX_ID_ANNOTATION: SANDBOX}),
    )
    .await
}

/// The VM the booter gave container `id`.
fn vm_of(h: &Harness, id: &str) -> Arc<FakeVm> {
    h.booter.own_vms.lock().unwrap()[id].clone()
}

/// The VM-mode sandbox the booter made.
fn hold_of(h: &Harness) -> Arc<FakeVm> {
    h.booter.held.lock().unwrap()[0].1.clone()
}

#[tokio::test(start_paused = true)]
async fn the_sandbox_holds_the_pod_and_its_container_boots_its_own_vm() {
    let h = held_pod().await;
    assert!(h.booter.booted.lock().unwrap().is_empty(), "no VM yet");
    assert_eq!(h.booter.held.lock().unwrap().len(), 1);
    create_vm_container(&h, "c1").await.unwrap();
    {
        let booted = h.booter.booted.lock().unwrap();
        let boot = &booted[0];
        assert_eq!(boot.sandbox_id.as_deref(), Some(SANDBOX));
        let image = boot.image.as_ref().expect("the container's VM image");
        assert_eq!(
            (image.instance_id.as_str(), image.hostname.as_str()),
            ("uid-1", "web"),
            "cloud-init knows the VM by the pod's UID and name"
        );
    }
    h.start("c1", "").await.unwrap();
    // The guest powers off: the container ends with its status; the pod stays.
    vm_of(&h, "c1").guest.exit(&ProcessId::init("c1"), 0, false);
    assert_eq!(h.wait("c1", "").await, 0);
    assert_eq!(h.delete("c1", "").await.unwrap(), 0);
    assert_eq!(vm_of(&h, "c1").called("teardown"), 1, "its VM goes with it");
    assert_eq!(hold_of(&h).called("teardown"), 0, "the pod stays");
    h.kill(SANDBOX, "", libc::SIGKILL).await.unwrap();
    assert_eq!(h.wait(SANDBOX, "").await, 137);
    h.delete(SANDBOX, "").await.unwrap();
    assert_eq!(hold_of(&h).called("teardown"), 1);
    assert_eq!(h.vm.called("teardown"), 0, "no other VM was touched");
}

#[tokio::test(start_paused = true)]
async fn a_vm_mode_pod_has_one_container_until_it_is_deleted() {
    let h = held_pod().await;
    create_vm_container(&h, "c1").await.unwrap();
    let err = create_vm_container(&h, "c2").await.unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(err.message().contains("whose VM is container c1"), "{err}");
    assert_eq!(h.booter.booted.lock().unwrap().len(), 1, "nothing booted");
    h.delete("c1", "").await.unwrap();
    create_vm_container(&h, "c2").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_boot_leaves_the_pod_free_for_the_next_container() {
    let h = held_pod().await;
    *h.booter.fail_boot.lock().unwrap() =
        Some(Error::InvalidArgument("no /disk/ in the image".into()));
    let err = create_vm_container(&h, "c1").await.unwrap_err();
    assert!(err.message().contains("/disk/"), "{err}");
    create_vm_container(&h, "c2").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_vm_image_in_a_pod_that_is_not_vm_mode_is_refused_by_name() {
    let h = harness();
    h.create(SANDBOX, None).await.unwrap();
    let err = create_vm_container(&h, "c1").await.unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(err.message().contains("is not a VM-mode pod"), "{err}");
    assert!(h.booter.own_vms.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn sigkill_ends_the_containers_vm_when_its_guest_does_not_stop() {
    let h = held_pod().await;
    create_vm_container(&h, "c1").await.unwrap();
    h.start("c1", "").await.unwrap();
    let vm = vm_of(&h, "c1");
    vm.guest.obeys_sigkill.store(false, Ordering::SeqCst);
    h.kill("c1", "", libc::SIGKILL).await.unwrap();
    settle().await;
    tokio::time::sleep(KILL_GRACE * 2).await;
    assert_eq!(vm.called("kill"), 1, "the container's own VM ended");
    assert_eq!(hold_of(&h).called("kill"), 0, "not the pod");
    assert_eq!(h.wait("c1", "").await, 137);
}

#[tokio::test(start_paused = true)]
async fn what_needs_an_agent_or_a_shared_vm_is_refused_by_name() {
    let h = held_pod().await;
    create_vm_container(&h, "c1").await.unwrap();
    h.start("c1", "").await.unwrap();
    for id in [SANDBOX, "c1"] {
        let err = h.exec(id, "e1").await.unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::UNIMPLEMENTED, "{id}: {err:?}");
        assert!(err.message().starts_with("an exec:"), "{id}: {err:?}");
        let err = h.service.set_paused(id, true).await.unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::UNIMPLEMENTED, "{id}: {err:?}");
        assert!(err.message().starts_with("pause:"), "{id}: {err:?}");
        let err = h.service.metrics(id).await.unwrap_err();
        assert!(err.message().starts_with("stats:"), "{id}: {err:?}");
        // The host's view needs no agent: the one host PID.
        assert_eq!(h.service.pids(id).await.unwrap().processes.len(), 1);
    }
    // The container's VM is the container: memory limits and the share are not asked of it.
    assert_eq!(vm_of(&h, "c1").called("fit_memory"), 0);
    assert_eq!(vm_of(&h, "c1").called("add_container"), 0);
}
