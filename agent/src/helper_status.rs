//! A helper's status pipe (a container's init, an exec process, the exec server): whether it
//! says it is ready, or that it executed its process, within a deadline.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::Error;

/// How long a container's init, an exec process or an exec server may take to say it is
/// ready, or that it executed its process (a frozen or stopped one never does).
pub const HELPER_DEADLINE: Duration = Duration::from_secs(60);

/// A pipe read with a deadline for the whole of it: each read first polls for the time left
/// and fails with `TimedOut` when none is.
pub struct Deadline {
    file: std::fs::File,
    until: Instant,
}

impl Deadline {
    pub fn new(file: std::fs::File, within: Duration) -> Self {
        Self {
            file,
            until: Instant::now() + within,
        }
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        loop {
            let left = self.until.saturating_duration_since(Instant::now());
            let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(0) => continue,
                Ok(_) => return self.file.read(buf),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A helper's status read that failed: by its deadline (DEADLINE_EXCEEDED, naming what it
/// did not do in time) or otherwise.
pub fn timed_out_or_io(e: std::io::Error, id: &str, what: &str) -> Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        Error::Timeout(format!("{id} did not {what} within {HELPER_DEADLINE:?}"))
    } else {
        Error::io(format!("read {id}'s status"), e)
    }
}

/// Reads a helper's readiness from its status pipe: `R`, or `E<message>` (an error), or EOF
/// (an error), after an optional `P<pid>\n` whose PID is given to `handed_over` (and
/// returned) before the rest is read.
pub fn read_ready(
    status: &OwnedFd,
    id: &str,
    handed_over: impl FnOnce(i32),
) -> Result<Option<i32>, Error> {
    let file = std::fs::File::from(status.try_clone().map_err(|e| Error::io("dup", e))?);
    let mut file = Deadline::new(file, HELPER_DEADLINE);
    let mut read_byte = || -> Result<Option<u8>, Error> {
        let mut byte = [0u8; 1];
        let n = file
            .read(&mut byte)
            .map_err(|e| timed_out_or_io(e, id, "report ready"))?;
        Ok((n == 1).then_some(byte[0]))
    };
    let setup = |message: String| Error::ContainerSetup {
        id: id.into(),
        message,
    };
    let mut pid = None;
    let mut first = read_byte()?;
    if first == Some(b'P') {
        let mut digits = String::new();
        loop {
            match read_byte()? {
                Some(b'\n') => break,
                Some(d) if d.is_ascii_digit() && digits.len() < 10 => digits.push(d as char),
                other => return Err(setup(format!("bad PID report from the helper ({other:?})"))),
            }
        }
        let reported: i32 = digits
            .parse()
            .map_err(|_| setup(format!("bad PID {digits:?} from the helper")))?;
        handed_over(reported);
        pid = Some(reported);
        first = read_byte()?;
    }
    match first {
        Some(b'R') => Ok(pid),
        Some(b'E') => {
            let mut rest = String::new();
            let _ = file.take(64 * 1024).read_to_string(&mut rest);
            Err(setup(rest))
        }
        _ => Err(setup("the helper exited before it was ready".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (std::fs::File, std::fs::File) {
        let (r, w) = nix::unistd::pipe().unwrap();
        (std::fs::File::from(r), std::fs::File::from(w))
    }

    #[test]
    fn a_helper_that_never_reports_is_given_up_at_the_deadline() {
        let (r, _w) = pipe();
        let started = Instant::now();
        let mut byte = [0u8; 1];
        let err = Deadline::new(r, Duration::from_millis(150))
            .read(&mut byte)
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(started.elapsed() < Duration::from_secs(2));
        let message = timed_out_or_io(err, "c1", "report ready").to_string();
        assert!(message.contains("c1 did not report ready"), "{message}");
    }

    #[test]
    fn what_a_helper_writes_in_time_is_read() {
        let (r, mut w) = pipe();
        std::io::Write::write_all(&mut w, b"R").unwrap();
        drop(w);
        let mut text = String::new();
        Deadline::new(r, Duration::from_secs(5))
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "R");
    }
}
