//! The one way in from the host: every connection, on every port (ttrpc, stdio streams,
//! port-forward), must prove that it comes from the pod's own shim
//! ([`vmlet_protocol::auth`]) before the agent reads a byte of its request. With the
//! kernel's vhost-vsock any process of the node can connect to a guest's CID, and with
//! vhost-device-vsock whoever reaches its socket: the key, which only the shim and this
//! guest have, is what tells the shim apart.
//!
//! A connection that does not prove it within [`HANDSHAKE_DEADLINE`] is closed; at most
//! [`SLOTS`] connections may be in their handshake at once, and a new one takes the oldest
//! one's slot ([`crate::handshake_slots`]), so a flood of them holds no more of the agent
//! than that and cannot keep the shim, which proves its key at once, out. Connections from a
//! reserved port (below 1024, which only a process with `CAP_NET_BIND_SERVICE` may bind: the
//! shim binds one on the kernel's vhost-vsock) have slots of their own. Refusals are logged
//! (the first 16, then at each power of two), so that a flood does not flood the log.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_vsock::{VsockAddr, VsockListener, VsockStream, VMADDR_CID_ANY};
use vmlet_protocol::auth::{self, AgentKey, KEY_LEN};

use crate::handshake_slots::{Slots, SLOTS};
use crate::Error;

/// How long a host connection has to prove it holds the key.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// Host ports below this one are reserved (`CAP_NET_BIND_SERVICE`).
pub const RESERVED_PORTS_BELOW: u32 = 1024;
/// Refusals logged each, before only those whose count is a power of two are.
const LOGGED_REFUSALS: u64 = 16;
/// How long to wait before accepting again after `accept` failed (out of descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A bound vsock port, not yet served.
pub struct Listening {
    listener: VsockListener,
    port: u32,
    what: &'static str,
}

/// Binds vsock `port` (`what` it serves, for the log): bound before the agent reports
/// ready, served by [`Gate::serve`].
pub fn listen(port: u32, what: &'static str) -> Result<Listening, Error> {
    let listener = VsockListener::bind(VsockAddr::new(VMADDR_CID_ANY, port))
        .map_err(|e| Error::io(format!("listen on the {what} port"), e))?;
    Ok(Listening {
        listener,
        port,
        what,
    })
}

/// The key and what the handshakes share.
pub struct Gate {
    key: AgentKey,
    /// Numbers the guest's nonces ([`AgentKey::guest_nonce`]).
    nonces: AtomicU64,
    /// Handshake slots of peers on a reserved port, and of the others.
    reserved: Arc<Slots>,
    others: Arc<Slots>,
    /// Connections refused so far.
    refused: AtomicU64,
}

impl Gate {
    pub fn new(key: AgentKey) -> Arc<Self> {
        Arc::new(Gate {
            key,
            nonces: AtomicU64::new(0),
            reserved: Slots::new(SLOTS),
            others: Slots::new(SLOTS),
            refused: AtomicU64::new(0),
        })
    }

