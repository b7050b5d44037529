//! Host programs the shim runs (OCI hooks, `qemu-img`, `xorrisofs`): each is waited for
//! with a deadline and killed past it, and its exit is taken from whichever of the shim's
//! reaper and the child's own wait sees it first (the shim reaps every child it has, so
//! `Child::wait` alone can miss it). Output is read with bounds: [`read_head`] keeps the
//! first bytes of an answer, [`read_tail`] the last bytes of an error.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use containerd_shim::asynchronous::monitor::{monitor_subscribe, monitor_unsubscribe};
use containerd_shim::monitor::{Subject, Topic};
use tokio::io::AsyncReadExt;

/// How a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Its exit status (128 + the signal for a program a signal ended).
    Exited(i32),
    /// It ran past its deadline and was killed.
    TimedOut,
}

/// Starts `command`, writes `input` to its stdin (when it is piped) from a thread that
/// never blocks the shim, and waits for it at most `deadline`, killing it past that. The
/// command is dropped once started, closing the shim's copies of the pipes it was given.
pub async fn spawn_and_wait(
    mut command: Command,
    input: Vec<u8>,
    deadline: Duration,
) -> io::Result<Finished> {
    // Subscribed before the spawn, so that the reaper's report cannot come first.
    let mut exits = monitor_subscribe(Topic::Pid)
        .await
        .map_err(|e| io::Error::other(format!("subscribe to exits: {e}")))?;
    let spawned = command.spawn();
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = monitor_unsubscribe(exits.id).await;
            return Err(e);
        }
    };
    let pid = child.id() as i32;
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || stdin.write_all(&input));
    }
    let direct = tokio::task::spawn_blocking(move || child.wait());
    let reaped = async {
        while let Some(event) = exits.rx.recv().await {
            if matches!(event.subject, Subject::Pid(p) if p == pid) {
                return event.exit_code;
            }
        }
        std::future::pending().await
    };
    let direct = async {
        match direct.await {
            Ok(Ok(status)) => status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            // Reaped by the shim's reaper: its report comes through `reaped`.
            _ => std::future::pending().await,
        }
    };
    let code = tokio::time::timeout(deadline, async {
        tokio::select! {
            code = reaped => code,
            code = direct => code,
        }
    })
    .await;
    let _ = monitor_unsubscribe(exits.id).await;
    match code {
        Ok(code) => Ok(Finished::Exited(code)),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            Ok(Finished::TimedOut)
        }
    }
}

/// What a tool run by [`output`] left.
#[derive(Debug)]
pub struct ToolOutput {
    pub finished: Finished,
    /// At most the first `max_stdout` bytes of its stdout.
    pub stdout: Vec<u8>,
    /// Whether stdout went on past `max_stdout`.
    pub stdout_truncated: bool,
    /// The last [`ERROR_TAIL`] bytes of its stderr, lossily decoded.
    pub stderr_tail: String,
}

/// How much of a failed program's stderr its error carries.
pub const ERROR_TAIL: usize = 2048;

/// Runs a tool (stdin empty, environment cleared but for `PATH`, cwd `/`) and collects its
/// bounded output within `deadline`.
pub async fn output(
    program: &str,
    args: &[&std::ffi::OsStr],
    deadline: Duration,
    max_stdout: usize,
) -> io::Result<ToolOutput> {
    output_fed(program, args, Vec::new(), deadline, max_stdout).await
}

/// [`output`], the tool reading `input` on its stdin (none: stdin empty).
pub async fn output_fed(
    program: &str,
    args: &[&std::ffi::OsStr],
    input: Vec<u8>,
    deadline: Duration,
    max_stdout: usize,
) -> io::Result<ToolOutput> {
    output_as(program, args, input, deadline, max_stdout, None).await
}

/// Who a tool runs as and what it sees of the node: a pod's own user (not root), in the
/// pod's cgroup, in a view of the node's files of its own.
#[derive(Debug)]
pub struct ToolConfinement {
    pub uid: u32,
    pub gid: u32,
    /// `cgroup.procs` of each hierarchy of the pod's cgroup, opened for writing.
    pub cgroup_procs: Vec<std::fs::File>,
    pub view: crate::host::qemu_view::MountView,
}

async fn output_as(
    program: &str,
    args: &[&std::ffi::OsStr],
    input: Vec<u8>,
    deadline: Duration,
    max_stdout: usize,
    confinement: Option<ToolConfinement>,
) -> io::Result<ToolOutput> {
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .current_dir("/")
        .stdin(match input.is_empty() {
            true => Stdio::null(),
            false => Stdio::piped(),
        })
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w));
    if let Some(confinement) = confinement {
        confine(&mut command, confinement)?;
    }
    let stdout = tokio::spawn(read_head(out_r, max_stdout));
    let stderr = tokio::spawn(read_tail(err_r, ERROR_TAIL));
    let finished = match spawn_and_wait(command, input, deadline).await {
        Ok(finished) => finished,
        Err(e) => {
            stdout.abort();
            stderr.abort();
            return Err(e);
        }
    };
    // The tool is gone; its pipes end unless a process it left holds them.
    let grace = Duration::from_millis(500);
    let (stdout, stdout_truncated) = match tokio::time::timeout(grace, stdout).await {
        Ok(Ok(head)) => head,
        _ => (Vec::new(), false),
    };
    let stderr_tail = match tokio::time::timeout(grace, stderr).await {
        Ok(Ok(tail)) => tail,
        _ => String::new(),
    };
    Ok(ToolOutput {
        finished,
        stdout,
        stdout_truncated,
        stderr_tail,
    })
}

