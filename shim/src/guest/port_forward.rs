//! Port-forward into the VM (`kubectl port-forward`, `crictl port-forward`).
//!
//! containerd's CRI plugin forwards a port by entering the pod's network namespace and
//! dialling `localhost:PORT` there. Under vmlet the pod's servers listen in the guest, so
//! the shim listens in the pod namespace instead: one socket on 127.0.0.1, which every TCP
//! connection to the namespace's loopback reaches whatever its port ([`crate::host::sk_lookup`]),
//! and each accepted connection goes to the same port in the guest ([`Target`]):
//! - vmlet's guest: carried over vsock to the agent, which dials the port on the guest's
//!   loopback ([`vmlet_protocol::ForwardRequest`]);
//! - a VM image (docs/vm-mode.md), which has no vmlet agent: dialled on the guest's address
//!   on the pod network, from the shim's own namespace, as the node reaches its pods (the
//!   kubelet's HTTP probes do the same). Only a server listening on that address (or on
//!   all of them) is reached, not one on the guest's loopback.
//!
//! A port nothing in the guest listens on is refused there, and the client sees its
//! connection closed. Only processes in the pod namespace can connect (the steering matches
//! 127.0.0.1, which packets from the guest's tap cannot carry), at most [`MAX_CONNECTIONS`]
//! at a time.

use std::net::IpAddr;
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
/// How long dialling a VM image's address may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a forwarded connection goes.
#[derive(Clone)]
pub enum Target {
    /// vmlet's agent, over vsock: it dials the port on the guest's loopback.
    Agent(Endpoint),
    /// The guest's address on the pod network, dialled from the shim's namespace.
    Address(IpAddr),
}

/// The pod's forwarding; stops (listener closed, steering detached, every connection
/// dropped) when stopped or dropped.
pub struct PortForward {
    task: JoinHandle<()>,
}

impl PortForward {
    /// Starts forwarding the loopback of the network namespace at `netns` to `target`. None, with a warning, when that namespace's loopback has no
    /// 127.0.0.1 (the CNI loopback plugin did not run): a client there could reach nothing
    /// under runc either.
    pub async fn start(netns: &Path, target: Target, pod_id: &str) -> Result<Option<Self>, Error> {
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
            accept_loop(listener, target, &pod_id).await;
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

async fn accept_loop(listener: TcpListener, target: Target, pod_id: &str) {
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
        let (target, pod_id) = (target.clone(), pod_id.to_owned());
        connections.spawn(async move {
            let _permit = permit;
            if let Err(e) = carry(client, &target).await {
                log::warn!("pod {pod_id}: port-forward: {}", e.message());
            }
        });
    }
}

/// One connection: reaches the port it was made to in the guest, then copies both ways.
async fn carry(mut client: TcpStream, target: &Target) -> Result<(), Error> {
    let port = client
        .local_addr()
        .map_err(|e| Error::io("port-forward: local address", e))?
        .port();
    match target {
        Target::Agent(endpoint) => {
            let mut guest = through_agent(endpoint, port).await?;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
        }
        Target::Address(address) => {
            let mut guest = dial(*address, port).await?;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
        }
    }
    Ok(())
}

/// Whether the shim may dial `address` as a VM image's pod address: not a loopback,
/// link-local, multicast, broadcast or unspecified one, and none of its own namespace's
/// (which a pod's network cannot own), so that whatever a pod's network spec names, a
/// port-forward reaches no service of the node's. The reason when not.
pub fn check_guest_address(address: IpAddr) -> Result<(), String> {
    let special = match address {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || a.is_link_local()
                || a.is_multicast()
                || a.is_broadcast()
        }
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped().is_some()
        }
    };
    if special {
        return Err(format!(
            "{address} is a loopback, link-local, multicast, broadcast or unspecified address"
        ));
    }
    match std::net::TcpListener::bind((address, 0)) {
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Ok(()),
        Ok(_) => Err(format!("{address} is an address of the node's own")),
        Err(e) => Err(format!(
            "{address}: cannot tell whether it is the node's: {e}"
        )),
    }
}

/// A VM image's `port` on its pod address, within [`DIAL_TIMEOUT`].
async fn dial(address: IpAddr, port: u16) -> Result<TcpStream, Error> {
    match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect((address, port))).await {
        Ok(Ok(guest)) => Ok(guest),
        Ok(Err(e)) => Err(Error::io(
            format!("port-forward to the guest's {address} port {port}"),
            e,
        )),
        Err(_) => Err(Error::Timeout(format!(
            "port-forward to the guest's {address} port {port}: no answer within {DIAL_TIMEOUT:?}"
        ))),
    }
}

/// Asks the agent for `port` on the guest's loopback; the stream carries the connection
/// once the agent said it reached it.
async fn through_agent(endpoint: &Endpoint, port: u16) -> Result<Box<dyn Stream>, Error> {
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
    Ok(guest)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A VM image's forward: the connection made to the listener's port reaches the same
    /// port on the guest's address (127.0.0.2 standing in for it), both ways.
    #[tokio::test]
    async fn a_connection_reaches_the_same_port_on_the_guests_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let guest = TcpListener::bind(("127.0.0.2", port)).await.unwrap();
        let served = tokio::spawn(async move {
            let (mut conn, _) = guest.accept().await.unwrap();
            let mut asked = [0u8; 4];
            conn.read_exact(&mut asked).await.unwrap();
            conn.write_all(b"pong").await.unwrap();
            asked
        });
        let forward = tokio::spawn(accept_loop(
            listener,
            Target::Address("127.0.0.2".parse().unwrap()),
            "pod",
        ));
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut answer = [0u8; 4];
        client.read_exact(&mut answer).await.unwrap();
        forward.abort();
        assert_eq!(&answer, b"pong");
        assert_eq!(&served.await.unwrap(), b"ping");
    }

    #[test]
    fn only_an_address_off_the_node_is_dialled() {
        for refused in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            let err = check_guest_address(refused.parse().unwrap()).unwrap_err();
            assert!(err.contains(refused), "{err}");
        }
        // TEST-NET-1: nobody's, so not this namespace's either.
        assert_eq!(check_guest_address("192.0.2.10".parse().unwrap()), Ok(()));
    }

    /// Nothing listens on the guest's port: the client's connection is closed, not held.
    #[tokio::test]
    async fn a_port_nothing_listens_on_closes_the_clients_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let forward = tokio::spawn(accept_loop(
            listener,
            Target::Address("127.0.0.3".parse().unwrap()),
            "pod",
        ));
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
            .await
            .expect("the connection is closed");
        forward.abort();
        assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
    }
}
