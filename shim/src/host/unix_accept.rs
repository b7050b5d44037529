//! Accepting on a Unix socket the shim keeps serving (a pod's figures, a VM image's console
//! for the operator, the taps for libvirt's QEMU): an error (the shim out of descriptors, a
//! connection gone before it was taken) is logged and the socket stays served, after a pause
//! that keeps a lasting error from spinning, as the agent's ports are
//! (`agent/src/host_gate.rs`). A server that ended at its first error would leave the pod
//! without it for the rest of its life.

use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

/// How long a server waits after a failed accept.
const RETRY: Duration = Duration::from_millis(100);

/// The next connection to `listener` (`what` it serves, for the log).
pub(crate) async fn next(listener: &UnixListener, what: &str) -> UnixStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(e) => {
                log::warn!("{what}: accept: {e}");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
