//! Processes of the shim's, held by pidfd: a signal reaches the process the pidfd was opened
//! for, never another that took its PID since, and its end can be awaited (a pidfd is
//! readable once the process has exited, reaped or not).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::Error;

/// A pidfd for `pid`.
pub fn open(pid: u32) -> Result<OwnedFd, Error> {
    // SAFETY: pidfd_open takes a PID and flags; it returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if fd < 0 {
        return Err(Error::io(
            format!("pidfd_open {pid}"),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
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
        signal(&pidfd, libc::SIGKILL, "sleep").unwrap();
        // Collected by `reap` already: nothing is left to wait for.
        assert!(child.try_wait().is_err());
    }
}
