//! Copies between containerd's stdio FIFOs and the agent's raw vsock stream connections.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use vmlet_protocol::{StreamHeader, StreamKind, STREAM_PORT};

use crate::vsock::Endpoint;
use crate::Error;

/// The FIFO paths containerd gave (empty: no such stream).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

impl StdioPaths {
    /// Only FIFO paths for now; log URIs (`file://`, `binary://`) come later.
    pub fn check(&self) -> Result<(), Error> {
        for path in [&self.stdin, &self.stdout, &self.stderr] {
            if path.contains("://") {
                return Err(Error::Unimplemented(format!("stdio URI {path:?}")));
            }
        }
        Ok(())
    }
}

/// Running copies of one process's streams.
pub struct Copies {
    outputs: Vec<JoinHandle<()>>,
    close_stdin: Arc<Notify>,
}

impl Copies {
    /// Waits until stdout and stderr have delivered everything (the guest closed them).
    pub async fn drain(&mut self) {
        for handle in self.outputs.drain(..) {
            let _ = handle.await;
        }
    }

    pub fn close_stdin(&self) {
        self.close_stdin.notify_one();
    }
}

async fn open_stream(
    endpoint: &Endpoint,
    container_id: &str,
    kind: StreamKind,
) -> Result<Box<dyn crate::vsock::Stream>, Error> {
    let mut stream = endpoint.connect(STREAM_PORT).await?;
    let header = StreamHeader {
        container_id: container_id.into(),
        exec_id: String::new(),
        kind,
    };
    stream
        .write_all(header.to_string().as_bytes())
        .await
        .map_err(|e| Error::io("send stream header", e))?;
    Ok(stream)
}

/// Connects every stream that has a FIFO and starts copying.
pub async fn attach(
    endpoint: &Endpoint,
    container_id: &str,
    paths: &StdioPaths,
) -> Result<Copies, Error> {
    let mut outputs = Vec::new();
    for (path, kind) in [
        (&paths.stdout, StreamKind::Stdout),
        (&paths.stderr, StreamKind::Stderr),
    ] {
        if path.is_empty() {
            continue;
        }
        let mut stream = open_stream(endpoint, container_id, kind).await?;
        // Read-write keeps the open from failing while containerd's reader comes and goes.
        let mut fifo = pipe::OpenOptions::new()
            .read_write(true)
            .open_sender(path)
            .map_err(|e| Error::io(format!("open {path}"), e))?;
        outputs.push(tokio::spawn(async move {
            if let Err(e) = tokio::io::copy(&mut stream, &mut fifo).await {
                log::warn!("copy {kind:?}: {e}");
            }
        }));
    }
    let close_stdin = Arc::new(Notify::new());
    if !paths.stdin.is_empty() {
        let mut stream = open_stream(endpoint, container_id, StreamKind::Stdin).await?;
        let path = PathBuf::from(&paths.stdin);
        let closed = close_stdin.clone();
        // Read-write: the open never blocks (a blocking open would wait for containerd's
        // writer forever if it came and went first, and keep the shim from exiting). The
        // stream then ends with close_io (containerd's "stdin closed") or the task's end.
        let mut fifo = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::io::copy(&mut fifo, &mut stream) => {}
                _ = closed.notified() => {}
            }
            let _ = stream.shutdown().await;
        });
    }
    Ok(Copies {
        outputs,
        close_stdin,
    })
}
