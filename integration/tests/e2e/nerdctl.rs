//! End to end through real nerdctl (built by `scripts/install-deps` from the pinned module
//! in `integration/nerdctl`): `nerdctl run --runtime io.containerd.vmlet.v2` attached and
//! detached, `nerdctl logs`, `nerdctl exec -t`, and nerdctl's default bridge network, which
//! its OCI hooks (run by the shim on the host) put into the pod's VM. Run by `make test`.

use crate::support::{stack, text};
use std::time::{Duration, Instant};

use vmlet_integration::terminal::run_on_terminal;
use vmlet_integration::{unique_id, Stack, RUNTIME};

/// `nerdctl run --runtime vmlet EXTRA... IMAGE COMMAND...`.
fn run(s: &Stack, extra: &[&str], command: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "--runtime", RUNTIME];
    args.extend_from_slice(extra);
    args.push(&s.image);
    args.extend_from_slice(command);
    s.nerdctl_output(&args).unwrap()
}

/// host-local's allocations of nerdctl's default network (one file per address).
fn bridge_leases() -> Vec<String> {
    std::fs::read_dir("/var/lib/cni/networks/bridge")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `nerdctl run -d --net none --name NAME ... COMMAND`, which must start; returns NAME.
fn run_detached(s: &Stack, prefix: &str, command: &[&str]) -> String {
    let name = unique_id(prefix);
    let out = run(s, &["-d", "--net", "none", "--name", &name], command);
    assert!(out.status.success(), "{}", text(&out.stderr));
    name
}

/// `nerdctl rm -f NAME`, which must succeed.
fn remove(s: &Stack, name: &str) {
    let rm = s.nerdctl_output(&["rm", "-f", name]).unwrap();
    assert!(rm.status.success(), "{}", text(&rm.stderr));
}

fn wait_for_logs(s: &Stack, name: &str, wanted: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = s.nerdctl_output(&["logs", name]).unwrap();
        let all = text(&out.stdout) + &text(&out.stderr);
        if wanted.iter().all(|w| all.contains(w)) || Instant::now() > deadline {
            return all;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn attached_run_prints_output_and_exit_code_from_the_vm() {
    let s = stack();
    let out = run(
        &s,
        &["--rm", "--net", "none"],
        &["sh", "-c", "uname -r; echo to-stderr >&2; exit 7"],
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let host = text(
        &std::process::Command::new("uname")
            .arg("-r")
            .output()
            .unwrap()
            .stdout,
    );
    let guest = text(&out.stdout);
    assert!(!guest.trim().is_empty());
    assert_ne!(guest.trim(), host.trim(), "ran on the host kernel");
    assert!(
        text(&out.stderr).contains("to-stderr"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn default_bridge_network_reaches_the_vm_and_is_released() {
    let s = stack();
    let before = bridge_leases();
    let out = run(
        &s,
        &["--rm"],
        &[
            "sh",
            "-c",
            "ip -4 -o addr show eth0; ping -c 1 -W 5 10.4.0.1 >/dev/null && echo gateway-ok; grep -c nerdctl /etc/hosts",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("inet 10.4.0."),
        "no bridge address in the VM: {stdout}"
    );
    assert!(
        stdout.contains("gateway-ok"),
        "gateway unreachable: {stdout}"
    );
    // nerdctl's poststop hook released the address (CNI DEL) after the VM was gone.
    assert_eq!(bridge_leases(), before, "CNI address left allocated");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn detached_run_logs_and_remove() {
    let s = stack();
    let name = unique_id("nerd-d");
    let out = run(
        &s,
        &["-d", "--name", &name],
        &["sh", "-c", "echo first; echo second >&2; sleep 1000"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let logs = wait_for_logs(&s, &name, &["first", "second"]);
    assert!(logs.contains("first") && logs.contains("second"), "{logs}");
    let ps = s.nerdctl_output(&["ps"]).unwrap();
    assert!(text(&ps.stdout).contains(&name), "{}", text(&ps.stdout));
    remove(&s, &name);
    let all = s.nerdctl_output(&["ps", "-a"]).unwrap();
    assert!(!text(&all.stdout).contains(&name), "{}", text(&all.stdout));
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn logs_keep_the_last_output_before_exit() {
    let s = stack();
    let name = run_detached(
        &s,
        "nerd-last",
        &["sh", "-c", "seq 1 500; printf final-unterminated"],
    );
    let logs = wait_for_logs(&s, &name, &["final-unterminated"]);
    assert!(logs.contains("final-unterminated"), "{logs}");
    let lines: Vec<&str> = logs.lines().collect();
    assert!(lines.contains(&"1") && lines.contains(&"500"), "{logs}");
    remove(&s, &name);
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exec_with_a_terminal_starts_at_the_callers_size() {
    let s = stack();
    let name = run_detached(&s, "nerd-tty", &["sleep", "1000"]);
    // nerdctl names a stderr FIFO it does not make (the terminal carries all output), puts
    // its terminal's size in the exec's consoleSize and resizes before the start: the
    // first `stty size` sees the size.
    let mut command = s.nerdctl();
    command.args(["exec", "-t", &name, "stty", "size"]);
    let seen = run_on_terminal(command, 33, 77);
    remove(&s, &name);
    let (out, seen) = seen.unwrap();
    assert!(out.status.success(), "{}: {seen:?}", out.status);
    assert!(seen.contains("33 77"), "stty size inside: {seen:?}");
}