/// Makes `command`'s child, between its fork and its exec, join the cgroups, leave the
/// shim's session, OOM score and core dumps ([`crate::host::qemu_process::detach`]), gain
/// no privileges at its exec, enter the view and become the user of `confinement`, with no
/// other groups and no descriptor but its stdio.
fn confine(command: &mut Command, confinement: ToolConfinement) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let ToolConfinement {
        uid,
        gid,
        cgroup_procs,
        view,
    } = confinement;
    if uid == 0 || gid == 0 {
        return Err(io::Error::other("a confined tool runs as root"));
    }
    let cgroups: Vec<std::os::fd::RawFd> = cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect();
    let oom_score_adj = crate::host::qemu_process::oom_score_adj_path();
    // SAFETY: the closure makes only async-signal-safe system calls on data made before
    // the fork, and allocates nothing. The cgroup files stay open in it until the exec.
    unsafe {
        command.pre_exec(move || {
            let _open = &cgroup_procs;
            // The OOM score is written before the view leaves `/proc` read-only.
            let ok = crate::host::qemu_process::join_cgroups(&cgroups)
                && crate::host::qemu_process::detach(&oom_score_adj)
                && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && view.enter()
                && libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(gid) == 0
                && libc::setuid(uid) == 0
                && crate::host::qemu_process::close_all_but(&[]);
            match ok {
                true => Ok(()),
                false => Err(io::Error::last_os_error()),
            }
        });
    }
    Ok(())
}

/// [`run_tool`] as a pod's user, confined ([`ToolConfinement`]); then every process of
/// that user is ended ([`end_every_process_of`]): nothing the tool forked outlives it. No
/// other process may run as that user meanwhile (the pod's QEMU is not started yet).
pub async fn run_confined_tool(
    program: &str,
    args: &[&std::ffi::OsStr],
    deadline: Duration,
    what: &str,
    confinement: ToolConfinement,
) -> Result<(), crate::Error> {
    let uid = confinement.uid;
    let out = output_as(program, args, Vec::new(), deadline, 4096, Some(confinement)).await;
    let ended = end_every_process_of(uid).await;
    let out = out.map_err(|e| crate::Error::io(format!("run {program} ({what})"), e))?;
    ended.map_err(|e| {
        crate::Error::io(
            format!("end what {program} ({what}) left running as uid {uid}"),
            e,
        )
    })?;
    tool_result(program, what, deadline, out)
}

/// How long ending a user's processes may take.
const END_DEADLINE: Duration = Duration::from_secs(5);

