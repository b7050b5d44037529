//! The task service's lifecycle rules, through its seams: a fake guest and VM
//! ([`super::fakes`]), a channel for the events, a fixed node config. Time is paused
//! (tokio's test clock), so the deadlines (kill grace, the VM's end) pass at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use containerd_shim::api;
use containerd_shim_protos::topics;

use super::exit::VM_END_GRACE;
use super::fakes::HOST_PID;
use super::harness::{harness, running_pod_with_exec, settle, SANDBOX};
use crate::guest::ProcessId;
use crate::Error;

#[tokio::test(start_paused = true)]
async fn a_sandbox_boots_runs_and_exits_with_its_status_in_order() {
    let mut h = harness();
    assert_eq!(h.create(SANDBOX, None).await.unwrap(), HOST_PID);
    assert_eq!(h.booter.booted.lock().unwrap().len(), 1);
    assert_eq!(h.status(SANDBOX, ""), api::Status::CREATED);
    // containerd is told QEMU's PID, never the guest's.
    assert_eq!(h.start(SANDBOX, "").await.unwrap(), HOST_PID);
    assert_eq!(h.status(SANDBOX, ""), api::Status::RUNNING);
    h.vm.guest.exit(&ProcessId::init(SANDBOX), 3, false);
    assert_eq!(h.wait(SANDBOX, "").await, 3);
    assert_eq!(h.status(SANDBOX, ""), api::Status::STOPPED);
    assert_eq!(
        h.events.topics(),
        [
            topics::TASK_CREATE_EVENT_TOPIC,
            topics::TASK_START_EVENT_TOPIC,
            topics::TASK_EXIT_EVENT_TOPIC
        ]
    );
    assert_eq!(h.delete(SANDBOX, "").await.unwrap(), 3);
    assert_eq!(h.vm.called("teardown"), 1);
    assert_eq!(h.events.topics(), [topics::TASK_DELETE_EVENT_TOPIC]);
}

#[tokio::test(start_paused = true)]
async fn an_oom_kill_is_published_before_the_exit() {
    let mut h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.vm.guest.exit(&ProcessId::init(SANDBOX), 137, true);
    assert_eq!(h.wait(SANDBOX, "").await, 137);
    let published = h.published();
    let last: Vec<&str> = published[published.len() - 2..]
        .iter()
        .map(|(topic, _)| topic.as_str())
        .collect();
    assert_eq!(
        last,
        [topics::TASK_OOM_EVENT_TOPIC, topics::TASK_EXIT_EVENT_TOPIC]
    );
    let oom = &published[published.len() - 2].1;
    assert!(oom.contains(" container_id: \"pod1\""), "{oom}");
}

