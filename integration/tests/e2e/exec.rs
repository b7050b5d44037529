//! `ctr task exec` end to end: further processes in a running container's namespaces,
//! with and without a terminal, their stdio, exit codes, signals and events. The tests that
//! only run processes in a container share one. Run by `make test`; alone with
//! `eval "$(scripts/stack up)"; scripts/e2e exec`.

use crate::support::text;
use std::io::Write;
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vmlet_integration::bounded::{output_within, COMMAND_TIMEOUT};
use vmlet_integration::terminal::{run_on_terminal, WAIT_FOR_A_SIZE};
use vmlet_integration::{unique_id, Stack, RUNTIME};

const BOOT: Duration = Duration::from_secs(90);

/// A detached container running `sleep 1000`, killed and removed on drop.
struct Running {
    stack: Stack,
    id: String,
}

impl Running {
    fn start(prefix: &str) -> Self {
        let stack = Stack::from_env().expect("the vmlet stack");
        let id = unique_id(prefix);
        let run = stack
            .ctr_output(&[
                "run",
                "-d",
                "--runtime",
                RUNTIME,
                &stack.image,
                &id,
                "sleep",
                "1000",
            ])
            .unwrap();
        assert!(run.status.success(), "{}", text(&run.stderr));
        stack.wait_status(&id, "RUNNING", BOOT).unwrap();
        Self { stack, id }
    }

    /// `ctr task exec --exec-id EXEC [FLAGS...] ID ARGS...` with no stdin.
    fn exec(&self, exec_id: &str, flags: &[&str], args: &[&str]) -> Output {
        let mut all = vec!["task", "exec", "--exec-id", exec_id];
        all.extend_from_slice(flags);
        all.push(&self.id);
        all.extend_from_slice(args);
        self.stack.ctr_output(&all).unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        remove(&self.stack, &self.id);
    }
}

fn remove(stack: &Stack, id: &str) {
    if let Err(e) = stack.kill_and_remove(id) {
        eprintln!("cleanup of {id}: {e}");
    }
}

/// The container that the tests which only run processes in it share (those that list or
/// change its processes start their own): started by the first of them, removed when the
/// suite's process exits (a static is never dropped).
static SHARED: OnceLock<Running> = OnceLock::new();

fn shared() -> &'static Running {
    SHARED.get_or_init(|| {
        let running = Running::start("exec-shared");
        // SAFETY: registers a plain function with no arguments, run once at exit.
        unsafe { libc::atexit(remove_shared) };
        running
    })
}

