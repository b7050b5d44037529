//! The stdio of a process the agent launches: pipes, `/dev/null` or a pty, and the ends the
//! agent keeps for the host's streams.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;
use vmlet_protocol::agent as proto;
use vmlet_protocol::StreamKind;

use crate::launch::ChildStdio;
use crate::Error;

/// The agent's ends of a process's stdio pipes, until a stream connection takes them.
/// With a terminal, stdin and stdout are both the pty master and there is no stderr.
#[derive(Default)]
pub struct HostEnds {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub terminal: bool,
}

impl HostEnds {
    pub fn take(&mut self, kind: StreamKind) -> Option<OwnedFd> {
        match kind {
            StreamKind::Stdin => self.stdin.take(),
            StreamKind::Stdout => self.stdout.take(),
            StreamKind::Stderr => self.stderr.take(),
        }
    }
}

/// Capacity asked for stdio pipes (the default 64 KiB makes a writer wait on every
/// round trip to the host).
const PIPE_SIZE: i32 = 1024 * 1024;

fn pipe_pair() -> Result<(OwnedFd, OwnedFd), Error> {
    let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::io("pipe", e.into()))?;
    // Best effort: a smaller pipe only costs speed.
    let _ = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
    Ok((r, w))
}

fn dev_null() -> Result<OwnedFd, Error> {
    File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| Error::io("open /dev/null", e))
}

/// The stdio of a helper that serves the agent rather than a container (the exec server):
/// `/dev/null` in and out, and the agent's own stderr (the guest console) for its errors.
pub(crate) fn helper_stdio() -> Result<ChildStdio, Error> {
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("dup stderr", e))?;
    Ok(ChildStdio {
        stdin: dev_null()?,
        stdout: dev_null()?,
        stderr,
    })
}

/// Whether a process gets a terminal, from which devpts, and the size it starts with (the
/// spec's `consoleSize`; none: 0x0 until the host's first resize).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Terminal<'a> {
    None,
    /// The guest's devpts.
    Guest(Option<&'a proto::ConsoleSize>),
    /// The devpts whose `ptmx` this is (a container's).
    Devpts(&'a Path, Option<&'a proto::ConsoleSize>),
}

/// The size a request's process asks its terminal to start with.
pub(crate) fn console_size(process: Option<&proto::Process>) -> Option<&proto::ConsoleSize> {
    process.and_then(|p| p.console_size.as_ref())
}

/// The child's stdio and the agent's ends: pipes for the streams the host asked for,
/// `/dev/null` for the others; with a terminal, the pty slave for all three (and its master
/// for stdin and output, and as the third value for window-size changes).
pub(crate) fn stdio_for(
    stdio: Option<&proto::Stdio>,
    terminal: Terminal<'_>,
) -> Result<(ChildStdio, HostEnds, Option<OwnedFd>), Error> {
    let (pty, size) = match terminal {
        Terminal::None => (None, None),
        Terminal::Guest(size) => (Some(crate::pty::open()?), size),
        Terminal::Devpts(ptmx, size) => (Some(crate::pty::open_in(ptmx)?), size),
    };
    if let Some((master, slave)) = pty {
        if let Some(size) = size {
            crate::pty::resize(&master, size.width, size.height)?;
        }
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| Error::io("dup pty", e));
        let wants = |f: fn(&proto::Stdio) -> bool| stdio.is_some_and(f);
        let host = HostEnds {
            stdin: wants(|s| s.stdin).then(|| dup(&master)).transpose()?,
            stdout: wants(|s| s.stdout).then(|| dup(&master)).transpose()?,
            stderr: None,
            terminal: true,
        };
        let child = ChildStdio {
            stdin: dup(&slave)?,
            stdout: dup(&slave)?,
            stderr: slave,
        };
        return Ok((child, host, Some(master)));
    }
    let mut host = HostEnds::default();
    let stdin = if stdio.is_some_and(|s| s.stdin) {
        let (r, w) = pipe_pair()?;
        host.stdin = Some(w);
        r
    } else {
        dev_null()?
    };
    let output = |wanted: bool, slot: &mut Option<OwnedFd>| -> Result<OwnedFd, Error> {
        if wanted {
            let (r, w) = pipe_pair()?;
            *slot = Some(r);
            Ok(w)
        } else {
            dev_null()
        }
    };
    let stdout = output(stdio.is_some_and(|s| s.stdout), &mut host.stdout)?;
    let stderr = output(stdio.is_some_and(|s| s.stderr), &mut host.stderr)?;
    Ok((
        ChildStdio {
            stdin,
            stdout,
            stderr,
        },
        host,
        None,
    ))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn window_size(fd: &OwnedFd) -> (u16, u16) {
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes a winsize struct.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        (size.ws_row, size.ws_col)
    }

    #[test]
    fn a_terminal_starts_with_the_requested_size() {
        let size = proto::ConsoleSize {
            height: 33,
            width: 77,
            ..Default::default()
        };
        let (child, host, master) = stdio_for(None, Terminal::Guest(Some(&size))).unwrap();
        assert!(host.terminal);
        assert_eq!(window_size(&child.stdin), (33, 77));
        // Larger than a terminal holds: the largest it can.
        let huge = proto::ConsoleSize {
            height: 100_000,
            width: 80,
            ..Default::default()
        };
        crate::pty::resize(master.as_ref().unwrap(), huge.width, huge.height).unwrap();
        assert_eq!(window_size(&child.stdin), (65535, 80));
        let (child, _, _master) = stdio_for(None, Terminal::Guest(None)).unwrap();
        assert_eq!(window_size(&child.stdin), (0, 0));
    }

    #[test]
    fn without_a_terminal_streams_not_asked_for_are_dev_null() {
        let stdio = proto::Stdio {
            stdout: true,
            ..Default::default()
        };
        let (_, host, master) = stdio_for(Some(&stdio), Terminal::None).unwrap();
        assert!(master.is_none() && !host.terminal);
        assert!(host.stdin.is_none() && host.stdout.is_some() && host.stderr.is_none());
    }
}
