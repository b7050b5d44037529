//! Raw stdio stream connections: the host connects to [`vmlet_protocol::STREAM_PORT`],
//! passes the [`Gate`], writes a [`StreamHeader`] line, and from then on the connection carries the bytes of
//! one stream of one process.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio_vsock::VsockStream;
use vmlet_protocol::{StreamHeader, StreamKind, MAX_HEADER_LEN, STREAM_PORT};

use crate::containers::Containers;
use crate::host_gate::{Gate, Listening};
use crate::pty::Master;
use crate::Error;

/// Bytes moved per read on output streams.
const COPY_BUFFER: usize = 256 * 1024;

/// Binds the stream port (before the agent reports ready).
pub fn listen() -> Result<Listening, Error> {
    crate::host_gate::listen(STREAM_PORT, "stream")
}

pub async fn serve(
    gate: Arc<Gate>,
    port: Listening,
    containers: Arc<Containers>,
) -> Result<(), Error> {
    gate.serve(port, move |stream| {
        let containers = containers.clone();
        async move { attach(stream, &containers).await }
    })
    .await
}

async fn read_header(stream: &mut VsockStream) -> Result<StreamHeader, Error> {
    let line = read_line(stream, "stream header").await?;
    StreamHeader::parse(&line).map_err(Error::InvalidRequest)
}

/// The line (without its newline) that opens a host connection, at most
/// [`MAX_HEADER_LEN`] bytes, read byte by byte: what follows belongs to the connection.
pub(crate) async fn read_line(stream: &mut VsockStream, what: &str) -> Result<String, Error> {
    let mut line = Vec::with_capacity(64);
    loop {
        let byte = stream
            .read_u8()
            .await
            .map_err(|e| Error::io(format!("read {what}"), e))?;
        if byte == b'\n' {
            break;
        }
        line.push(byte);
        if line.len() >= MAX_HEADER_LEN {
            return Err(Error::InvalidRequest(format!("{what} too long")));
        }
    }
    String::from_utf8(line).map_err(|_| Error::InvalidRequest(format!("{what} is not UTF-8")))
}

async fn attach(mut stream: VsockStream, containers: &Containers) -> Result<(), Error> {
    let header = read_header(&mut stream).await?;
    let process = containers.process(&header.container_id, &header.exec_id)?;
    let (fd, terminal): (OwnedFd, bool) = {
        let mut ends = process.stdio.lock().unwrap();
        let fd = ends.take(header.kind).ok_or_else(|| {
            Error::InvalidRequest(format!("{header} is not available").trim().into())
        })?;
        (fd, ends.terminal)
    };
    match header.kind {
        StreamKind::Stdin => {
            let mut sink: Box<dyn AsyncWrite + Send + Unpin> = if terminal {
                Box::new(Master::new(fd)?)
            } else {
                Box::new(pipe::Sender::from_owned_fd(fd).map_err(|e| Error::io("stdin pipe", e))?)
            };
            // Ends when the host closes the connection; dropping the pipe gives EOF.
            let _ = tokio::io::copy(&mut stream, &mut sink).await;
        }
        StreamKind::Stdout | StreamKind::Stderr => {
            let source: Box<dyn AsyncRead + Send + Unpin> = if terminal {
                Box::new(Master::new(fd)?)
            } else {
                Box::new(
                    pipe::Receiver::from_owned_fd(fd).map_err(|e| Error::io("output pipe", e))?,
                )
            };
            // Large reads: every vsock packet costs a virtqueue round trip (dear under TCG).
            let mut source = tokio::io::BufReader::with_capacity(COPY_BUFFER, source);
            let copied = tokio::io::copy_buf(&mut source, &mut stream).await;
            let _ = stream.flush().await;
            let _ = stream.shutdown(std::net::Shutdown::Both);
            copied.map_err(|e| Error::io(format!("copy {header}").trim().to_owned(), e))?;
        }
    }
    Ok(())
}
