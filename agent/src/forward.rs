//! Port-forward connections: the host connects to [`vmlet_protocol::FORWARD_PORT`], passes
//! the [`Gate`] and sends a [`ForwardRequest`]; the agent dials that port on the guest's loopback (the pod's
//! containers share the guest's network namespace), answers, and copies both ways until
//! either side closes.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_vsock::VsockStream;
use vmlet_protocol::{ForwardReply, ForwardRequest, FORWARD_PORT};

use crate::host_gate::{Gate, Listening};
use crate::Error;

/// How long dialling the guest's port may take (a listening port answers at once).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the port-forward port (before the agent reports ready).
pub fn listen() -> Result<Listening, Error> {
    crate::host_gate::listen(FORWARD_PORT, "port-forward")
}

pub async fn serve(gate: Arc<Gate>, port: Listening) -> Result<(), Error> {
    gate.serve(port, forward).await
}

async fn forward(mut host: VsockStream) -> Result<(), Error> {
    let line = crate::streams::read_line(&mut host, "forward request").await?;
    let request = ForwardRequest::parse(&line).map_err(Error::InvalidRequest)?;
    let target = SocketAddrV4::new(Ipv4Addr::LOCALHOST, request.port);
    let dialled = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("connect {target}: {e}")),
        Err(_) => Err(format!(
            "connect {target}: no answer within {DIAL_TIMEOUT:?}"
        )),
    };
    let reply = match &dialled {
        Ok(_) => ForwardReply::Connected,
        Err(reason) => ForwardReply::Refused(reason.clone()),
    };
    host.write_all(reply.to_string().as_bytes())
        .await
        .map_err(|e| Error::io("answer forward request", e))?;
    let mut guest = dialled.map_err(Error::InvalidRequest)?;
    // Ends when both directions are done; the host closes its side when its client does.
    let _ = tokio::io::copy_bidirectional(&mut host, &mut guest).await;
    Ok(())
}
