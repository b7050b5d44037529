//! A VM image's serial console (docs/vm-mode.md) over a Unix socket that QEMU connects as
//! it starts (`<serial type="unix">`, the shim listening): one task reads it as QEMU
//! writes, into the console log (`vmletctl console`, diagnostics), restarted at
//! [`LOG_CAP`], and into the task's stdout once it is attached; what came before that is
//! kept, up to [`BACKLOG_CAP`]. The task's stdin goes to the console's input (the guest's
//! `ttyS0`). The guest writes as fast as it likes: every read is bounded, and a stdout that
//! does not take its output holds the console up, not the shim's memory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::stdio::{Copies, Output};
use crate::Error;

/// The console log starts again (empty) when it reaches this size; the log tmpfs is the
/// pod's ([`crate::log_dir`]).
pub const LOG_CAP: u64 = 2 << 20;
/// The most output kept for a stdout that is not attached yet.
pub const BACKLOG_CAP: usize = 1 << 20;
/// Bytes moved per read.
const READ_BUFFER: usize = 64 * 1024;

/// The console of a running VM image.
pub struct SerialConsole {
    attach: mpsc::UnboundedSender<Attach>,
    /// The console's input, until a stdin takes it.
    input: Mutex<Option<OwnedWriteHalf>>,
}

/// A stdout for the console's output, and who to tell when it has all of it.
struct Attach {
    stdout: Output,
    done: oneshot::Sender<()>,
}

impl SerialConsole {
    /// Starts reading the console QEMU connected (`stream`) into the log at `log`.
    pub fn start(stream: UnixStream, log: &Path) -> Result<SerialConsole, Error> {
        let log = ConsoleLog::create(log)?;
        let (read, write) = stream.into_split();
        let (attach, attached) = mpsc::unbounded_channel();
        tokio::spawn(pump(read, log, attached));
        Ok(SerialConsole {
            attach,
            input: Mutex::new(Some(write)),
        })
    }

    /// Sends the console's output (from its first byte, as far as [`BACKLOG_CAP`] kept it)
    /// to `stdout` until QEMU ends, and `stdin` (containerd's FIFO) to its input, until
    /// `close_stdin`. A console takes one stdin and one stdout, for its one process.
    pub fn attach(
        &self,
        stdout: Option<Output>,
        stdin: Option<tokio::net::unix::pipe::Receiver>,
    ) -> Result<Copies, Error> {
        let mut copies = Copies::default();
        if let Some(stdout) = stdout {
            let (done, finished) = oneshot::channel();
            self.attach
                .send(Attach { stdout, done })
                .map_err(|_| Error::FailedPrecondition("the VM's console has ended".into()))?;
            copies.push_output(tokio::spawn(async move {
                let _ = finished.await;
            }));
        }
        if let Some(fifo) = stdin {
            let input = self.input.lock().unwrap().take().ok_or_else(|| {
                Error::FailedPrecondition("the VM's console has a stdin already".into())
            })?;
            copies.copy_stdin_to(fifo, ConsoleInput(Some(input)));
        }
        Ok(copies)
    }
}

/// The console's input as a stdin copy writes it. The end of stdin is not the console's:
/// QEMU takes a half-closed socket for a hang-up and drops the console (its output too), so
/// neither a shutdown nor a drop closes the socket's write side; it closes with the
/// console's reader.
struct ConsoleInput(Option<OwnedWriteHalf>);

impl tokio::io::AsyncWrite for ConsoleInput {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(input) => std::pin::Pin::new(input).poll_write(cx, buf),
            None => std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(input) => std::pin::Pin::new(input).poll_flush(cx),
            None => std::task::Poll::Ready(Ok(())),
        }
    }

    /// Stops writing; the socket stays open.
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl Drop for ConsoleInput {
    fn drop(&mut self) {
        if let Some(input) = self.0.take() {
            input.forget();
        }
    }
}

/// The console log: written as the console is read, started again at [`LOG_CAP`].
struct ConsoleLog {
    file: std::fs::File,
    path: PathBuf,
    written: u64,
    /// Set once a write failed (the tmpfs is full): logged once, then skipped.
    failed: bool,
}

impl ConsoleLog {
    fn create(path: &Path) -> Result<Self, Error> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        Ok(Self {
            file,
            path: path.to_owned(),
            written: 0,
            failed: false,
        })
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        if self.written + bytes.len() as u64 > LOG_CAP {
            let restarted = self
                .file
                .set_len(0)
                .and_then(|()| std::io::Seek::rewind(&mut self.file));
            if let Err(e) = restarted {
                self.fail(e);
                return;
            }
            self.written = 0;
        }
        match self.file.write_all(bytes) {
            Ok(()) => self.written += bytes.len() as u64,
            Err(e) => self.fail(e),
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        log::warn!(
            "console log {}: {e}; the console goes on without it",
            self.path.display()
        );
        self.failed = true;
    }
}

/// Output kept until a stdout is attached: the first [`BACKLOG_CAP`] bytes.
#[derive(Default)]
struct Backlog {
    kept: Vec<u8>,
    dropped: u64,
}

impl Backlog {
    fn keep(&mut self, bytes: &[u8]) {
        let room = BACKLOG_CAP - self.kept.len();
        let taken = bytes.len().min(room);
        self.kept.extend_from_slice(&bytes[..taken]);
        self.dropped += (bytes.len() - taken) as u64;
    }
}

