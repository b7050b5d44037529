//! The stdio of a process the agent launches: pipes, `/dev/null` or a pty, and the ends the
//! agent keeps for the host's streams.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;
use vmlet_protocol::agent as proto;

use crate::containers::HostEnds;
use crate::launch::ChildStdio;
use crate::Error;

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

/// Whether a process gets a terminal, and from which devpts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Terminal<'a> {
    None,
    /// The guest's devpts.
    Guest,
    /// The devpts whose `ptmx` this is (a container's).
    Devpts(&'a Path),
}

/// The child's stdio and the agent's ends: pipes for the streams the host asked for,
/// `/dev/null` for the others; with a terminal, the pty slave for all three (and its master
/// for stdin and output, and as the third value for window-size changes).
pub(crate) fn stdio_for(
    stdio: Option<&proto::Stdio>,
    terminal: Terminal<'_>,
) -> Result<(ChildStdio, HostEnds, Option<OwnedFd>), Error> {
    let pty = match terminal {
        Terminal::None => None,
        Terminal::Guest => Some(crate::pty::open()?),
        Terminal::Devpts(ptmx) => Some(crate::pty::open_in(ptmx)?),
    };
    if let Some((master, slave)) = pty {
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
