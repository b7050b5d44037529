//! What a start the agent did not carry out leaves behind, and which SIGKILL may end the
//! pod's VM. Time is paused, so how long the service waited is exact.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use containerd_shim::api;
use tokio::time::Instant;

use super::exit::{KILL_GRACE, VM_ENDED_STATUS, VM_END_GRACE};
use super::fakes::HOST_PID;
use super::harness::{harness, running_pod_with_exec, settle, SANDBOX};
use crate::Error;

#[tokio::test(start_paused = true)]
async fn a_start_whose_vm_ends_under_it_finishes_the_process_with_137() {
    let h = Arc::new(harness());
    h.create(SANDBOX, None).await.unwrap();
    h.vm.guest.hold_start.store(true, Ordering::SeqCst);
    *h.vm.guest.fail_start.lock().unwrap() =
        Some(Error::FailedPrecondition("the guest is going down".into()));
    let start = {
        let h = h.clone();
        tokio::spawn(async move { h.start(SANDBOX, "").await })
    };
    settle().await;
    h.vm.end();
    h.vm.guest.release_start();
    let e = start.await.unwrap().unwrap_err();
    assert!(e.message().contains("VM stopped"), "{e:?}");
    assert_eq!(h.status(SANDBOX, ""), api::Status::STOPPED);
    assert_eq!(h.wait(SANDBOX, "").await, VM_ENDED_STATUS);
}

#[tokio::test(start_paused = true)]
async fn a_start_the_agent_did_not_answer_can_be_tried_again() {
    let h = harness();
    h.create(SANDBOX, None).await.unwrap();
    *h.vm.guest.fail_start.lock().unwrap() = Some(Error::AgentLost("connection reset".into()));
    let asked = Instant::now();
    let e = h.start(SANDBOX, "").await.unwrap_err();
    assert!(matches!(e, Error::AgentLost(_)), "{e:?}");
    // It waited for the VM's end for the grace, and for no exit the agent cannot send.
    assert!(asked.elapsed() <= VM_END_GRACE, "{:?}", asked.elapsed());
    assert_eq!(h.status(SANDBOX, ""), api::Status::CREATED);
    assert_eq!(h.start(SANDBOX, "").await.unwrap(), HOST_PID);
    assert_eq!(h.status(SANDBOX, ""), api::Status::RUNNING);
}

#[tokio::test(start_paused = true)]
async fn only_a_sigkill_of_the_sandbox_may_end_the_vm() {
    let h = running_pod_with_exec().await;
    h.create("c1", Some(SANDBOX)).await.unwrap();
    h.start("c1", "").await.unwrap();
    // A guest that ignores every signal: only the sandbox's SIGKILL is enforced by the host.
    h.vm.guest.obeys_sigkill.store(false, Ordering::SeqCst);
    h.kill(SANDBOX, "e1", libc::SIGKILL).await.unwrap();
    h.kill("c1", "", libc::SIGKILL).await.unwrap();
    h.kill(SANDBOX, "", libc::SIGTERM).await.unwrap();
    tokio::time::sleep(KILL_GRACE * 2).await;
    assert_eq!(h.vm.guest.called("signal_process"), 3);
    assert_eq!(h.vm.called("kill"), 0);
    assert_eq!(h.status(SANDBOX, ""), api::Status::RUNNING);
}