/// The console's reader: until QEMU closes the console (it ended).
async fn pump(
    mut console: OwnedReadHalf,
    mut log: ConsoleLog,
    mut attach: mpsc::UnboundedReceiver<Attach>,
) {
    let mut backlog = Backlog::default();
    let mut stdout: Option<Attach> = None;
    let mut waiting = true;
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        tokio::select! {
            next = attach.recv(), if waiting => match next {
                Some(mut next) => {
                    waiting = false;
                    if backlog.dropped > 0 {
                        log::warn!(
                            "console: {} bytes came before the stdout was attached and past {BACKLOG_CAP}; they are only in the log",
                            backlog.dropped
                        );
                    }
                    let kept = std::mem::take(&mut backlog.kept);
                    if next.stdout.write_all(&kept).await.is_ok() {
                        stdout = Some(next);
                    }
                }
                None => waiting = false,
            },
            read = console.read(&mut buf) => {
                let n = match read {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        log::warn!("console: read: {e}");
                        break;
                    }
                };
                log.write(&buf[..n]);
                match stdout.as_mut() {
                    Some(out) => {
                        if let Err(e) = out.stdout.write_all(&buf[..n]).await {
                            log::warn!("console: the stdout took no more ({e}); the console goes on in the log");
                            stdout = None;
                        }
                    }
                    None if waiting => backlog.keep(&buf[..n]),
                    None => {}
                }
            }
        }
    }
    if let Some(mut out) = stdout {
        let _ = out.stdout.flush().await;
        drop(out.stdout);
        let _ = out.done.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vmlet-serial-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A console whose QEMU end the test holds; its log in `dir`.
    fn console(dir: &Path) -> (SerialConsole, UnixStream) {
        let (qemu, shim) = UnixStream::pair().unwrap();
        (
            SerialConsole::start(shim, &dir.join("console.log")).unwrap(),
            qemu,
        )
    }

    #[tokio::test]
    async fn the_stdout_gets_everything_from_the_first_byte_and_ends_with_qemu() {
        let dir = scratch("stdout");
        let (console, mut qemu) = console(&dir);
        qemu.write_all(b"SeaBIOS\r\n").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (out, mut read) = tokio::io::duplex(1 << 16);
        let mut copies = console.attach(Some(Box::new(out)), None).unwrap();
        qemu.write_all(b"login: ").await.unwrap();
        drop(qemu);
        copies.drain().await;
        let mut text = String::new();
        read.read_to_string(&mut text).await.unwrap();
        assert_eq!(text, "SeaBIOS\r\nlogin: ");
        let log = std::fs::read_to_string(dir.join("console.log")).unwrap();
        assert_eq!(log, text);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn stdin_reaches_the_consoles_input_once() {
        let dir = scratch("stdin");
        let (console, qemu) = console(&dir);
        let fifo = dir.join("stdin");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let open = || {
            tokio::net::unix::pipe::OpenOptions::new()
                .read_write(true)
                .open_receiver(&fifo)
                .unwrap()
        };
        let copies = console.attach(None, Some(open())).unwrap();
        let mut writer = tokio::net::unix::pipe::OpenOptions::new()
            .open_sender(&fifo)
            .unwrap();
        writer.write_all(b"root\n").await.unwrap();
        let mut line = String::new();
        let mut reader = tokio::io::BufReader::new(qemu);
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "root\n");
        let err = console.attach(None, Some(open())).err().expect("one stdin");
        assert!(err.message().contains("has a stdin already"), "{err}");
        // The end of stdin leaves the console open: QEMU would drop a half-closed one.
        copies.close_stdin();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let mut qemu = reader.into_inner();
        let mut byte = [0u8; 1];
        let open =
            tokio::time::timeout(std::time::Duration::from_millis(200), qemu.read(&mut byte)).await;
        assert!(open.is_err(), "the console's input was closed: {open:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_backlog_is_bounded_and_the_log_starts_again_at_its_cap() {
        let dir = scratch("caps");
        let log = dir.join("console.log");
        let (console, mut qemu) = console(&dir);
        let early = vec![b'e'; BACKLOG_CAP + BACKLOG_CAP / 2];
        qemu.write_all(&early).await.unwrap();
        // Read by the pump (it is in the log) before a stdout is attached.
        while std::fs::metadata(&log).unwrap().len() < early.len() as u64 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let (out, mut read) = tokio::io::duplex(4 << 20);
        let mut copies = console.attach(Some(Box::new(out)), None).unwrap();
        let late = vec![b'l'; LOG_CAP as usize];
        qemu.write_all(&late).await.unwrap();
        drop(qemu);
        copies.drain().await;
        let mut got = Vec::new();
        read.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got.len(),
            BACKLOG_CAP + late.len(),
            "the backlog's first bytes, then all"
        );
        assert!(got[..BACKLOG_CAP].iter().all(|b| *b == b'e'));
        assert!(got[BACKLOG_CAP..].iter().all(|b| *b == b'l'));
        let logged = std::fs::metadata(&log).unwrap().len();
        assert!(
            logged > 0 && logged <= LOG_CAP && logged < (early.len() + late.len()) as u64,
            "the log started again at its cap: {logged} bytes"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
