//! What each call tells containerd and the agent: the fields of the replies and events
//! (containerd reads them: the exit status of a delete, the PID and paths of a state) and of
//! the requests the guest gets. The order of things is in `lifecycle_tests`.

use containerd_shim::api;
use containerd_shim_protos::cgroups_v2::metrics::Metrics;
use containerd_shim_protos::topics;

use super::fakes::{GUEST_STATS_MEMORY, HOST_PID};
use super::harness::{harness, Harness, SANDBOX};
use crate::guest::ProcessId;
use crate::Error;

/// A running pod whose init has stdio and a terminal, and a running exec with stdin and
/// stdout only.
async fn running_with_stdio() -> Harness {
    let h = harness();
    let mut req = h.create_request(SANDBOX, None);
    req.stdin = "/run/fifo/in".into();
    req.stdout = "/run/fifo/out".into();
    req.terminal = true;
    h.service.create_task(req).await.unwrap();
    h.start(SANDBOX, "").await.unwrap();
    let mut exec = Harness::exec_request(SANDBOX, "e1");
    exec.stdin = "/run/fifo/e1-in".into();
    exec.stdout = "/run/fifo/e1-out".into();
    h.service.create_exec(exec).await.unwrap();
    h.start(SANDBOX, "e1").await.unwrap();
    h
}

#[tokio::test(start_paused = true)]
async fn state_names_the_process_its_paths_and_its_exit() {
    let h = running_with_stdio().await;
    let init = h.service.state(SANDBOX, "").unwrap();
    assert_eq!(init.id, SANDBOX);
    assert_eq!(init.exec_id, "");
    assert_eq!(init.bundle, h.bundle_dir(SANDBOX));
    assert_eq!(init.pid, HOST_PID);
    assert_eq!(
        (
            init.stdin.as_str(),
            init.stdout.as_str(),
            init.stderr.as_str()
        ),
        ("/run/fifo/in", "/run/fifo/out", "")
    );
    assert!(init.terminal);
    assert_eq!(init.exit_status, 0);
    assert!(init.exited_at.is_none());

    let exec = h.service.state(SANDBOX, "e1").unwrap();
    assert_eq!((exec.id.as_str(), exec.exec_id.as_str()), ("e1", "e1"));
    assert_eq!(exec.stdin, "/run/fifo/e1-in");
    assert!(!exec.terminal);
    let mut errors = Harness::exec_request(SANDBOX, "errors");
    errors.stderr = "/run/fifo/errors-err".into();
    h.service.create_exec(errors).await.unwrap();
    let errors = h.service.state(SANDBOX, "errors").unwrap();
    assert_eq!(errors.stderr, "/run/fifo/errors-err");

    h.vm.guest.exit(&ProcessId::exec(SANDBOX, "e1"), 7, false);
    assert_eq!(h.wait(SANDBOX, "e1").await, 7);
    let ended = h.service.state(SANDBOX, "e1").unwrap();
    assert_eq!(ended.exit_status, 7);
    // The time of the exit, to the nanosecond (CRI shows it as FinishedAt).
    let at = ended.exited_at.as_ref().expect("exited_at");
    assert!(at.seconds > 1_600_000_000 && at.nanos > 0, "{at:?}");
}

