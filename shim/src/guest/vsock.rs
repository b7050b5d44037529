//! Reaching guest vsock ports: kernel vhost-vsock (AF_VSOCK to the guest CID) or hybrid
//! vsock through `vhost-device-vsock` (a unix socket and a `CONNECT <port>` handshake),
//! then on either the agent's handshake ([`vmlet_protocol::auth`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use vmlet_protocol::auth::{self, AgentKey};
use vmlet_protocol::hybrid;

use crate::Error;

/// The guest CID used with `vhost-device-vsock` (each VM has its own device).
pub const HYBRID_GUEST_CID: u32 = 3;

pub trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

/// Where the guest's vsock ports are reached from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Kernel vhost-vsock: the guest's CID.
    Vhost { cid: u32 },
    /// `vhost-device-vsock`'s host-side unix socket.
    Hybrid { uds: PathBuf },
}

impl Route {
    /// Opens a connection to guest port `port`, before the agent's handshake.
    async fn open(&self, port: u32) -> Result<Box<dyn Stream>, Error> {
        match self {
            Route::Vhost { cid } => {
                let cid = *cid;
                let fd = tokio::task::spawn_blocking(move || connect_from_reserved_port(cid, port))
                    .await
                    .map_err(|e| Error::Internal(format!("vsock connect task: {e}")))?
                    .map_err(|e| Error::io(format!("connect vsock {cid}:{port}"), e))?;
                Ok(Box::new(tokio_vsock::VsockStream::from(fd)))
            }
            Route::Hybrid { uds } => Ok(Box::new(hybrid_connect(uds, port).await?)),
        }
    }
}

/// The local ports the shim binds on the kernel's vsock: below 1024, which only a process
/// with `CAP_NET_BIND_SERVICE` may bind, so that the agent can keep its handshake slots for
/// such peers apart from an unprivileged flood's. They are the node's (vsock ports are not
/// per VM): when every one is taken, the connection comes from an ordinary port.
const RESERVED_PORTS: std::ops::RangeInclusive<u32> = 1..=1023;

/// A blocking connection to `cid:port`, from a free reserved local port where there is one
/// (the kernel's own connect timeout bounds it: 2 s by default).
fn connect_from_reserved_port(cid: u32, port: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, VsockAddr};
    use std::os::fd::AsRawFd;
    let new_socket = || {
        socket(
            AddressFamily::Vsock,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
    };
    let count = RESERVED_PORTS.end() - RESERVED_PORTS.start() + 1;
    // A random start spreads the shims of the node over the range.
    let mut start = [0u8; 4];
    let _ = getrandom::getrandom(&mut start);
    let start = u32::from_ne_bytes(start) % count;
    for i in 0..count {
        let local = RESERVED_PORTS.start() + (start + i) % count;
        let fd = new_socket()?;
        match bind(fd.as_raw_fd(), &VsockAddr::new(libc::VMADDR_CID_ANY, local)) {
            Ok(()) => {
                connect(fd.as_raw_fd(), &VsockAddr::new(cid, port))?;
                return Ok(fd);
            }
            Err(nix::errno::Errno::EADDRINUSE) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    log::warn!("every reserved vsock port is in use: connecting to {cid}:{port} from another");
    let fd = new_socket()?;
    connect(fd.as_raw_fd(), &VsockAddr::new(cid, port))?;
    Ok(fd)
}

/// One VM's agent: the route to it and the key every connection proves it holds
/// ([`vmlet_protocol::auth`]), on either route.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub route: Route,
    key: AgentKey,
}

impl Endpoint {
    pub fn new(route: Route, key: AgentKey) -> Self {
        Endpoint { route, key }
    }

    /// Opens a stream connection to guest port `port`: the route, then the handshake in
    /// which the shim proves it holds the VM's key and the agent proves it back (a VM
    /// without the key, such as another pod's behind a CID libvirt gave again, gets
    /// nothing and is not taken for the pod's).
    pub async fn connect(&self, port: u32) -> Result<Box<dyn Stream>, Error> {
        let connect = async {
            let mut closed_after_proof = 0;
            loop {
                let mut stream = self.route.open(port).await?;
                match authenticate(&mut stream, &self.key, port).await {
                    Ok(()) => return Ok(stream),
                    // Every handshake slot of the agent's was busy: again, within the
                    // deadline.
                    Err(Busy(e)) => {
                        log::warn!("{}", e.message());
                        tokio::time::sleep(BUSY_RETRY).await;
                    }
                    // A flood took this handshake's slot: again, a few times (a proof the
                    // agent never answers is taken for another key's).
                    Err(ClosedAfterProof(e)) if closed_after_proof < CLOSED_AFTER_PROOF_TRIES => {
                        closed_after_proof += 1;
                        log::warn!("{}", e.message());
                        tokio::time::sleep(BUSY_RETRY).await;
                    }
                    // A proof of the agent's that failed is never tried again.
                    Err(ClosedAfterProof(e) | Refused(e)) => return Err(e),
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "vsock connection to port {port} not answered within {CONNECT_TIMEOUT:?}"
                ))
            })?
    }
}

