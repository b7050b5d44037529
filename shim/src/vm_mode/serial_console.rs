//! A VM image's serial console (docs/vm-mode.md) over a Unix socket that QEMU connects as
//! it starts (`<serial type="unix">`, the shim listening): one task reads it as QEMU
//! writes, into the console log (`vmletctl console`, diagnostics), restarted at
//! [`LOG_CAP`], and into the task's stdout once it is attached; what came before that is
//! kept, up to [`BACKLOG_CAP`]. The task's stdin goes to the console's input (the guest's
//! `ttyS0`), and so does what the node's operator types in `vmletctl console --interactive`
//! ([`SerialConsole::serve_operator`]: a root-only socket in the pod's directory, one
//! session at a time). The guest writes as fast as it likes: every read is bounded, and a
//! stdout that does not take its output holds the console up, not the shim's memory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::guest::stdio::{self, Copies, Output, ProcessName, StdioPaths};
use crate::Error;

/// The console log starts again (empty) when it reaches this size; the log tmpfs is the
/// pod's ([`crate::host::log_dir`]).
pub const LOG_CAP: u64 = 2 << 20;
/// The most output kept for a stdout that is not attached yet.
pub const BACKLOG_CAP: usize = 1 << 20;
/// Bytes moved per read.
const READ_BUFFER: usize = 64 * 1024;
/// The most bytes of one write to the console's input, and how many such writes may wait
/// for the guest to read: a writer that outpaces the guest waits, nothing piles up.
const INPUT_CHUNK: usize = 4096;
const INPUT_QUEUE: usize = 16;
/// What an operator's second session is told before it is closed.
const BUSY: &[u8] = b"vmlet: the console has an operator already\r\n";

/// The console of a running VM image.
pub struct SerialConsole {
    attach: mpsc::UnboundedSender<Attach>,
    /// The console's input: one task writes what is sent here to QEMU.
    input: mpsc::Sender<Vec<u8>>,
    /// A stdin took the console (one stdin, for its one process).
    stdin_taken: AtomicBool,
    /// The operator's socket, while it is served.
    operator: Mutex<Option<Operator>>,
}

