//! End to end through `ctr` against the private stack (real containerd 1.6, libvirtd, QEMU
//! under TCG, virtiofsd, vhost-device-vsock). Run by `make test`; alone with
//! `eval "$(scripts/stack up)"; scripts/e2e ctr`.

use crate::support::stack;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use vmlet_integration::bounded::{output_within, COMMAND_TIMEOUT};
use vmlet_integration::terminal::{run_on_terminal, WAIT_FOR_A_SIZE};
use vmlet_integration::{unique_id, RUNTIME};

const BOOT: Duration = Duration::from_secs(90);

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn guest_kernel_differs_from_host() {
    let s = stack();
    let out = s.run(&unique_id("uname"), &[], &["uname", "-r"]).unwrap();
    assert!(
        out.status.success(),
        "ctr run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let guest = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let host = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .unwrap();
    let host = String::from_utf8_lossy(&host.stdout).trim().to_owned();
    let manifest = std::fs::read_to_string(format!("{}/manifest.json", s.guest_dir)).unwrap();
    assert!(!guest.is_empty());
    assert_ne!(guest, host, "the container ran on the host kernel");
    assert!(
        manifest.contains(&guest),
        "guest kernel {guest} is not the image's"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn exit_code_propagates() {
    let s = stack();
    let out = s
        .run(&unique_id("exit"), &[], &["sh", "-c", "exit 7"])
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn stdin_and_stdout_reach_the_container() {
    let s = stack();
    let id = unique_id("stdin");
    let mut child = s
        .ctr()
        .args([
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            &s.image,
            &id,
            "sh",
            "-c",
            "read x; echo got-$x; echo err >&2",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // ctr forwards stdin but never closes it: the reader stops by itself after one line.
    child.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    let out = output_within(child, COMMAND_TIMEOUT, "ctr run").unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "got-hello");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));
}

/// A process that cannot be executed ends its task as under runc: the start fails naming
/// why, the task is stopped, and `ctr run --rm` removes it; in a pod the same, while the
/// pod runs on.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_start_that_cannot_exec_stops_the_task_and_leaves_nothing() {
    let s = stack();
    let id = unique_id("noexec");
    let out = s.run(&id, &[], &["/etc/passwd"]).unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(said.contains("Permission denied"), "{said}");
    assert_eq!(s.task_status(&id).unwrap(), None, "task left: {said}");
    assert!(!s.has_pod_domain(&id));
    assert_eq!(s.pod_processes(&id), Vec::new(), "processes left");

    let pod = unique_id("noexec-pod");
    s.run_detached(&pod, &["sleep", "1000"]).unwrap();
    let in_pod = format!("io.kubernetes.cri.sandbox-id={pod}");
    let member = unique_id("noexec-member");
    let extra = [
        "--annotation",
        "io.kubernetes.cri.container-type=container",
        "--annotation",
        in_pod.as_str(),
    ];
    let out = s.run(&member, &extra, &["/etc/passwd"]).unwrap();
    assert!(!out.status.success());
    assert_eq!(s.task_status(&member).unwrap(), None, "member task left");
    assert_eq!(s.task_status(&pod).unwrap().as_deref(), Some("RUNNING"));
    s.kill_and_remove(&pod).unwrap();
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn sigterm_reaches_a_handler() {
    let s = stack();
    let id = unique_id("term");
    let mut child = s
        .spawn_run(
            &id,
            &[],
            &[
                "sh",
                "-c",
                "trap 'exit 143' TERM; echo ready; while :; do sleep 1; done",
            ],
        )
        .unwrap();
    // Signal only once the handler is installed (as with runc, a signal that comes first
    // meets PID 1 without a handler and is ignored).
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let kill = s.ctr_output(&["task", "kill", &id]).unwrap();
    assert!(
        kill.status.success(),
        "{}",
        String::from_utf8_lossy(&kill.stderr)
    );
    let out = output_within(child, COMMAND_TIMEOUT, "ctr run").unwrap();
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn pid1_ignores_sigterm_and_dies_on_sigkill() {
    let s = stack();
    let id = unique_id("kill");
    let child = s.spawn_run(&id, &[], &["sleep", "1000"]).unwrap();
    s.wait_status(&id, "RUNNING", BOOT).unwrap();
    assert!(s
        .ctr_output(&["task", "kill", &id])
        .unwrap()
        .status
        .success());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        s.task_status(&id).unwrap().as_deref(),
        Some("RUNNING"),
        "PID 1 without a handler must ignore SIGTERM"
    );
    assert!(s
        .ctr_output(&["task", "kill", "-s", "SIGKILL", &id])
        .unwrap()
        .status
        .success());
    let out = output_within(child, COMMAND_TIMEOUT, "ctr run").unwrap();
    assert_eq!(
        out.status.code(),
        Some(137),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn killed_detached_task_can_be_deleted() {
    let s = stack();
    let id = unique_id("detached");
    let run = s
        .ctr_output(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            &s.image,
            &id,
            "sleep",
            "1000",
        ])
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    s.wait_status(&id, "RUNNING", BOOT).unwrap();
    assert!(s
        .ctr_output(&["task", "kill", "-s", "SIGKILL", &id])
        .unwrap()
        .status
        .success());
    s.wait_status(&id, "STOPPED", Duration::from_secs(30))
        .unwrap();
    let delete = s.ctr_output(&["task", "delete", &id]).unwrap();
    assert!(
        delete.status.success(),
        "{}",
        String::from_utf8_lossy(&delete.stderr)
    );
    assert!(
        String::from_utf8_lossy(&delete.stderr).contains("137"),
        "ctr reports the exit code: {}",
        String::from_utf8_lossy(&delete.stderr)
    );
    assert!(s
        .ctr_output(&["container", "rm", &id])
        .unwrap()
        .status
        .success());
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn bad_memory_annotation_is_refused_by_name() {
    let s = stack();
    let id = unique_id("badmem");
    let out = s
        .run(&id, &["--annotation", "vmlet.io/memory=lots"], &["true"])
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("vmlet.io/memory"), "{stderr}");
    assert!(stderr.contains("lots"), "{stderr}");
    assert!(
        !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
        "state left behind"
    );
    let _ = s.ctr_output(&["container", "rm", &id]);
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn bind_mounts_reach_the_container() {
    let s = stack();
    let base = std::env::temp_dir().join(unique_id("vmlet-bind"));
    let dir = base.join("dir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("in.txt"), "from-host\n").unwrap();
    let file = base.join("file");
    std::fs::write(&file, "file-content\n").unwrap();
    let rw = format!("type=bind,src={},dst=/data,options=rbind:rw", dir.display());
    let ro = format!(
        "type=bind,src={},dst=/etc/vmlet-file,options=rbind:ro",
        file.display()
    );
    let out = s
        .run(
            &unique_id("bind"),
            &["--mount", &rw, "--mount", &ro],
            &[
                "sh",
                "-c",
                "cat /data/in.txt; echo from-pod > /data/out.txt; cat /etc/vmlet-file; \
                 (echo x > /etc/vmlet-file) 2>/dev/null || echo RO-OK",
            ],
        )
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let written = std::fs::read_to_string(dir.join("out.txt"));
    let file_after = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_dir_all(&base).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in ["from-host", "file-content", "RO-OK"] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    assert_eq!(written.unwrap(), "from-pod\n");
    assert_eq!(file_after, "file-content\n");
}

/// The stack's pods (TCG, the lean kernel) run with both of the lean kernel's patches on:
/// a page cache page is zeroed before virtiofsd fills it, and an unchanged file keeps its
/// pages across opens.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn the_lean_kernels_patches_are_on_under_tcg() {
    let s = stack();
    let out = s
        .run(
            &unique_id("patches"),
            &[],
            &[
                "cat",
                "/sys/module/virtiofs/parameters/zero_reply_pages",
                "/sys/module/fuse/parameters/keep_unchanged_cache",
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "ctr run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Y\nY\n");
}

/// The guest keeps an unchanged file's pages across opens (`fuse.keep_unchanged_cache`); a
/// file the host changes in place at the same size is seen at its next open: a data file and
/// a script, one the guest changed the mode of in between (which brings the new mtime into
/// the guest without a read), and one whose mtime the host set back.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_file_changed_on_the_host_is_seen_at_its_next_open() {
    let s = stack();
    let dir = std::env::temp_dir().join(unique_id("vmlet-changed"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = |word: &str| format!("#!/bin/sh\necho {word}\n");
    // Over the old bytes, at the same size; the old mtime back when `keep_mtime`.
    let write = |name: &str, text: &str, keep_mtime: bool| {
        let path = dir.join(name);
        let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        file.write_all(text.as_bytes()).unwrap();
        if let (true, Some(mtime)) = (keep_mtime, mtime) {
            file.set_modified(mtime).unwrap();
        }
        file.sync_all().unwrap();
    };
    write("data.txt", "first\n", false);
    write("prog", &script("one"), false);
    std::fs::set_permissions(
        dir.join("prog"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let id = unique_id("changed");
    let mount = format!("type=bind,src={},dst=/data,options=rbind:rw", dir.display());
    s.run_detached_with(&id, &["--mount", &mount], &["sleep", "1000"])
        .unwrap();
    let run = |exec_id: &str, script: &str| {
        let out = s
            .ctr_output(&[
                "task",
                "exec",
                "--exec-id",
                exec_id,
                &id,
                "sh",
                "-c",
                script,
            ])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let read = |exec_id: &str| run(exec_id, "cat /data/data.txt; /data/prog");
    let before = [read("r1"), read("r2")];
    write("data.txt", "later\n", false);
    write("prog", &script("two"), false);
    let changed = read("r3");
    write("data.txt", "again\n", false);
    let after_chmod = run("r4", "chmod 0644 /data/data.txt; cat /data/data.txt");
    write("data.txt", "final\n", true);
    let mtime_back = run("r5", "cat /data/data.txt");
    s.kill_and_remove(&id).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    for seen in &before {
        assert_eq!(seen, "first\none\n");
    }
    assert_eq!(
        changed, "later\ntwo\n",
        "a change was not seen at the next open"
    );
    assert_eq!(
        after_chmod, "again\n",
        "a change was lost to the guest's chmod"
    );
    assert_eq!(
        mtime_back, "final\n",
        "a change with its mtime set back was not seen"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn containers_of_a_pod_share_its_vm() {
    let s = stack();
    let pod = unique_id("pod");
    let sandbox_type = "io.kubernetes.cri.container-type=sandbox";
    let container_type = "io.kubernetes.cri.container-type=container";
    let in_pod = format!("io.kubernetes.cri.sandbox-id={pod}");
    let run = s
        .ctr_output(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            "--annotation",
            sandbox_type,
            "--annotation",
            &in_pod,
            &s.image,
            &pod,
            "sleep",
            "1000",
        ])
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    s.wait_status(&pod, "RUNNING", BOOT).unwrap();

    let in_container = |id: &str, script: &str| {
        let out = s
            .run(
                id,
                &["--annotation", container_type, "--annotation", &in_pod],
                &["sh", "-c", script],
            )
            .unwrap();
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let one = in_container(
        &unique_id("c1"),
        "cat /proc/sys/kernel/random/boot_id; touch /only-in-c1",
    );
    let two = in_container(
        &unique_id("c2"),
        "cat /proc/sys/kernel/random/boot_id; ls /",
    );
    let boot_one = one.lines().next().unwrap_or_default();
    assert!(!boot_one.is_empty());
    assert_eq!(
        Some(boot_one),
        two.lines().next(),
        "the containers ran in different VMs"
    );
    assert!(!two.contains("only-in-c1"), "c2 sees c1's rootfs:\n{two}");
    // The pod's shim (a shim of an earlier test may still be on its way out).
    let shims = s
        .pod_processes(&pod)
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains("containerd-shim-vmlet"))
        .count();
    assert_eq!(shims, 1, "one shim for the pod");

    s.kill_and_remove(&pod).unwrap();
}

/// Polls `path` until it contains every needle or 10 s pass; returns its text.
fn wait_for_text(path: &std::path::Path, needles: &[&str]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if needles.iter().all(|n| text.contains(n)) || std::time::Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn log_uris_deliver_the_output() {
    let s = stack();
    let dir = std::env::temp_dir().join(unique_id("vmlet-logs"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = ["sh", "-c", "echo out-line; echo err-line >&2"];

    let file_log = dir.join("file.log");
    let out = s
        .run(
            &unique_id("logfile"),
            &["--log-uri", &format!("file://{}", file_log.display())],
            &script,
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = wait_for_text(&file_log, &["out-line", "err-line"]);
    assert!(
        text.contains("out-line") && text.contains("err-line"),
        "file log: {text:?}"
    );

    // A logging binary as containerd runs them: streams on fds 3 and 4, ready when fd 5
    // is closed, the container id in its environment, URI query pairs as arguments.
    let logger = dir.join("logger.sh");
    std::fs::write(
        &logger,
        "#!/bin/sh\nexec 5>&-\necho \"id=$CONTAINER_ID\" >>\"$2\"\ncat <&3 >>\"$2\" &\ncat <&4 >>\"$2\" &\nwait\n",
    )
    .unwrap();
    std::fs::set_permissions(&logger, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let binary_log = dir.join("binary.log");
    let id = unique_id("logbin");
    let uri = format!("binary://{}?out={}", logger.display(), binary_log.display());
    let out = s.run(&id, &["--log-uri", &uri], &script).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id_line = format!("id={id}");
    let text = wait_for_text(&binary_log, &["out-line", "err-line", &id_line]);
    std::fs::remove_dir_all(&dir).unwrap();
    for expected in ["out-line", "err-line", id_line.as_str()] {
        assert!(
            text.contains(expected),
            "missing {expected:?} in the binary log: {text:?}"
        );
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn run_with_a_terminal_gets_its_size() {
    let s = stack();
    let id = unique_id("tty");
    let mut command = s.ctr();
    command
        .args(["run", "--rm", "-t", "--runtime", RUNTIME, &s.image, &id])
        .args(["sh", "-c"])
        .arg(WAIT_FOR_A_SIZE.to_owned() + "; [ -t 1 ] && echo is-a-tty; exit 4");
    let (out, seen) = run_on_terminal(command, 20, 50).unwrap();
    assert_eq!(out.status.code(), Some(4), "{seen}");
    assert!(seen.contains("20 50"), "stty size inside: {seen:?}");
    assert!(seen.contains("is-a-tty"), "{seen:?}");
}