/// A new random key for a VM.
pub fn new_agent_key() -> Result<AgentKey, Error> {
    let mut bytes = [0u8; auth::KEY_LEN];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| Error::Internal(format!("random bytes for the agent key: {e}")))?;
    AgentKey::from_bytes(&bytes).map_err(|e| Error::Internal(e.to_string()))
}

/// How long to wait before trying again when the agent was too busy to take a connection.
const BUSY_RETRY: Duration = Duration::from_millis(50);

/// How many times a connection whose proof the agent closed unanswered is tried again.
const CLOSED_AFTER_PROOF_TRIES: u32 = 5;

/// Why a handshake failed: worth another try, a few more, or not.
enum HandshakeFailed {
    Busy(Error),
    ClosedAfterProof(Error),
    Refused(Error),
}
use HandshakeFailed::{Busy, ClosedAfterProof, Refused};

/// The shim's side of the handshake on a connection to guest `port`.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &AgentKey,
    port: u32,
) -> Result<(), HandshakeFailed> {
    let mut nonce = [0u8; auth::NONCE_LEN];
    getrandom::getrandom(&mut nonce)
        .map_err(|e| Refused(Error::Internal(format!("random bytes for a nonce: {e}"))))?;
    auth::connect(stream, key, port, nonce)
        .await
        .map_err(|e| match e {
            auth::AuthError::NoChallenge => {
                Busy(Error::AgentLost(format!("vsock port {port}: {e}")))
            }
            e => {
                let unproven = Error::AgentLost(format!(
                    "vsock port {port}: the guest did not prove it is this pod's agent: {e}"
                ));
                match e {
                    auth::AuthError::ClosedAfterProof => ClosedAfterProof(unproven),
                    _ => Refused(unproven),
                }
            }
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// vhost-device-vsock's side for one connection: the CONNECT, then an agent holding
    /// `key` (which closes the connection unless the host proves that key), then `payload`.
    async fn fake_vm(
        path: &Path,
        key: AgentKey,
        payload: &'static [u8],
    ) -> tokio::task::JoinHandle<()> {
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        tokio::spawn(async move {
            // Until one proves the key, or the shim gives up: a VM with another key sees
            // each of its tries.
            for _ in 0..=CLOSED_AFTER_PROOF_TRIES {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 13];
                s.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"CONNECT 1024\n");
                s.write_all(b"OK 5\n").await.unwrap();
                if auth::accept(&mut s, &key, 1024, key.guest_nonce(0))
                    .await
                    .is_ok()
                {
                    s.write_all(payload).await.unwrap();
                    return;
                }
            }
        })
    }

    #[tokio::test]
    async fn hybrid_handshakes_keep_following_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let key = new_agent_key().unwrap();
        let server = fake_vm(&path, key.clone(), b"hello").await;
        let endpoint = Endpoint::new(Route::Hybrid { uds: path.clone() }, key);
        let mut stream = endpoint.connect(1024).await.unwrap();
        let mut rest = String::new();
        stream.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "hello");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_vm_with_another_key_is_not_the_pods_agent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let server = fake_vm(&path, new_agent_key().unwrap(), b"secret").await;
        let endpoint = Endpoint::new(
            Route::Hybrid { uds: path.clone() },
            new_agent_key().unwrap(),
        );
        let err = endpoint.connect(1024).await.err().expect("refused");
        assert!(matches!(err, Error::AgentLost(_)), "{err:?}");
        assert!(err.message().contains("did not prove"), "{}", err.message());
        server.await.unwrap();
    }

    /// An agent whose handshake slots were all busy closes a connection before its
    /// challenge, and one whose slot a flood took closes it after the shim's proof: the
    /// shim tries again, within its deadline, and gets in.
    #[tokio::test]
    async fn a_busy_agent_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let key = new_agent_key().unwrap();
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = {
            let key = key.clone();
            tokio::spawn(async move {
                for turn in 0..4 {
                    let (mut s, _) = listener.accept().await.unwrap();
                    let mut buf = [0u8; 13];
                    s.read_exact(&mut buf).await.unwrap();
                    s.write_all(b"OK 5\n").await.unwrap();
                    if turn < 2 {
                        continue; // closed before the challenge
                    }
                    if turn == 2 {
                        // Challenged, and closed once the proof came (its slot taken).
                        let hello = auth::Hello {
                            nonce: key.guest_nonce(9),
                        };
                        s.write_all(hello.to_line().as_bytes()).await.unwrap();
                        let mut proof = [0u8; auth::AUTH_LEN];
                        s.read_exact(&mut proof).await.unwrap();
                        continue;
                    }
                    auth::accept(&mut s, &key, 1024, key.guest_nonce(0))
                        .await
                        .unwrap();
                    s.write_all(b"in").await.unwrap();
                }
            })
        };
        let endpoint = Endpoint::new(Route::Hybrid { uds: path.clone() }, key);
        let mut stream = endpoint.connect(1024).await.unwrap();
        let mut rest = String::new();
        stream.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "in");
        server.await.unwrap();
    }

    #[test]
    fn keys_are_new_each_time() {
        assert_ne!(new_agent_key().unwrap(), new_agent_key().unwrap());
    }
}