struct Operator {
    server: tokio::task::JoinHandle<()>,
    path: PathBuf,
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
        let (input, typed) = mpsc::channel(INPUT_QUEUE);
        tokio::spawn(pump(read, log, attached));
        tokio::spawn(write_input(write, typed));
        Ok(SerialConsole {
            attach,
            input,
            stdin_taken: AtomicBool::new(false),
            operator: Mutex::new(None),
        })
    }

    /// Takes the node operator's input at `path` (`vmletctl console --interactive`) until
    /// the console is dropped: a socket of mode 0600, and a peer that is not root is
    /// refused (the pod's directory lets QEMU's user through to its own sockets); one
    /// session at a time, a second is told so and closed.
    pub fn serve_operator(&self, path: &Path) -> Result<(), Error> {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .map_err(|e| Error::io(format!("listen on {}", path.display()), e))?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod {}", path.display()), e))?;
        let input = self.input.clone();
        let session = Arc::new(tokio::sync::Mutex::new(()));
        let server = tokio::spawn(async move {
            // The sessions end with the server (dropped with the console).
            let mut sessions = tokio::task::JoinSet::new();
            loop {
                let mut stream = crate::host::unix_accept::next(&listener, "console input").await;
                while sessions.try_join_next().is_some() {}
                match stream.peer_cred() {
                    Ok(cred) if cred.uid() == 0 => {}
                    other => {
                        log::warn!("console input: refused a connection by {other:?}");
                        continue;
                    }
                }
                let Ok(held) = session.clone().try_lock_owned() else {
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_secs(1),
                        stream.write_all(BUSY),
                    )
                    .await;
                    continue;
                };
                let input = input.clone();
                sessions.spawn(async move {
                    let _held = held;
                    let mut buf = vec![0u8; INPUT_CHUNK];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || input.send(buf[..n].to_vec()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        *self.operator.lock().unwrap() = Some(Operator {
            server,
            path: path.to_owned(),
        });
        Ok(())
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
            if self.stdin_taken.swap(true, Ordering::SeqCst) {
                return Err(Error::FailedPrecondition(
                    "the VM's console has a stdin already".into(),
                ));
            }
            let input = ConsoleInput(tokio_util::sync::PollSender::new(self.input.clone()));
            copies.copy_stdin_to(fifo, input);
        }
        Ok(copies)
    }
}

impl Drop for SerialConsole {
    fn drop(&mut self) {
        if let Some(operator) = self.operator.lock().unwrap().take() {
            operator.server.abort();
            let _ = std::fs::remove_file(&operator.path);
        }
    }
}

/// Writes what the stdin and the operator send to the console's input, until both are
/// gone or QEMU takes no more. The socket's write side is never shut down: QEMU takes a
/// half-closed socket for a hang-up and drops the console (its output too); it closes with
/// the console's reader.
async fn write_input(mut input: OwnedWriteHalf, mut typed: mpsc::Receiver<Vec<u8>>) {
    while let Some(bytes) = typed.recv().await {
        if let Err(e) = input.write_all(&bytes).await {
            log::warn!("console: write its input: {e}");
            break;
        }
    }
    input.forget();
}

/// The console's input as a stdin copy writes it: chunks to [`write_input`]. Its shutdown
/// (the end of stdin) is not the console's.
struct ConsoleInput(tokio_util::sync::PollSender<Vec<u8>>);

impl tokio::io::AsyncWrite for ConsoleInput {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let gone = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        match self.0.poll_reserve(cx) {
            std::task::Poll::Pending => std::task::Poll::Pending,
            std::task::Poll::Ready(Err(_)) => std::task::Poll::Ready(Err(gone())),
            std::task::Poll::Ready(Ok(())) => {
                let n = buf.len().min(INPUT_CHUNK);
                self.0.send_item(buf[..n].to_vec()).map_err(|_| gone())?;
                std::task::Poll::Ready(Ok(n))
            }
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    /// Stops writing; the console stays open.
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
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

/// Connects a VM image's serial console (docs/vm-mode.md) to the process's stdout (a FIFO,
/// file or log URI; stderr gets nothing: the console is one stream) and its stdin.
pub fn attach_console(
    console: &SerialConsole,
    process: ProcessName<'_>,
    namespace: &str,
    paths: &StdioPaths,
) -> Result<Copies, Error> {
    let stdout_only = StdioPaths {
        stdin: String::new(),
        stdout: paths.stdout.clone(),
        stderr: String::new(),
    };
    let [stdout, _] = stdio::open_outputs(&stdout_only, process.container_id, namespace)?;
    let stdin = (!paths.stdin.is_empty())
        .then(|| stdio::open_stdin(&paths.stdin))
        .transpose()?;
    console.attach(stdout, stdin)
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
    async fn the_operator_types_into_the_console_beside_stdin_one_session_at_a_time() {
        let dir = scratch("operator");
        let (console, qemu) = console(&dir);
        let socket = dir.join("console-input.sock");
        console.serve_operator(&socket).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut operator = UnixStream::connect(&socket).await.unwrap();
        operator.write_all(b"root\n").await.unwrap();
        let mut reader = tokio::io::BufReader::new(qemu);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "root\n");
        // A second session is told the console is taken.
        let mut second = UnixStream::connect(&socket).await.unwrap();
        let mut busy = Vec::new();
        second.read_to_end(&mut busy).await.unwrap();
        assert_eq!(busy, BUSY);
        // The first goes on; once it leaves, the next session is taken.
        operator.write_all(b"ls\n").await.unwrap();
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "ls\n");
        drop(operator);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut next = UnixStream::connect(&socket).await.unwrap();
        next.write_all(b"exit\n").await.unwrap();
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "exit\n");
        // The console's end takes the socket with it.
        drop(console);
        assert!(!socket.exists());
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