#[tokio::test(start_paused = true)]
async fn a_second_start_is_refused_while_the_first_is_under_way() {
    let h = Arc::new(harness());
    h.create(SANDBOX, None).await.unwrap();
    h.vm.guest.hold_start.store(true, Ordering::SeqCst);
    let first = {
        let h = h.clone();
        tokio::spawn(async move { h.start(SANDBOX, "").await })
    };
    settle().await;
    assert_eq!(h.status(SANDBOX, ""), api::Status::CREATED);
    // Refused at once, not queued behind the first.
    let second = tokio::time::timeout(std::time::Duration::from_secs(1), h.start(SANDBOX, ""))
        .await
        .expect("the second start answers at once")
        .unwrap_err();
    assert!(matches!(second, Error::FailedPrecondition(_)), "{second:?}");
    h.vm.guest.release_start();
    assert_eq!(first.await.unwrap().unwrap(), HOST_PID);
    assert_eq!(h.vm.guest.called("start_process"), 1);
    // Started once: a third start is refused too.
    assert!(h.start(SANDBOX, "").await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_start_the_agent_refused_stops_the_process_with_the_guest_status() {
    let mut h = harness();
    h.create(SANDBOX, None).await.unwrap();
    *h.vm.guest.fail_start.lock().unwrap() =
        Some(Error::FailedPrecondition("exec: no such file".into()));
    h.vm.guest.exit(&ProcessId::init(SANDBOX), 127, false);
    let asked = tokio::time::Instant::now();
    let e = h.start(SANDBOX, "").await.unwrap_err();
    // A refusal is no broken connection: the VM's end is not waited for.
    assert!(asked.elapsed() < VM_END_GRACE, "{:?}", asked.elapsed());
    assert!(e.message().contains("no such file"), "{e:?}");
    assert_eq!(h.status(SANDBOX, ""), api::Status::STOPPED);
    assert_eq!(h.exits(), [(SANDBOX.into(), SANDBOX.into(), 127)]);
    // A stopped task is deleted with that status.
    assert_eq!(h.delete(SANDBOX, "").await.unwrap(), 127);
}

#[tokio::test(start_paused = true)]
async fn pausing_a_task_pauses_its_execs_and_keeps_it_from_delete() {
    let h = running_pod_with_exec().await;
    h.service.set_paused(SANDBOX, true).await.unwrap();
    assert_eq!(h.status(SANDBOX, ""), api::Status::PAUSED);
    assert_eq!(h.status(SANDBOX, "e1"), api::Status::PAUSED);
    // Pausing twice, exec in a paused task and deleting it are refused.
    assert!(h.service.set_paused(SANDBOX, true).await.is_err());
    assert!(h.exec(SANDBOX, "e2").await.is_err());
    let e = h.delete(SANDBOX, "").await.unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e:?}");
    h.service.set_paused(SANDBOX, false).await.unwrap();
    assert_eq!(h.status(SANDBOX, ""), api::Status::RUNNING);
    assert_eq!(h.status(SANDBOX, "e1"), api::Status::RUNNING);
    assert_eq!(h.vm.guest.called("pause"), 1);
    assert_eq!(h.vm.guest.called("resume"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_running_process_cannot_be_deleted() {
    let h = running_pod_with_exec().await;
    assert!(matches!(
        h.delete(SANDBOX, "e1").await,
        Err(Error::FailedPrecondition(_))
    ));
    assert!(matches!(
        h.delete(SANDBOX, "").await,
        Err(Error::FailedPrecondition(_))
    ));
    h.vm.guest.exit(&ProcessId::exec(SANDBOX, "e1"), 0, false);
    assert_eq!(h.wait(SANDBOX, "e1").await, 0);
    assert_eq!(h.delete(SANDBOX, "e1").await.unwrap(), 0);
    assert_eq!(h.vm.guest.called("remove_exec"), 1);
    assert_eq!(h.vm.called("teardown"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_goes_after_its_containers_and_takes_the_vm() {
    let h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.create("c1", Some(SANDBOX)).await.unwrap();
    assert_eq!(h.booter.booted.lock().unwrap().len(), 1, "c1 joins the VM");
    assert_eq!(h.vm.called("add_container c1"), 1);
    h.start("c1", "").await.unwrap();
    h.kill(SANDBOX, "", libc::SIGKILL).await.unwrap();
    assert_eq!(h.wait(SANDBOX, "").await, 137);
    let e = h.delete(SANDBOX, "").await.unwrap_err();
    assert!(e.message().contains("c1"), "{e:?}");
    h.vm.guest.exit(&ProcessId::init("c1"), 0, false);
    assert_eq!(h.wait("c1", "").await, 0);
    h.delete("c1", "").await.unwrap();
    assert_eq!(h.vm.guest.called("remove_container c1"), 1);
    assert_eq!(h.vm.called("remove_container c1"), 1);
    assert_eq!(h.vm.called("teardown"), 0);
    h.delete(SANDBOX, "").await.unwrap();
    assert_eq!(h.vm.called("teardown"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_vms_end_ends_every_process_with_137_started_or_not() {
    let mut h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.exec(SANDBOX, "started").await.unwrap();
    h.start(SANDBOX, "started").await.unwrap();
    h.exec(SANDBOX, "never").await.unwrap();
    h.vm.end();
    assert_eq!(h.wait(SANDBOX, "").await, 137);
    assert_eq!(h.wait(SANDBOX, "started").await, 137);
    assert_eq!(h.wait(SANDBOX, "never").await, 137);
    let mut exits = h.exits();
    exits.sort();
    assert_eq!(
        exits,
        [
            (SANDBOX.into(), "never".into(), 137),
            (SANDBOX.into(), SANDBOX.into(), 137),
            (SANDBOX.into(), "started".into(), 137),
        ]
    );
    // Calls into a VM that has ended are refused, not left waiting.
    assert!(matches!(
        h.exec(SANDBOX, "late").await,
        Err(Error::FailedPrecondition(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_lost_agent_ends_the_process_with_255_while_the_vm_runs() {
    let mut h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.vm.guest.lose(&ProcessId::init(SANDBOX));
    assert_eq!(h.wait(SANDBOX, "").await, 255);
    assert_eq!(h.exits(), [(SANDBOX.into(), SANDBOX.into(), 255)]);
}

#[tokio::test(start_paused = true)]
async fn a_lost_agent_followed_by_the_vms_end_is_the_vms_end() {
    let h = Arc::new(harness());
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.vm.guest.lose(&ProcessId::init(SANDBOX));
    settle().await;
    h.vm.end();
    assert_eq!(h.wait(SANDBOX, "").await, 137);
}

#[tokio::test(start_paused = true)]
async fn sigkill_of_the_sandbox_ends_the_vm_when_the_guest_ignores_it() {
    let h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.vm.guest.obeys_sigkill.store(false, Ordering::SeqCst);
    h.kill(SANDBOX, "", libc::SIGKILL).await.unwrap();
    assert_eq!(h.wait(SANDBOX, "").await, 137);
    assert_eq!(h.vm.called("kill"), 1);
}

#[tokio::test(start_paused = true)]
async fn sigkill_the_guest_obeys_does_not_end_the_vm() {
    let h = harness();
    h.create(SANDBOX, None).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    h.kill(SANDBOX, "", libc::SIGKILL).await.unwrap();
    assert_eq!(h.wait(SANDBOX, "").await, 137);
    tokio::time::sleep(super::KILL_GRACE * 2).await;
    assert_eq!(h.vm.called("kill"), 0);
    // A finished process cannot be signalled again.
    assert!(matches!(
        h.kill(SANDBOX, "", libc::SIGTERM).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_container_the_guest_cannot_create_leaves_nothing() {
    let mut h = harness();
    h.create(SANDBOX, None).await.unwrap();
    *h.vm.guest.refuse_create.lock().unwrap() = Some("bad rootfs".into());
    let e = h.create("c1", Some(SANDBOX)).await.unwrap_err();
    assert!(e.message().contains("bad rootfs"), "{e:?}");
    assert_eq!(h.vm.called("remove_container c1"), 1);
    assert_eq!(h.vm.called("teardown"), 0, "the pod's VM stays");
    assert!(h.service.state("c1", "").is_err());
    assert_eq!(h.events.topics(), [topics::TASK_CREATE_EVENT_TOPIC]);
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_the_guest_cannot_create_tears_its_vm_down() {
    let mut h = harness();
    *h.vm.guest.refuse_create.lock().unwrap() = Some("bad rootfs".into());
    assert!(h.create(SANDBOX, None).await.is_err());
    assert_eq!(h.vm.called("teardown"), 1);
    assert!(h.events.topics().is_empty());
    assert!(h.service.state(SANDBOX, "").is_err());
}