#[tokio::test(start_paused = true)]
async fn the_agent_gets_the_exec_as_containerd_asked_for_it() {
    let h = running_with_stdio().await;
    let asked = h.vm.guest.requests("create_exec");
    assert_eq!(asked.len(), 1);
    let e1 = &asked[0];
    for field in [
        "container_id: \"pod1\"",
        "exec_id: \"e1\"",
        "args: \"true\"",
        "stdin: true",
        "stdout: true",
    ] {
        assert!(e1.contains(field), "{field} in {e1}");
    }
    // No stderr path, no terminal: neither is asked for.
    assert!(!e1.contains("stderr: true"), "{e1}");
    assert!(!e1.contains("terminal: true"), "{e1}");

    // A terminal (asked for by containerd or by the process spec) carries stdout and
    // stderr together: the guest opens no separate stderr.
    let mut tty = Harness::exec_request(SANDBOX, "tty");
    tty.terminal = true;
    tty.stdout = "/run/fifo/tty-out".into();
    tty.stderr = "/run/fifo/tty-err".into();
    h.service.create_exec(tty).await.unwrap();
    let tty = h.vm.guest.requests("create_exec").pop().unwrap();
    assert!(tty.contains("terminal: true"), "{tty}");
    assert!(!tty.contains("stderr: true"), "{tty}");
    let mut plain = Harness::exec_request(SANDBOX, "plain");
    plain.stderr = "/run/fifo/plain-err".into();
    h.service.create_exec(plain).await.unwrap();
    let plain = h.vm.guest.requests("create_exec").pop().unwrap();
    assert!(plain.contains("stderr: true"), "{plain}");
    // A terminal the process spec asks for counts as one containerd asked for.
    let mut in_spec = Harness::exec_request(SANDBOX, "in-spec");
    let process = serde_json::json!({"args": ["sh"], "cwd": "/", "terminal": true,
                                     "user": {"uid": 0, "gid": 0}});
    in_spec.spec.as_mut().unwrap().value = process.to_string().into_bytes();
    h.service.create_exec(in_spec).await.unwrap();
    let in_spec = h.vm.guest.requests("create_exec").pop().unwrap();
    assert!(in_spec.contains("terminal: true"), "{in_spec}");
    assert!(h.service.state(SANDBOX, "in-spec").unwrap().terminal);
}

