//! Processes of the shim's, held by pidfd: a signal reaches the process the pidfd was opened
//! for, never another that took its PID since, and its end can be awaited (a pidfd is
//! readable once the process has exited, reaped or not).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::Error;

/// A pidfd for `pid`.
pub fn open(pid: u32) -> Result<OwnedFd, Error> {
    open_if_running(pid)?.ok_or_else(|| {
        Error::io(
            format!("pidfd_open {pid}"),
            std::io::Error::from_raw_os_error(libc::ESRCH),
        )
    })
}

/// A pidfd for `pid`, or `None` where no process has that PID.
pub fn open_if_running(pid: u32) -> Result<Option<OwnedFd>, Error> {
    // SAFETY: pidfd_open takes a PID and flags; it returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            _ => Err(Error::io(format!("pidfd_open {pid}"), e)),
        };
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// Field `n` (counted from 1, as proc(5) counts them) of `/proc/PID/stat`; `None` once the
/// process is gone. The fields from the third on are counted after the command's closing
/// parenthesis: the command may hold any byte.
fn stat_field(pid: u32, n: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// The start time of `pid`, in clock ticks after the host's boot: with the PID, it tells a
/// process from any later one that takes the PID.
pub fn start_time(pid: u32) -> Option<u64> {
    stat_field(pid, 22)
}

/// The parent of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    stat_field(pid, 4).and_then(|p| u32::try_from(p).ok())
}

/// Whether the process of `pidfd` has not been reaped yet (a zombie still counts): while
/// it has not, its PID is no other process's.
pub fn not_reaped(pidfd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal of no signal (a check) with a pidfd the caller owns.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        ) == 0
    }
}

/// Sends `signal` to the process of `pidfd`; one that has ended already is no error.
/// `what` names the process for the error.
pub fn signal(pidfd: &OwnedFd, signal: i32, what: &str) -> Result<(), Error> {
    // SAFETY: pidfd_send_signal with a pidfd the caller owns, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    match std::io::Error::last_os_error() {
        e if rc != 0 && e.raw_os_error() != Some(libc::ESRCH) => {
            Err(Error::io(format!("signal {signal} to {what}"), e))
        }
        _ => Ok(()),
    }
}

/// Whether the process of `pidfd` ends within `within` (true at once if it has ended).
pub async fn ended_within(pidfd: &OwnedFd, within: Duration) -> Result<bool, Error> {
    let dup = pidfd.try_clone().map_err(|e| Error::io("dup a pidfd", e))?;
    // SAFETY: the AsyncFd owns `dup`, an open pidfd, for its whole life.
    let fd = unsafe { AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE) }
        .map_err(|e| Error::io("watch a pidfd", e.into()))?;
    match tokio::time::timeout(within, fd.readable()).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(e)) => Err(Error::io("wait on a pidfd", e)),
        Err(_) => Ok(false),
    }
}

/// Whether the process of `pidfd` ends within `within`, blocking the calling thread (for
/// the teardown, which runs off the runtime's threads).
pub fn wait_ended(pidfd: &OwnedFd, within: Duration) -> Result<bool, Error> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(pidfd),
        PollFlags::POLLIN,
    )];
    let timeout = PollTimeout::try_from(within).unwrap_or(PollTimeout::MAX);
    poll(&mut fds, timeout)
        .map(|n| n > 0)
        .map_err(|e| Error::io("wait on a pidfd", e.into()))
}

/// Collects the exit of the shim's child of `pidfd` if nobody has (the shim's reaper
/// usually has: then there is nothing to collect, and that is no error).
pub fn reap(pidfd: &OwnedFd) {
    // SAFETY: waitid on a pidfd the caller owns, into a zeroed siginfo; WNOHANG never blocks.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_past_any_command_name() {
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(u32::MAX), None);
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        assert_eq!(parent(child.id()), Some(std::process::id()));
        let pidfd = open(child.id()).unwrap();
        signal(&pidfd, libc::SIGKILL, "sleep").unwrap();
        assert!(wait_ended(&pidfd, Duration::from_secs(5)).unwrap());
        assert!(child.wait().is_ok());
    }

    #[tokio::test]
    async fn a_process_is_signalled_and_its_end_awaited_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pidfd = open(child.id()).unwrap();
        assert!(!ended_within(&pidfd, Duration::from_millis(50))
            .await
            .unwrap());
        signal(&pidfd, libc::SIGKILL, "sleep").unwrap();
        assert!(ended_within(&pidfd, Duration::from_secs(5)).await.unwrap());
        reap(&pidfd);
        assert!(ended_within(&pidfd, Duration::ZERO).await.unwrap());
        assert!(wait_ended(&pidfd, Duration::ZERO).unwrap());
        signal(&pidfd, libc::SIGKILL, "sleep").unwrap();
        // Collected by `reap` already: nothing is left to wait for.
        assert!(child.try_wait().is_err());
        assert!(open_if_running(child.id()).unwrap().is_none());
    }
}
