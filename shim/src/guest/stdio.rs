//! Copies between containerd's stdio (FIFOs, log URIs) and the agent's raw vsock stream
//! connections.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use vmlet_protocol::{StreamHeader, StreamKind, STREAM_PORT};

use crate::guest::log_uri::{start_logger, OutputTarget};
use crate::guest::vsock::Endpoint;
use crate::Error;

/// What containerd gave for each stream: FIFO paths, or log URIs for stdout and stderr
/// (empty: no such stream).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

impl StdioPaths {
    /// stdin must be a FIFO; stdout and stderr may be FIFOs or log URIs.
    pub fn check(&self) -> Result<(), Error> {
        if self.stdin.contains("://") {
            return Err(Error::InvalidArgument(format!(
                "stdin {:?} is not a FIFO path",
                self.stdin
            )));
        }
        for output in [&self.stdout, &self.stderr] {
            if !output.is_empty() {
                OutputTarget::parse(output)?;
            }
        }
        Ok(())
    }
}

/// Where an output stream is written.
pub(crate) type Output = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Bytes moved per read on output streams.
const COPY_BUFFER: usize = 256 * 1024;

/// Opens the writers for stdout and stderr. A log URI shared by both (as containerd passes
/// it) is opened once: one file, or one logging binary with two pipes.
pub(crate) fn open_outputs(
    paths: &StdioPaths,
    container_id: &str,
    namespace: &str,
) -> Result<[Option<Output>; 2], Error> {
    let open_fifo = |path: &PathBuf| -> Result<Output, Error> {
        // Read-write keeps the open from failing while containerd's reader comes and goes.
        let fifo = pipe::OpenOptions::new()
            .read_write(true)
            .open_sender(path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        Ok(Box::new(fifo))
    };
    let open_file = |path: &PathBuf| -> Result<std::fs::File, Error> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(format!("open log file {}", path.display()), e))
    };
    let sender = |fd: OwnedFd| -> Result<Output, Error> {
        Ok(Box::new(
            pipe::Sender::from_owned_fd(fd).map_err(|e| Error::io("logger pipe", e))?,
        ))
    };
    let parse = |s: &String| (!s.is_empty()).then(|| OutputTarget::parse(s)).transpose();
    let (out, err) = (parse(&paths.stdout)?, parse(&paths.stderr)?);
    let shared = if out == err { out.as_ref() } else { None };
    if let Some(target) = shared {
        match target {
            OutputTarget::File(path) => {
                let file = open_file(path)?;
                let copy = file.try_clone().map_err(|e| Error::io("dup log file", e))?;
                return Ok([
                    Some(Box::new(tokio::fs::File::from_std(file))),
                    Some(Box::new(tokio::fs::File::from_std(copy))),
                ]);
            }
            OutputTarget::Binary { path, args } => {
                let (o, e) = start_logger(path, args, container_id, namespace)?;
                return Ok([Some(sender(o)?), Some(sender(e)?)]);
            }
            OutputTarget::Fifo(_) => {}
        }
    }
    let mut writers: [Option<Output>; 2] = [None, None];
    for (slot, target) in writers.iter_mut().zip([out, err]) {
        *slot = match target {
            None => None,
            Some(OutputTarget::Fifo(path)) => Some(open_fifo(&path)?),
            Some(OutputTarget::File(path)) => {
                Some(Box::new(tokio::fs::File::from_std(open_file(&path)?)))
            }
            Some(OutputTarget::Binary { path, args }) => {
                let (o, e) = start_logger(&path, &args, container_id, namespace)?;
                drop(e);
                Some(sender(o)?)
            }
        };
    }
    Ok(writers)
}

/// Running copies of one process's streams.
#[derive(Default)]
pub struct Copies {
    outputs: Vec<JoinHandle<()>>,
    close_stdin: Arc<Notify>,
}

impl Copies {
    /// Waits until stdout and stderr have delivered everything (the guest closed them).
    /// Cancel-safe: a copy still running when the caller gives up stays here, for
    /// [`Copies::abort`] to stop (a dropped handle would leave it running, its FIFO open).
    pub async fn drain(&mut self) {
        while let Some(handle) = self.outputs.last_mut() {
            let _ = handle.await;
            self.outputs.pop();
        }
    }

    pub fn close_stdin(&self) {
        self.close_stdin.notify_one();
    }

    /// Adds a running output copy (which [`Copies::drain`] waits for).
    pub(crate) fn push_output(&mut self, copy: JoinHandle<()>) {
        self.outputs.push(copy);
    }

    /// Copies containerd's stdin `fifo` to `input` until [`Copies::close_stdin`] (or the
    /// FIFO's end), then shuts `input` down.
    pub(crate) fn copy_stdin_to(
        &self,
        mut fifo: pipe::Receiver,
        mut input: impl tokio::io::AsyncWrite + Send + Unpin + 'static,
    ) {
        let closed = self.close_stdin.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::io::copy(&mut fifo, &mut input) => {}
                _ = closed.notified() => {}
            }
            let _ = input.shutdown().await;
        });
    }

    /// Stops every copy at once (the guest is gone: nothing more will come), closing the
    /// FIFOs, so that a client attached to them sees the end.
    pub fn abort(&mut self) {
        self.close_stdin();
        for handle in self.outputs.drain(..) {
            handle.abort();
        }
    }
}