    /// Accepts host connections on vsock `port` for ever; each that proves the key is
    /// handed to `handle` in a task of its own (a refusal and a failure are logged, named
    /// by `what`).
    pub async fn serve<F, Fut>(self: Arc<Self>, port: Listening, handle: F) -> Result<(), Error>
    where
        F: Fn(VsockStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let Listening {
            listener,
            port,
            what,
        } = port;
        let handle = Arc::new(handle);
        loop {
            let (mut stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                // Out of descriptors, or a connection gone before it was taken: the port
                // stays served.
                Err(e) => {
                    log::warn!("{what}: accept: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            let slots = if peer.port() < RESERVED_PORTS_BELOW {
                &self.reserved
            } else {
                &self.others
            };
            let (mut slot, _) = slots.take();
            let (gate, handle) = (self.clone(), handle.clone());
            tokio::spawn(async move {
                let admitted = tokio::select! {
                    admitted = gate.admit(&mut stream, port) => admitted,
                    () = slot.taken_over() => Err(format!(
                        "{SLOTS} newer connections took the handshake slots"
                    )),
                };
                drop(slot);
                if let Err(reason) = admitted {
                    gate.refused(what, &peer, &reason);
                    return;
                }
                if let Err(e) = handle(stream).await {
                    log::warn!("{what} connection: {e}");
                }
            });
        }
    }

    /// Logs a refusal: the first [`LOGGED_REFUSALS`], then each whose count is a power of two.
    fn refused(&self, what: &str, peer: &VsockAddr, reason: &str) {
        let count = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if count <= LOGGED_REFUSALS || count.is_power_of_two() {
            log::warn!(
                "{what}: refused a connection from {peer:?}: {reason} ({count} refused so far)"
            );
        }
    }

    /// Runs the agent's side of the handshake on `stream` within [`HANDSHAKE_DEADLINE`].
    pub async fn admit<S>(&self, stream: &mut S, port: u32) -> Result<(), String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let nonce = self
            .key
            .guest_nonce(self.nonces.fetch_add(1, Ordering::Relaxed));
        match tokio::time::timeout(
            HANDSHAKE_DEADLINE,
            auth::accept(stream, &self.key, port, nonce),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no proof within {HANDSHAKE_DEADLINE:?}")),
        }
    }
}

/// Starts a ttrpc server with `services` that takes only the connections on `port` that
/// passed `gate`. The server stops when dropped.
pub async fn start_ttrpc(
    gate: Arc<Gate>,
    port: Listening,
    services: std::collections::HashMap<String, ttrpc::r#async::Service>,
) -> Result<ttrpc::r#async::Server, Error> {
    let (admitted, incoming) = tokio::sync::mpsc::channel::<VsockStream>(4);
    let incoming = futures_util::stream::unfold(incoming, |mut rx| async move {
        rx.recv().await.map(|stream| (Ok(stream), rx))
    });
    let mut server = ttrpc::r#async::Server::new()
        .add_listener(ttrpc::r#async::transport::Listener::new(incoming))
        .register_service(services);
    server
        .start()
        .await
        .map_err(|e| Error::Boot(format!("start ttrpc server: {e}")))?;
    let served = gate.serve(port, move |stream| {
        let admitted = admitted.clone();
        async move {
            admitted
                .send(stream)
                .await
                .map_err(|_| Error::Boot("the ttrpc server has stopped".into()))
        }
    });
    tokio::spawn(async move {
        if let Err(e) = served.await {
            log::error!("ttrpc: {e}");
        }
    });
    Ok(server)
}

/// Reads the VM's key that the shim gave QEMU ([`auth::FW_CFG_SYSFS_PATH`]): exactly
/// [`KEY_LEN`] bytes. Without it the agent cannot tell its shim from anyone else and does
/// not serve.
pub fn read_key() -> Result<AgentKey, Error> {
    use std::io::Read;
    let path = auth::FW_CFG_SYSFS_PATH;
    let mut bytes = Vec::with_capacity(KEY_LEN + 1);
    std::fs::File::open(path)
        .and_then(|f| f.take(KEY_LEN as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| Error::io(format!("read the agent key at {path}"), e))?;
    AgentKey::from_bytes(&bytes)
        .map_err(|_| Error::Boot(format!("the agent key at {path} is not {KEY_LEN} bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

    fn key(byte: u8) -> AgentKey {
        AgentKey::from_bytes(&[byte; KEY_LEN]).unwrap()
    }

    #[tokio::test]
    async fn the_shims_connection_is_admitted() {
        let gate = Gate::new(key(1));
        let (mut host, mut guest) = duplex(1024);
        let shim = tokio::spawn(async move {
            auth::connect(&mut host, &key(1), 1025, [3; 16])
                .await
                .unwrap();
            host.write_all(b"STREAM c1 - stdout\n").await.unwrap();
        });
        gate.admit(&mut guest, 1025).await.unwrap();
        let mut header = [0u8; 19];
        guest.read_exact(&mut header).await.unwrap();
        assert_eq!(&header, b"STREAM c1 - stdout\n");
        shim.await.unwrap();
    }

    #[tokio::test]
    async fn another_key_and_a_bare_request_are_refused() {
        let gate = Gate::new(key(1));
        let (mut host, mut guest) = duplex(1024);
        tokio::spawn(async move { auth::connect(&mut host, &key(2), 1024, [3; 16]).await });
        let refused = gate.admit(&mut guest, 1024).await.unwrap_err();
        assert!(refused.contains("not this VM's key"), "{refused}");

        let (mut host, mut guest) = duplex(1024);
        host.write_all(&b"FORWARD 8080\n".repeat(10)).await.unwrap();
        let refused = gate.admit(&mut guest, 1026).await.unwrap_err();
        assert!(refused.contains("not a vmlet handshake"), "{refused}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_refused_at_the_deadline() {
        let gate = Gate::new(key(1));
        let (_host, mut guest) = duplex(1024);
        let started = tokio::time::Instant::now();
        let refused = gate.admit(&mut guest, 1024).await.unwrap_err();
        assert!(refused.contains("no proof within"), "{refused}");
        assert_eq!(started.elapsed(), HANDSHAKE_DEADLINE);
    }

    #[test]
    fn every_guest_nonce_differs() {
        let gate = Gate::new(key(1));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let n = gate.nonces.fetch_add(1, Ordering::Relaxed);
            assert!(seen.insert(gate.key.guest_nonce(n)));
        }
    }
}
