//! Pseudo-terminals for processes that asked for one: the process gets the slave end as
//! stdin, stdout and stderr; the agent keeps the master, which carries both directions of
//! the stdio streams and takes window-size changes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::Error;

/// A new pseudo-terminal: `(master, slave)`, both close-on-exec.
pub fn open() -> Result<(OwnedFd, OwnedFd), Error> {
    let pty = nix::pty::openpty(None, None).map_err(|e| Error::io("openpty", e.into()))?;
    for fd in [&pty.master, &pty.slave] {
        fcntl(fd, FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
            .map_err(|e| Error::io("set close-on-exec on a pty", e.into()))?;
    }
    Ok((pty.master, pty.slave))
}

/// A new pseudo-terminal from the devpts instance whose `ptmx` is at `ptmx` (a
/// container's, reached through `/proc/<pid>/root`), so that the process finds its
/// terminal as `/dev/pts/N` inside. The slave comes from the master (TIOCGPTPEER), with no
/// path lookup. `(master, slave)`, both close-on-exec.
pub fn open_in(ptmx: &std::path::Path) -> Result<(OwnedFd, OwnedFd), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let master: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(ptmx)
        .map_err(|e| Error::io(format!("open {}", ptmx.display()), e))?
        .into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int; TIOCGPTPEER takes open flags and returns a new fd.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } != 0 {
        return Err(Error::io("unlock pty", io::Error::last_os_error()));
    }
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: as above.
    let slave = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if slave < 0 {
        return Err(Error::io("open pty peer", io::Error::last_os_error()));
    }
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    let slave = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(slave) };
    Ok((master, slave))
}

/// Sets the window size a terminal's processes see (TIOCSWINSZ on the master); a
/// dimension above a terminal's 65535 becomes 65535.
pub fn resize(master: &OwnedFd, width: u32, height: u32) -> Result<(), Error> {
    let clamp = |v: u32| v.min(u32::from(u16::MAX)) as u16;
    let size = libc::winsize {
        ws_row: clamp(height),
        ws_col: clamp(width),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a valid winsize struct.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
        return Err(Error::io("resize terminal", io::Error::last_os_error()));
    }
    Ok(())
}

/// The master end as an async byte stream. Reading ends (EOF) when the last slave
/// descriptor is closed, which Linux reports as EIO.
pub struct Master {
    fd: AsyncFd<OwnedFd>,
}

impl Master {
    pub fn new(fd: OwnedFd) -> Result<Self, Error> {
        let flags =
            fcntl(&fd, FcntlArg::F_GETFL).map_err(|e| Error::io("get pty flags", e.into()))?;
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        fcntl(&fd, FcntlArg::F_SETFL(flags))
            .map_err(|e| Error::io("make pty non-blocking", e.into()))?;
        // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as long as it lives.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|e| Error::io("register pty", std::io::Error::from(e)))?;
        Ok(Self { fd })
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let result = guard.try_io(|fd| {
                // SAFETY: reads into the initialized, unfilled part of the buffer.
                let n = unsafe {
                    libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len())
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let result = guard.try_io(|fd| {
                // SAFETY: writes from a valid slice.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