/// Which process's streams: a container's init (empty exec id) or one of its execs.
#[derive(Debug, Clone, Copy)]
pub struct ProcessName<'a> {
    pub container_id: &'a str,
    pub exec_id: &'a str,
}

async fn open_stream(
    endpoint: &Endpoint,
    process: ProcessName<'_>,
    kind: StreamKind,
) -> Result<Box<dyn crate::guest::vsock::Stream>, Error> {
    let mut stream = endpoint.connect(STREAM_PORT).await?;
    let header = StreamHeader {
        container_id: process.container_id.into(),
        exec_id: process.exec_id.into(),
        kind,
    };
    stream
        .write_all(header.to_string().as_bytes())
        .await
        .map_err(|e| Error::io("send stream header", e))?;
    Ok(stream)
}

/// The streams a process's output goes to: with a terminal, stdout only. Clients name a
/// stderr FIFO they never make when they ask for a terminal (nerdctl `exec -t`), as runc's
/// shim ignores it.
fn output_paths(paths: &StdioPaths, terminal: bool) -> StdioPaths {
    StdioPaths {
        stderr: if terminal {
            String::new()
        } else {
            paths.stderr.clone()
        },
        ..paths.clone()
    }
}

/// Connects every stream that has a FIFO or log URI and starts copying. `namespace` is
/// the containerd namespace a logging binary is told. A process with a terminal has no
/// stderr (the terminal carries all its output).
pub async fn attach(
    endpoint: &Endpoint,
    process: ProcessName<'_>,
    namespace: &str,
    paths: &StdioPaths,
    terminal: bool,
) -> Result<Copies, Error> {
    let mut outputs = Vec::new();
    let writers = open_outputs(
        &output_paths(paths, terminal),
        process.container_id,
        namespace,
    )?;
    for (writer, kind) in writers
        .into_iter()
        .zip([StreamKind::Stdout, StreamKind::Stderr])
    {
        let Some(mut writer) = writer else {
            continue;
        };
        let stream = open_stream(endpoint, process, kind).await?;
        outputs.push(tokio::spawn(async move {
            // Large reads: fewer, bigger writes into the FIFO or log.
            let mut stream = tokio::io::BufReader::with_capacity(COPY_BUFFER, stream);
            if let Err(e) = tokio::io::copy_buf(&mut stream, &mut writer).await {
                log::warn!("copy {kind:?}: {e}");
            }
            let _ = writer.flush().await;
        }));
    }
    let copies = Copies {
        outputs,
        close_stdin: Arc::new(Notify::new()),
    };
    if !paths.stdin.is_empty() {
        let stream = open_stream(endpoint, process, StreamKind::Stdin).await?;
        copies.copy_stdin_to(open_stdin(&paths.stdin)?, stream);
    }
    Ok(copies)
}

/// Opens containerd's stdin FIFO. Read-write: the open never blocks (a blocking open would
/// wait for containerd's writer forever if it came and went first, and keep the shim from
/// exiting). The copy then ends with close_io (containerd's "stdin closed") or the task's
/// end.
pub(crate) fn open_stdin(path: &str) -> Result<pipe::Receiver, Error> {
    let path = PathBuf::from(path);
    pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nerdctl `exec -t` names a stderr FIFO it never makes: with a terminal, only stdout
    /// is opened (a missing stderr FIFO used to fail the exec).
    #[test]
    fn a_terminal_opens_no_stderr() {
        let dir = std::env::temp_dir().join(format!("vmlet-stdio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("stdout");
        nix::unistd::mkfifo(&out, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let paths = StdioPaths {
            stdin: String::new(),
            stdout: out.to_string_lossy().into_owned(),
            stderr: dir.join("never-made").to_string_lossy().into_owned(),
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _guard = rt.enter();
        let [stdout, stderr] = open_outputs(&output_paths(&paths, true), "c1", "ns").unwrap();
        assert!(stdout.is_some() && stderr.is_none());
        let err = open_outputs(&output_paths(&paths, false), "c1", "ns")
            .err()
            .unwrap();
        assert!(err.to_string().contains("never-made"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A copy the guest never ends (something there still holds the stream): after the
    /// drain's deadline, abort stops it, and what it held (the FIFO) is closed.
    #[tokio::test]
    async fn a_copy_that_outlives_the_drain_deadline_is_stopped_by_abort() {
        let (held, closed) = tokio::sync::oneshot::channel::<()>();
        let stuck = tokio::spawn(async move {
            let _fifo = held;
            std::future::pending::<()>().await;
        });
        let mut copies = Copies {
            outputs: vec![tokio::spawn(async {}), stuck],
            close_stdin: Arc::default(),
        };
        let drained =
            tokio::time::timeout(std::time::Duration::from_millis(50), copies.drain()).await;
        assert!(drained.is_err());
        copies.abort();
        assert!(
            closed.await.is_err(),
            "the stuck copy still holds its writer"
        );
    }
}