extern "C" fn remove_shared() {
    if let Some(c) = SHARED.get() {
        remove(&c.stack, &c.id);
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exec_returns_stdout_stderr_and_exit_code() {
    let c = shared();
    let out = c.exec("e1", &[], &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "out");
    assert!(text(&out.stderr).contains("err"), "{}", text(&out.stderr));
    // The same exec id can be used again once the first is gone.
    let again = c.exec("e1", &[], &["true"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exec_joins_the_containers_namespaces_and_root() {
    let c = shared();
    let script = "[ \"$(readlink /proc/self/ns/pid)\" = \"$(readlink /proc/1/ns/pid)\" ] && \
                  [ \"$(readlink /proc/self/ns/mnt)\" = \"$(readlink /proc/1/ns/mnt)\" ] && \
                  cat /proc/1/cmdline | tr '\\0' ' ' && ls /bin/busybox";
    let out = c.exec("ns", &[], &["sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("sleep 1000"),
        "PID 1 is the container's: {stdout}"
    );
    assert!(
        stdout.contains("/bin/busybox"),
        "the container's rootfs: {stdout}"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_process_without_home_gets_its_users_as_runc_gives_it() {
    let c = shared();
    let home = |exec_id: &str, flags: &[&str], command: &str| {
        let out = c.exec(exec_id, flags, &["sh", "-c", command]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };
    // The init's, then execs': root's home in the image's /etc/passwd, nobody's, and `/` for
    // a uid it has no line for.
    let init = home("h0", &[], "tr '\\0' '\\n' </proc/1/environ | grep '^HOME='");
    assert_eq!(init, "HOME=/root");
    assert_eq!(home("h1", &[], "echo $HOME"), "/root");
    assert_eq!(home("h2", &["--user", "65534"], "echo $HOME"), "/home");
    assert_eq!(home("h3", &["--user", "4242"], "echo $HOME"), "/");
    // A HOME the process's environment names is kept.
    let id = unique_id("home");
    let run = c
        .stack
        .run(
            &id,
            &["--env", "HOME=/elsewhere"],
            &["sh", "-c", "echo $HOME"],
        )
        .unwrap();
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout).trim(), "/elsewhere");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exec_stdin_reaches_the_process() {
    let c = shared();
    let mut child = c
        .stack
        .ctr()
        .args(["task", "exec", "--exec-id", "cat", &c.id, "sh", "-c"])
        .arg("read line; echo got-$line")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    let out = output_within(child, COMMAND_TIMEOUT, "ctr task exec").unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "got-hello");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exec_with_a_terminal_gets_its_size() {
    let c = Running::start("exec-tty");
    // ctr takes its terminal's size from its own stdin; give it a terminal of 33x77. ctr
    // sends the size only after the process started (its spec has no consoleSize), so the
    // process waits for it, as long as 5 s.
    let mut command = c.stack.ctr();
    command
        .args(["task", "exec", "-t", "--exec-id", "tty", &c.id, "sh", "-c"])
        .arg(WAIT_FOR_A_SIZE.to_owned() + "; [ -t 0 ] && echo is-a-tty; tty");
    let (out, seen) = run_on_terminal(command, 33, 77).unwrap();
    assert!(out.status.success(), "{}: {seen:?}", out.status);
    assert!(seen.contains("33 77"), "stty size inside: {seen:?}");
    assert!(seen.contains("is-a-tty"), "{seen:?}");
    assert!(
        seen.contains("/dev/pts/0"),
        "tty names the container's pty: {seen:?}"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exec_of_a_missing_program_fails_clearly() {
    let c = shared();
    let out = c.exec("missing", &[], &["/no/such/program"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("/no/such/program") && stderr.contains("No such file"),
        "{stderr}"
    );
    // The container is unharmed.
    let ok = c.exec("after", &[], &["true"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn detached_exec_runs_is_killed_and_reported() {
    let c = Running::start("exec-kill");
    let events = c.stack.watch_events().unwrap();
    let out = c.exec("bg", &["-d"], &["sleep", "600"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The container's processes as `ps` inside it lists them (`ctr task ps` shows the pod's
    // VM on the host, not guest PIDs).
    let mut probes = 0;
    let mut sleeping = || {
        probes += 1;
        let ps = c.exec(&format!("ps{probes}"), &[], &["ps", "-o", "args"]);
        assert!(ps.status.success(), "{}", text(&ps.stderr));
        text(&ps.stdout).lines().any(|l| l.trim() == "sleep 600")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sleeping() {
        assert!(Instant::now() < deadline, "the exec is not running");
        std::thread::sleep(Duration::from_millis(100));
    }
    let kill = c
        .stack
        .ctr_output(&["task", "kill", "--exec-id", "bg", "-s", "SIGKILL", &c.id])
        .unwrap();
    assert!(kill.status.success(), "{}", text(&kill.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleeping() {
        assert!(Instant::now() < deadline, "the exec still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = events.stop().unwrap();
    for (topic, field) in [
        ("/tasks/exec-added", "\"exec_id\":\"bg\""),
        ("/tasks/exec-started", "\"exec_id\":\"bg\""),
        ("/tasks/exit", "\"id\":\"bg\""),
    ] {
        assert!(
            seen.lines()
                .any(|l| l.contains(topic) && l.contains(field) && l.contains(&c.id)),
            "no {topic} event for the exec in:\n{seen}"
        );
    }
    assert!(
        seen.lines()
            .any(|l| l.contains("/tasks/exit") && l.contains("\"id\":\"bg\"") && l.contains("137")),
        "the exec's exit status is 137:\n{seen}"
    );
}
