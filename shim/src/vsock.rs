//! Reaching guest vsock ports: kernel vhost-vsock (AF_VSOCK to the guest CID) or hybrid
//! vsock through `vhost-device-vsock` (a unix socket and a `CONNECT <port>` handshake).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use vmlet_protocol::hybrid;

use crate::Error;

/// The guest CID used with `vhost-device-vsock` (each VM has its own device).
pub const HYBRID_GUEST_CID: u32 = 3;

pub trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

/// Where the guest's vsock ports are reached from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Kernel vhost-vsock: the guest's CID.
    Vhost { cid: u32 },
    /// `vhost-device-vsock`'s host-side unix socket.
    Hybrid { uds: PathBuf },
}

impl Endpoint {
    /// Opens a stream connection to guest port `port`.
    pub async fn connect(&self, port: u32) -> Result<Box<dyn Stream>, Error> {
        tokio::time::timeout(CONNECT_TIMEOUT, self.connect_unbounded(port))
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "vsock connection to port {port} not answered within {CONNECT_TIMEOUT:?}"
                ))
            })?
    }

    async fn connect_unbounded(&self, port: u32) -> Result<Box<dyn Stream>, Error> {
        match self {
            Endpoint::Vhost { cid } => {
                let stream =
                    tokio_vsock::VsockStream::connect(tokio_vsock::VsockAddr::new(*cid, port))
                        .await
                        .map_err(|e| Error::io(format!("connect vsock {cid}:{port}"), e))?;
                Ok(Box::new(stream))
            }
            Endpoint::Hybrid { uds } => Ok(Box::new(hybrid_connect(uds, port).await?)),
        }
    }
}

/// How long a vsock connection (with vhost-device-vsock's handshake) may take: a CONNECT
/// sent while the guest boots can stay unanswered.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

async fn hybrid_connect(uds: &Path, port: u32) -> Result<UnixStream, Error> {
    let mut stream = UnixStream::connect(uds)
        .await
        .map_err(|e| Error::io(format!("connect {}", uds.display()), e))?;
    stream
        .write_all(hybrid::connect_request(port).as_bytes())
        .await
        .map_err(|e| Error::io("hybrid vsock handshake", e))?;
    // Byte by byte: whatever follows the reply belongs to the connection.
    let mut reply = hybrid::ReplyReader::default();
    loop {
        let byte = stream
            .read_u8()
            .await
            .map_err(|e| Error::io(format!("hybrid vsock handshake for port {port}"), e))?;
        match reply.push(byte) {
            Ok(None) => {}
            Ok(Some(_)) => return Ok(stream),
            Err(e) => return Err(Error::Internal(format!("hybrid vsock port {port}: {e}"))),
        }
    }
}

/// Starts `vhost-device-vsock` for one VM and waits until its vhost-user socket exists.
/// Returns its PID. The shim's reaper collects it when it exits.
pub fn start_vhost_device_vsock(
    binary: &Path,
    vhost_socket: &Path,
    uds: &Path,
    log: &Path,
) -> Result<u32, Error> {
    let log = std::fs::File::create(log).map_err(|e| Error::io("create vsock log", e))?;
    let log2 = log.try_clone().map_err(|e| Error::io("dup vsock log", e))?;
    let child = Command::new(binary)
        .arg("--vm")
        .arg(format!(
            "guest-cid={HYBRID_GUEST_CID},socket={},uds-path={}",
            vhost_socket.display(),
            uds.display()
        ))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(|e| Error::io(format!("start {}", binary.display()), e))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !vhost_socket.exists() {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return Err(Error::Timeout(format!(
                "{} did not create {}",
                binary.display(),
                vhost_socket.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hybrid_handshake_keeps_following_bytes() {
        let dir = std::env::temp_dir().join(format!("vmlet-vsock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 13];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"CONNECT 1024\n");
            s.write_all(b"OK 5\nhello").await.unwrap();
        });
        let endpoint = Endpoint::Hybrid { uds: path.clone() };
        let mut stream = endpoint.connect(1024).await.unwrap();
        let mut rest = String::new();
        stream.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "hello");
        server.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