/// Ends every process of `uid` (not root's): the shim sends each SIGKILL through a pidfd
/// taken while it is still that user's, again until none is left (a process that forked
/// meanwhile has the signal pending and cannot fork any more; root's signal no process of
/// the user can hold off). Fails past [`END_DEADLINE`].
pub async fn end_every_process_of(uid: u32) -> io::Result<()> {
    if uid == 0 {
        return Err(io::Error::other("not root's processes"));
    }
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + END_DEADLINE;
        loop {
            let live = crate::host::pod_user::processes_of(uid);
            if live.is_empty() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "processes {live:?} of uid {uid} outlived SIGKILL"
                )));
            }
            for pid in live {
                let Ok(Some(pidfd)) = crate::host::pidfd::open_if_running(pid) else {
                    continue;
                };
                // Still that user's once the descriptor holds it: the descriptor's process is.
                if crate::host::pod_user::runs_as(pid, uid) {
                    let _ = crate::host::pidfd::signal(&pidfd, libc::SIGKILL, "a tool's process");
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .map_err(io::Error::other)?
}

/// Runs a tool with [`output`] and turns anything but exit status 0 into an error that
/// names `what` with the end of its stderr (INTERNAL), or the deadline (DEADLINE_EXCEEDED).
pub async fn run_tool(
    program: &str,
    args: &[&std::ffi::OsStr],
    deadline: Duration,
    what: &str,
) -> Result<(), crate::Error> {
    run_tool_fed(program, args, Vec::new(), deadline, what).await
}

/// [`run_tool`], the tool reading `input` on its stdin.
pub async fn run_tool_fed(
    program: &str,
    args: &[&std::ffi::OsStr],
    input: Vec<u8>,
    deadline: Duration,
    what: &str,
) -> Result<(), crate::Error> {
    let out = output_fed(program, args, input, deadline, 4096)
        .await
        .map_err(|e| crate::Error::io(format!("run {program} ({what})"), e))?;
    tool_result(program, what, deadline, out)
}

/// Exit status 0 as `Ok`, anything else as an error that names `what`.
fn tool_result(
    program: &str,
    what: &str,
    deadline: Duration,
    out: ToolOutput,
) -> Result<(), crate::Error> {
    match out.finished {
        Finished::Exited(0) => Ok(()),
        Finished::Exited(code) => Err(crate::Error::Internal(format!(
            "{program} {what} exited with status {code}: {}",
            out.stderr_tail.trim()
        ))),
        Finished::TimedOut => Err(crate::Error::Timeout(format!(
            "{program} {what} did not finish within {} s",
            deadline.as_secs()
        ))),
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// Reads a pipe to its end (a reader that drops it would stall the writer), keeping the
/// first `max` bytes; also says whether there was more.
pub async fn read_head(pipe: OwnedFd, max: usize) -> (Vec<u8>, bool) {
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(pipe) else {
        return (Vec::new(), false);
    };
    let mut head = Vec::new();
    let mut more = false;
    let mut buf = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = max - head.len();
        head.extend_from_slice(&buf[..n.min(room)]);
        more |= n > room;
    }
    (head, more)
}

/// Reads a pipe to its end, keeping the last `max` bytes.
pub async fn read_tail(pipe: OwnedFd, max: usize) -> String {
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(pipe) else {
        return String::new();
    };
    let mut tail = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > max {
            tail.drain(..tail.len() - max);
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn args<'a>(a: &'a [&'a str]) -> Vec<&'a OsStr> {
        a.iter().map(OsStr::new).collect()
    }

    #[tokio::test]
    async fn output_is_bounded_and_split() {
        let out = output(
            "sh",
            &args(&["-c", "printf 0123456789; echo oops >&2; exit 3"]),
            Duration::from_secs(10),
            4,
        )
        .await
        .unwrap();
        assert_eq!(out.finished, Finished::Exited(3));
        assert_eq!(out.stdout, b"0123");
        assert!(out.stdout_truncated);
        assert_eq!(out.stderr_tail.trim(), "oops");
    }

    #[tokio::test]
    async fn a_program_past_its_deadline_is_killed() {
        let start = std::time::Instant::now();
        let out = output(
            "sh",
            &args(&["-c", "exec sleep 30"]),
            Duration::from_millis(200),
            16,
        )
        .await
        .unwrap();
        assert_eq!(out.finished, Finished::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// A confined tool runs as its user, writes nowhere, finds in its `/dev` the block node
    /// it was given, its user's, and leaves no process of that user behind.
    #[tokio::test]
    async fn a_confined_tool_is_its_user_in_a_read_only_view_with_its_node() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: a view is made by root");
            return;
        }
        // A uid no one else runs as.
        const ID: u32 = 3_999_917;
        let dir = tempfile::tempdir().unwrap();
        let (state, pod) = (dir.path().join("state"), dir.path().join("state/p"));
        std::fs::create_dir_all(&pod).unwrap();
        let confined = |script: &str| {
            let view = crate::host::qemu_view::MountView::new(&state, &pod, false)
                .unwrap()
                .with_block_device("vmlet-t", libc::makedev(7, 200), ID)
                .unwrap();
            let script = script.to_owned();
            async move {
                run_confined_tool(
                    "sh",
                    &args(&["-c", &script]),
                    Duration::from_secs(10),
                    "check",
                    ToolConfinement {
                        uid: ID,
                        gid: ID,
                        cgroup_procs: Vec::new(),
                        view,
                    },
                )
                .await
            }
        };
        confined(&format!(
            r#"test "$(id -u):$(id -g):$(id -G)" = {ID}:{ID}:{ID} &&
               ! touch /tmp/vmlet-confined-tool 2>/dev/null &&
               test "$(stat -c '%u %a %F %t:%T' /dev/vmlet-t)" = "{ID} 600 block special file 7:c8" &&
               grep -q '^NoNewPrivs:.*1' /proc/self/status &&
               (sleep 1000 >/dev/null 2>&1 &)"#
        ))
        .await
        .unwrap();
        let err = confined("echo refused >&2; exit 3").await.unwrap_err();
        assert!(err.message().contains("status 3: refused"), "{err}");
        assert!(!std::path::Path::new("/tmp/vmlet-confined-tool").exists());
        // Killed processes take a moment to go (and are zombies until reaped).
        let of_id = || -> Vec<std::ffi::OsString> {
            std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                        s.lines()
                            .any(|l| l == format!("Uid:\t{ID}\t{ID}\t{ID}\t{ID}"))
                            && !s.lines().any(|l| l.starts_with("State:\tZ"))
                    })
                })
                .map(|e| e.file_name())
                .collect()
        };
        let mut left = of_id();
        for _ in 0..40 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            left = of_id();
        }
        assert!(
            left.is_empty(),
            "processes of the tool's user left: {left:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_program_is_an_error() {
        let err = output("/nonexistent/tool", &[], Duration::from_secs(1), 16)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
