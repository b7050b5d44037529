//! The service over a table of fake containers: a process is its exit channel and two pipes
//! (a `sleep` of the test's where a signal must land), a cgroup a directory in a temporary
//! one. Nothing is cloned, mounted or moved into a real cgroup.

use std::os::fd::OwnedFd;
use std::process::{Child, Command};

use tokio::sync::watch;
use vmlet_protocol::agent::{ContainerRequest, Process as ProtoProcess};

use super::*;
use crate::boot::Faults;
use crate::process_stdio::HostEnds;
use crate::reaper::ExitStatus;

/// The PID of a table's process that no signal may reach: above any `pid_max`, so a
/// `kill` of it fails with ESRCH.
const NO_PID: i32 = i32::MAX;

struct Fixture {
    service: AgentService,
    cgroups: tempfile::TempDir,
}

/// A process of the table: what the reaper would send its exit on, and the pipes' other
/// ends (kept open: a closed start pipe means "abandoned" to a helper).
struct Fake {
    process: Arc<Process>,
    exit: watch::Sender<Option<ExitStatus>>,
    _ends: (OwnedFd, OwnedFd),
}

impl Fake {
    fn exits(&self, status: ExitStatus) {
        self.exit.send_replace(Some(status));
    }
}

fn fake(pid: i32) -> Fake {
    let (exit, exited) = watch::channel(None);
    let (start, start_end) = nix::unistd::pipe().unwrap();
    let (status, status_end) = nix::unistd::pipe().unwrap();
    let process = Process::new(pid, exited, start, status, HostEnds::default(), None, 0);
    Fake {
        process: Arc::new(process),
        exit,
        _ends: (start_end, status_end),
    }
}

fn fixture(share: bool, faults: Faults) -> Fixture {
    let cgroups = tempfile::tempdir().unwrap();
    let service = AgentService {
        share: share.then(|| cgroups.path().join("share")),
        faults,
        containers: Arc::new(Containers::default()),
        reaper: Arc::new(Reaper::default()),
        pod_volumes: PodVolumes::new(cgroups.path().join("volumes")),
        clock: Default::default(),
    };
    Fixture { service, cgroups }
}

impl Fixture {
    /// Puts container `id` in the table with an init of `pid`.
    fn container(&self, id: &str, pid: i32) -> Fake {
        let init = fake(pid);
        let cgroup = Cgroup::create_at(self.cgroups.path(), id).unwrap();
        let container = Container::new(init.process.clone(), cgroup, None);
        self.service.containers.insert(id, container).unwrap();
        init
    }

    /// Gives container `id` an exec `exec_id` of `pid`.
    fn exec(&self, id: &str, exec_id: &str, pid: i32) -> Fake {
        let exec = fake(pid);
        let container = self.service.containers.get(id).unwrap();
        let mut execs = container.execs.lock().unwrap();
        execs.insert(exec_id.into(), exec.process.clone());
        exec
    }
}

