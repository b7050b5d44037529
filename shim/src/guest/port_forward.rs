//! Port-forward into the VM (`kubectl port-forward`, `crictl port-forward`).
//!
//! containerd's CRI plugin forwards a port by entering the pod's network namespace and
//! dialling `localhost:PORT` there. Under vmlet the pod's servers listen in the guest, so
//! the shim listens in the pod namespace instead: one socket on 127.0.0.1, which every TCP
//! connection to the namespace's loopback reaches whatever its port ([`crate::host::sk_lookup`]),
//! and each accepted connection is carried over vsock to the agent, which dials the same
//! port on the guest's loopback ([`vmlet_protocol::ForwardRequest`]). A port nothing in the
//! guest listens on is refused there, and the client sees its connection closed.
//!
//! Only processes in the pod namespace can connect (the steering matches 127.0.0.1, which
//! packets from the guest's tap cannot carry), at most [`MAX_CONNECTIONS`] at a time.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use vmlet_protocol::{ForwardReply, ForwardRequest, FORWARD_PORT, MAX_HEADER_LEN};

use crate::guest::vsock::{Endpoint, Stream};
use crate::Error;

/// Forwarded connections open at once per pod; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 64;
/// How long the agent may take to say whether it reached the guest's port (it gives up
/// dialling after 5 s).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The pod's forwarding; stops (listener closed, steering detached, every connection
/// dropped) when stopped or dropped.
pub struct PortForward {
    task: JoinHandle<()>,
}

impl PortForward {
    /// Starts forwarding the loopback of the network namespace at `netns` into the guest
    /// behind `endpoint`. None, with a warning, when that namespace's loopback has no
    /// 127.0.0.1 (the CNI loopback plugin did not run): a client there could reach nothing
    /// under runc either.
    pub async fn start(
        netns: &Path,
        endpoint: Endpoint,
        pod_id: &str,
    ) -> Result<Option<Self>, Error> {
        let path = netns.to_owned();
        let listening = tokio::task::spawn_blocking(move || listen_in(&path))
            .await
            .map_err(|e| Error::Internal(format!("port-forward setup: {e}")))??;
        let Some((listener, link)) = listening else {
            log::warn!(
                "pod {pod_id}: no port-forward: the loopback of {} has no 127.0.0.1",
                netns.display()
            );
            return Ok(None);
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("port-forward listener", e))?;
        let listener =
            TcpListener::from_std(listener).map_err(|e| Error::io("port-forward listener", e))?;
        let pod_id = pod_id.to_owned();
        let task = tokio::spawn(async move {
            // Owned by the task: aborting it detaches the steering and closes the listener.
            let _link = link;
            accept_loop(listener, endpoint, &pod_id).await;
        });
        Ok(Some(PortForward { task }))
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// In a thread that enters the namespace (sockets belong to the namespace they are made
/// in): the listener on 127.0.0.1 and the steering link.
fn listen_in(netns: &Path) -> Result<Option<(std::net::TcpListener, std::os::fd::OwnedFd)>, Error> {
    let path = netns.to_owned();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| Error::io(format!("enter {}", path.display()), e.into()))?;
        let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
            Ok(listener) => listener,
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => return Ok(None),
            Err(e) => return Err(Error::io("port-forward: listen on 127.0.0.1", e)),
        };
        let link = crate::host::sk_lookup::steer_loopback_tcp(ns.as_fd(), listener.as_fd())
            .map_err(|e| {
                Error::FailedPrecondition(format!(
                    "port-forward needs BPF sk_lookup (Linux 5.9 or newer): {e}"
                ))
            })?;
        Ok(Some((listener, link)))
    })
    .join()
    .map_err(|_| Error::Internal("the port-forward setup thread panicked".into()))?
}

async fn accept_loop(listener: TcpListener, endpoint: Endpoint, pod_id: &str) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // Dropped with the task: every connection ends with the forwarding.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next() => continue,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(e) => {
                log::warn!("pod {pod_id}: port-forward accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            log::warn!(
                "pod {pod_id}: port-forward: {MAX_CONNECTIONS} connections open, one refused"
            );
            continue;
        };
        let (endpoint, pod_id) = (endpoint.clone(), pod_id.to_owned());
        connections.spawn(async move {
            let _permit = permit;
            if let Err(e) = carry(client, &endpoint).await {
                log::warn!("pod {pod_id}: port-forward: {}", e.message());
            }
        });
    }
}

/// One connection: asks the agent for the port it was made to, then copies both ways.
async fn carry(mut client: TcpStream, endpoint: &Endpoint) -> Result<(), Error> {
    let port = client
        .local_addr()
        .map_err(|e| Error::io("port-forward: local address", e))?
        .port();
    let mut guest = endpoint.connect(FORWARD_PORT).await?;
    guest
        .write_all(ForwardRequest { port }.to_string().as_bytes())
        .await
        .map_err(|e| Error::io("port-forward: send request", e))?;
    let reply = tokio::time::timeout(REPLY_TIMEOUT, read_reply(&mut guest))
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "port-forward to guest port {port}: no answer within {REPLY_TIMEOUT:?}"
            ))
        })??;
    if let ForwardReply::Refused(reason) = reply {
        return Err(Error::FailedPrecondition(format!(
            "port-forward to guest port {port}: {reason}"
        )));
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
    Ok(())
}

/// The agent's reply line, at most [`MAX_HEADER_LEN`] bytes, byte by byte (what follows
/// belongs to the connection).
async fn read_reply(guest: &mut Box<dyn Stream>) -> Result<ForwardReply, Error> {
    let mut line = Vec::with_capacity(16);
    loop {
        let byte = guest
            .read_u8()
            .await
            .map_err(|e| Error::io("port-forward: read the agent's reply", e))?;
        if byte == b'\n' {
            break;
        }
        line.push(byte);
        if line.len() >= MAX_HEADER_LEN {
            return Err(Error::Internal(
                "port-forward: the agent's reply is too long".into(),
            ));
        }
    }
    let line = String::from_utf8_lossy(&line);
    ForwardReply::parse(&line).map_err(|e| Error::Internal(format!("port-forward: {e}")))
}
