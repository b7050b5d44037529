//! A container's guest cgroup through `ctr`: metrics, pause/resume, memory limits and the
//! OOM event (update is tested through CRI: ctr 1.6 has no `task update`). Run by `make test`; alone with
//! `eval "$(scripts/stack up)"; scripts/e2e resources`.

use crate::support::text;
use std::time::Duration;

use vmlet_integration::{unique_id, Stack, RUNTIME};

const BOOT: Duration = Duration::from_secs(90);

/// `ctr run -d EXTRA... IMAGE ID ARGS...`, waited for until RUNNING.
fn run_detached(s: &Stack, id: &str, extra: &[&str], args: &[&str]) {
    let mut all = vec!["run", "-d", "--runtime", RUNTIME];
    all.extend_from_slice(extra);
    all.push(&s.image);
    all.push(id);
    all.extend_from_slice(args);
    let out = s.ctr_output(&all).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    s.wait_status(id, "RUNNING", BOOT).unwrap();
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn metrics_pause_and_resume() {
    let s = Stack::from_env().expect("the vmlet stack");
    let id = unique_id("cg");
    run_detached(
        &s,
        &id,
        &[],
        &[
            "sh",
            "-c",
            "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.t; mv /tmp/n.t /tmp/n; sleep 0.05; done",
        ],
    );
    let metrics = s.ctr_output(&["task", "metrics", &id]).unwrap();
    let table = text(&metrics.stdout);
    let value = |key: &str| -> u64 {
        table
            .lines()
            .find_map(|l| l.strip_prefix(key).map(str::trim))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let pause = s.ctr_output(&["task", "pause", &id]).unwrap();
    assert!(pause.status.success(), "{}", text(&pause.stderr));
    let paused = s.task_status(&id).unwrap();
    let exec_paused = s
        .ctr_output(&["task", "exec", "--exec-id", "p", &id, "true"])
        .unwrap();
    let resume = s.ctr_output(&["task", "resume", &id]).unwrap();
    let resumed = s.task_status(&id).unwrap();
    let n = |exec: &str| {
        let out = s
            .ctr_output(&["task", "exec", "--exec-id", exec, &id, "cat", "/tmp/n"])
            .unwrap();
        text(&out.stdout).trim().parse::<u64>().unwrap_or(0)
    };
    let (a, b) = (n("n1"), {
        std::thread::sleep(Duration::from_millis(500));
        n("n2")
    });
    let _ = s.kill_and_remove(&id);
    assert!(metrics.status.success(), "{}", text(&metrics.stderr));
    assert!(value("memory.usage") > 0, "ctr task metrics:\n{table}");
    assert!(value("cpu.usage_usec") > 0, "ctr task metrics:\n{table}");
    assert!(value("pids.current") >= 1, "ctr task metrics:\n{table}");
    assert_eq!(paused.as_deref(), Some("PAUSED"));
    assert!(!exec_paused.status.success(), "exec into a paused task");
    assert!(resume.status.success(), "{}", text(&resume.stderr));
    assert_eq!(resumed.as_deref(), Some("RUNNING"));
    assert!(b > a, "the loop runs again after resume ({a} then {b})");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn memory_limit_kills_and_reports_oom() {
    let s = Stack::from_env().expect("the vmlet stack");
    let id = unique_id("oom");
    let events = s.watch_events().unwrap();
    let limit = (64u64 << 20).to_string();
    let out = s
        .run(
            &id,
            &["--memory-limit", &limit],
            &["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
        )
        .unwrap();
    let seen = events.stop().unwrap();
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(
        seen.lines()
            .any(|l| l.contains("/tasks/oom") && l.contains(&id)),
        "no /tasks/oom event:\n{seen}"
    );
}