fn process(args: &[&str]) -> ProtoProcess {
    ProtoProcess {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

fn process_ref(container_id: &str, exec_id: &str) -> ProcessRef {
    ProcessRef {
        container_id: container_id.into(),
        exec_id: exec_id.into(),
        ..Default::default()
    }
}

/// A process of the test's that a signal can land on.
fn sleeper() -> Child {
    Command::new("sleep").arg("30").spawn().unwrap()
}

/// How `child` ended, within 5 s (none: it still runs).
fn ended(child: &mut Child) -> Option<std::process::ExitStatus> {
    for _ in 0..100 {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

#[tokio::test]
async fn a_create_needs_a_new_id_and_a_vm_with_a_share() {
    let f = fixture(true, Faults::default());
    let _c1 = f.container("c1", NO_PID);
    let create = |id: &str| CreateContainerRequest {
        container_id: id.into(),
        rootfs: format!("{id}/rootfs"),
        process: Some(process(&["true"])).into(),
        ..Default::default()
    };
    let err = f.service.create(create("")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    let err = f.service.create(create("c1")).await.unwrap_err();
    assert!(
        matches!(err, Error::ContainerExists(ref id) if id == "c1"),
        "{err}"
    );
    let unshared = fixture(false, Faults::default());
    let err = unshared.service.create(create("c2")).await.unwrap_err();
    assert!(err.to_string().contains("no shared directory"), "{err}");
}

#[tokio::test]
async fn a_container_cannot_join_a_stopped_sandboxs_namespaces() {
    let f = fixture(true, Faults::default());
    let sandbox = f.container("sandbox", NO_PID);
    sandbox.exits(0);
    let req = CreateContainerRequest {
        container_id: "c1".into(),
        rootfs: "c1/rootfs".into(),
        process: Some(process(&["true"])).into(),
        join_namespaces: vec!["pid".into(), "net".into()],
        join_namespaces_of: "sandbox".into(),
        ..Default::default()
    };
    let err = f.service.create(req).await.unwrap_err();
    assert!(
        matches!(err, Error::WrongState { ref id, state: "stopped", .. } if id == "sandbox"),
        "{err}"
    );
    assert!(!f.service.containers.contains("c1"));
}

#[tokio::test]
async fn an_exec_needs_a_plain_new_id_and_a_running_container() {
    let f = fixture(true, Faults::default());
    let c1 = f.container("c1", NO_PID);
    let _e1 = f.exec("c1", "e1", NO_PID);
    let exec = |container: &str, id: &str| CreateExecRequest {
        container_id: container.into(),
        exec_id: id.into(),
        process: Some(process(&["true"])).into(),
        ..Default::default()
    };
    for bad in ["", "two words", "tab\there"] {
        let err = f.service.create_exec(exec("c1", bad)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidRequest(_)), "{bad:?}: {err}");
    }
    let err = f.service.create_exec(exec("c1", "e1")).await.unwrap_err();
    assert!(
        matches!(err, Error::ContainerExists(ref n) if n == "c1/e1"),
        "{err}"
    );
    let err = f.service.create_exec(exec("c9", "e2")).await.unwrap_err();
    assert!(matches!(err, Error::ContainerNotFound(_)), "{err}");
    c1.exits(0);
    let err = f.service.create_exec(exec("c1", "e2")).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongState {
                state: "stopped",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_running_exec_stays_and_an_ended_or_never_started_one_goes() {
    let f = fixture(true, Faults::default());
    let _c1 = f.container("c1", NO_PID);
    let running = f.exec("c1", "running", NO_PID);
    let _never = f.exec("c1", "never", NO_PID);
    // Started: the start signal was given (its pipe taken).
    running.process.abandon();
    let err = f
        .service
        .remove_exec(process_ref("c1", "running"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongState {
                state: "running",
                ..
            }
        ),
        "{err}"
    );
    running.exits(0);
    f.service.remove_exec(process_ref("c1", "running")).unwrap();
    f.service.remove_exec(process_ref("c1", "never")).unwrap();
    let execs = f.service.containers.get("c1").unwrap();
    assert!(execs.execs.lock().unwrap().is_empty());
    let err = f
        .service
        .remove_exec(process_ref("c1", "never"))
        .unwrap_err();
    assert!(
        matches!(err, Error::ProcessNotFound(ref n) if n == "c1/never"),
        "{err}"
    );
}

#[tokio::test]
async fn a_resize_needs_a_terminal() {
    let f = fixture(true, Faults::default());
    let _c1 = f.container("c1", NO_PID);
    let err = f
        .service
        .resize(ResizeTerminalRequest {
            process: Some(process_ref("c1", "")).into(),
            width: 80,
            height: 24,
            ..Default::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("has no terminal"), "{err}");
}

fn signal(container_id: &str, signal: u32, all: bool) -> SignalProcessRequest {
    SignalProcessRequest {
        process: Some(process_ref(container_id, "")).into(),
        signal,
        all,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_signal_reaches_the_process_or_with_all_every_process_of_its_cgroup() {
    let f = fixture(true, Faults::default());
    let (mut init, mut other) = (sleeper(), sleeper());
    let _c1 = f.container("c1", init.id() as i32);
    f.service.signal(signal("c1", 15, false)).unwrap();
    assert!(ended(&mut init).is_some(), "the init got SIGTERM");
    let mut second = sleeper();
    let _c2 = f.container("c2", second.id() as i32);
    let procs = f.cgroups.path().join("c2/cgroup.procs");
    std::fs::write(procs, format!("{}\n", other.id())).unwrap();
    f.service.signal(signal("c2", 9, true)).unwrap();
    assert!(ended(&mut second).is_some(), "the init got SIGKILL");
    assert!(
        ended(&mut other).is_some(),
        "the cgroup's other process got SIGKILL"
    );
}

#[tokio::test]
async fn a_signal_unknown_or_to_an_ended_process_is_refused() {
    let f = fixture(true, Faults::default());
    let mut init = sleeper();
    let c1 = f.container("c1", init.id() as i32);
    let err = f.service.signal(signal("c1", 99, false)).unwrap_err();
    assert!(err.to_string().contains("unknown signal 99"), "{err}");
    c1.exits(0);
    let err = f.service.signal(signal("c1", 15, false)).unwrap_err();
    assert!(matches!(err, Error::ProcessNotFound(_)), "{err}");
    let _ = init.kill();
    let _ = init.wait();
}

#[tokio::test]
async fn the_ignore_signals_fault_answers_and_sends_nothing() {
    let faults = Faults {
        ignore_signals: true,
        ..Faults::default()
    };
    let f = fixture(true, faults);
    let mut init = sleeper();
    let _c1 = f.container("c1", init.id() as i32);
    f.service.signal(signal("c1", 9, true)).unwrap();
    assert!(init.try_wait().unwrap().is_none(), "the fault signalled");
    init.kill().unwrap();
    init.wait().unwrap();
}

#[tokio::test]
async fn a_wait_gives_the_exit_status_and_an_oom_kill_since_the_create() {
    let f = fixture(true, Faults::default());
    let c1 = f.container("c1", NO_PID);
    let events = f.cgroups.path().join("c1/memory.events");
    std::fs::write(events, "oom 1\noom_kill 1\n").unwrap();
    c1.exits(137);
    let waited = f
        .service
        .wait(WaitProcessRequest {
            process: Some(process_ref("c1", "")).into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(waited.exit_status, 137);
    assert!(waited.oom_killed);
}

#[tokio::test]
async fn a_stopped_container_is_neither_paused_nor_resumed() {
    let f = fixture(true, Faults::default());
    let c1 = f.container("c1", NO_PID);
    c1.exits(0);
    let req = || ContainerRequest {
        container_id: "c1".into(),
        ..Default::default()
    };
    let err = f.service.freeze(req(), true).await.unwrap_err();
    assert!(err.to_string().contains("cannot pause it"), "{err}");
    let err = f.service.freeze(req(), false).await.unwrap_err();
    assert!(err.to_string().contains("cannot resume it"), "{err}");
}

#[tokio::test]
async fn calls_on_an_unknown_container_name_it() {
    let f = fixture(true, Faults::default());
    let stats = f.service.stats(ContainerRequest {
        container_id: "c9".into(),
        ..Default::default()
    });
    assert!(matches!(stats, Err(Error::ContainerNotFound(ref id)) if id == "c9"));
    let update = f.service.update(UpdateResourcesRequest {
        container_id: "c9".into(),
        ..Default::default()
    });
    assert!(matches!(update, Err(Error::ContainerNotFound(ref id)) if id == "c9"));
}

#[tokio::test]
async fn a_removal_kills_a_running_init_and_forgets_the_container() {
    let f = fixture(true, Faults::default());
    let mut init = sleeper();
    let c1 = f.container("c1", init.id() as i32);
    // The reaper's part: the init's exit, once the kill landed.
    let reaped = std::thread::spawn(move || {
        let status = init.wait().unwrap();
        c1.exits(137);
        status
    });
    f.service
        .remove(RemoveContainerRequest {
            container_id: "c1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(reaped.join().unwrap().signal(), Some(9));
    assert!(!f.service.containers.contains("c1"));
}
