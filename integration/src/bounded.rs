//! Waiting for child processes with a deadline, so that a hang fails the test that met
//! it (naming the command) instead of stalling the whole run.

use std::io::Read;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// How long one client command (`ctr`, `virsh`, `ip`) may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Collects the output of a spawned child like [`Child::wait_with_output`], but kills it
/// and fails when it has not exited within `timeout`. `what` names it in the error.
pub fn output_within(mut child: Child, timeout: Duration, what: &str) -> anyhow::Result<Output> {
    drop(child.stdin.take());
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    // Readable once the child exited: waking then, not on a polling tick, keeps the times
    // the benchmarks take around commands exact.
    let exited = pidfd(&child).with_context(|| format!("pidfd of {what}"))?;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("wait for {what}"))?
        {
            break status;
        }
        let now = Instant::now();
        if now > deadline {
            let _ = child.kill();
            let _ = child.wait();
            // Whatever it printed helps to see where it stopped.
            let grace = Duration::from_secs(1);
            let err = stderr.recv_timeout(grace).unwrap_or_default();
            let out = stdout.recv_timeout(grace).unwrap_or_default();
            bail!(
                "{what} did not finish within {timeout:?} (killed); stdout: {:?} stderr: {:?}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        let left = deadline.saturating_duration_since(now).as_millis();
        let mut fds = [PollFd::new(exited.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(left.min(10_000) as i32).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => bail!("poll the pidfd of {what}: {e}"),
        }
    };
    // A grandchild may hold the pipes open after the child exited: do not wait on it.
    let grace = Instant::now() + Duration::from_secs(2);
    let rest = || grace.saturating_duration_since(Instant::now());
    Ok(Output {
        status,
        stdout: stdout.recv_timeout(rest()).unwrap_or_default(),
        stderr: stderr.recv_timeout(rest()).unwrap_or_default(),
    })
}

/// A pidfd of `child` (readable once it exited).
fn pidfd(child: &Child) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Runs `command` with no stdin and piped output, bounded by [`COMMAND_TIMEOUT`].
pub fn output(command: &mut Command) -> anyhow::Result<Output> {
    let what = describe(command);
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {what}"))?;
    output_within(child, COMMAND_TIMEOUT, &what)
}

/// `program arg...` for messages.
pub fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    } else {
        let _ = tx.send(Vec::new());
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_output_of_a_quick_command() {
        let out =
            output(Command::new("sh").args(["-c", "echo hi; echo oops >&2; exit 3"])).unwrap();
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn kills_a_command_that_hangs_and_names_it() {
        let child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let err = output_within(child, Duration::from_millis(200), "sleep 30").unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(err.to_string().contains("sleep 30 did not finish"), "{err}");
    }

    #[test]
    fn a_grandchild_holding_the_pipe_does_not_block() {
        let started = Instant::now();
        let out = output(Command::new("sh").args(["-c", "sleep 6 & echo parent"])).unwrap();
        assert!(out.status.success());
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