#[tokio::test(start_paused = true)]
async fn an_exec_id_is_needed_and_used_once() {
    let h = running_with_stdio().await;
    let e = h.exec(SANDBOX, "").await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = h.exec(SANDBOX, "e1").await.unwrap_err();
    assert!(matches!(e, Error::AlreadyExists(_)), "{e:?}");
    assert_eq!(h.vm.guest.requests("create_exec").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn events_name_the_container_the_process_and_its_exit() {
    let mut h = running_with_stdio().await;
    h.vm.guest.exit(&ProcessId::exec(SANDBOX, "e1"), 7, false);
    h.wait(SANDBOX, "e1").await;
    h.service.set_paused(SANDBOX, true).await.unwrap();
    h.service.set_paused(SANDBOX, false).await.unwrap();
    h.vm.guest.exit(&ProcessId::init(SANDBOX), 3, false);
    h.wait(SANDBOX, "").await;
    h.delete(SANDBOX, "e1").await.unwrap();
    h.delete(SANDBOX, "").await.unwrap();

    let published = h.published();
    let event = |topic: &str, nth: usize| -> String {
        published
            .iter()
            .filter(|(t, _)| t == topic)
            .nth(nth)
            .unwrap_or_else(|| panic!("no {topic} #{nth} in {published:?}"))
            .1
            .clone()
    };
    let has = |text: &str, fields: &[&str]| {
        for field in fields {
            assert!(text.contains(field), "{field} in {text}");
        }
    };
    let pid = format!(" pid: {HOST_PID}");
    let pod = " container_id: \"pod1\"";
    has(
        &event(topics::TASK_CREATE_EVENT_TOPIC, 0),
        &[
            pod,
            &pid,
            " bundle:",
            "io {stdin: \"/run/fifo/in\"",
            " terminal: true",
        ],
    );
    has(&event(topics::TASK_START_EVENT_TOPIC, 0), &[pod, &pid]);
    has(
        &event(topics::TASK_EXEC_ADDED_EVENT_TOPIC, 0),
        &[pod, " exec_id: \"e1\""],
    );
    has(
        &event(topics::TASK_EXEC_STARTED_EVENT_TOPIC, 0),
        &[pod, " exec_id: \"e1\"", &pid],
    );
    has(
        &event(topics::TASK_EXIT_EVENT_TOPIC, 0),
        &[pod, " id: \"e1\"", &pid, " exit_status: 7", " exited_at"],
    );
    has(&event(topics::TASK_PAUSED_EVENT_TOPIC, 0), &[pod]);
    has(&event(topics::TASK_RESUMED_EVENT_TOPIC, 0), &[pod]);
    has(
        &event(topics::TASK_EXIT_EVENT_TOPIC, 1),
        &[pod, " id: \"pod1\"", " exit_status: 3"],
    );
    has(
        &event(topics::TASK_DELETE_EVENT_TOPIC, 0),
        &[pod, " id: \"pod1\"", &pid, " exit_status: 3", " exited_at"],
    );
}

#[tokio::test(start_paused = true)]
async fn delete_answers_the_pid_status_and_time_of_the_exit() {
    let h = running_with_stdio().await;
    h.vm.guest.exit(&ProcessId::exec(SANDBOX, "e1"), 7, false);
    h.wait(SANDBOX, "e1").await;
    let exited_at = h.service.state(SANDBOX, "e1").unwrap().exited_at;
    let e1 = h.delete_reply(SANDBOX, "e1").await.unwrap();
    assert_eq!((e1.pid, e1.exit_status), (HOST_PID, 7));
    assert_eq!(e1.exited_at, exited_at);
    assert_eq!(h.vm.guest.called("remove_exec"), 1);
    // Gone: the exec id can be used again.
    assert!(h.service.state(SANDBOX, "e1").is_err());
    h.exec(SANDBOX, "e1").await.unwrap();

    h.vm.end();
    h.wait(SANDBOX, "").await;
    let pod = h.delete_reply(SANDBOX, "").await.unwrap();
    assert_eq!((pod.pid, pod.exit_status), (HOST_PID, 137));
    assert!(pod.exited_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn pids_stats_resize_and_update_reach_the_guest_and_come_back() {
    let h = running_with_stdio().await;
    let pids = h.service.pids(SANDBOX).await.unwrap();
    let pids: Vec<u32> = pids.processes.iter().map(|p| p.pid).collect();
    assert_eq!(
        pids,
        [HOST_PID],
        "the host's PID of the pod's VM, no guest PID"
    );

    let stats = h.service.metrics(SANDBOX).await.unwrap();
    let any = stats.stats.into_option().expect("stats");
    assert_eq!(any.type_url, crate::task::container_metrics::TYPE_URL);
    let metrics: Metrics = protobuf::Message::parse_from_bytes(&any.value).unwrap();
    assert_eq!(metrics.memory.usage, GUEST_STATS_MEMORY);

    let resize = |exec_id: &str| api::ResizePtyRequest {
        id: SANDBOX.into(),
        exec_id: exec_id.into(),
        width: 77,
        height: 33,
        ..Default::default()
    };
    h.service.resize_pty(resize("")).await.unwrap();
    assert_eq!(h.vm.guest.called("resize_terminal pod1/ 77x33"), 1);
    // e1 has no terminal.
    let e = h.service.resize_pty(resize("e1")).await.unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e:?}");

    let update = |resources: serde_json::Value| api::UpdateTaskRequest {
        id: SANDBOX.into(),
        resources: Some(protobuf::well_known_types::any::Any {
            value: resources.to_string().into_bytes(),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    };
    let limit = serde_json::json!({"memory": {"limit": 256 << 20}, "cpu": {"shares": 512}});
    h.service.update(update(limit)).await.unwrap();
    assert_eq!(h.vm.called("fit_memory pod1 Some(256)"), 1);
    let sent = h.vm.guest.requests("update_resources pod1");
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("memory_limit: 268435456"), "{}", sent[0]);
    // An update that leaves memory alone does not touch the VM's size.
    let cpu = serde_json::json!({"cpu": {"shares": 256}});
    h.service.update(update(cpu)).await.unwrap();
    assert_eq!(h.vm.called("fit_memory pod1 Some"), 1);
    assert_eq!(h.vm.guest.requests("update_resources pod1").len(), 2);
}
