//! The devices that make a VM loaded from a template its pod's own, plugged in over vmlet's
//! QMP monitor after the load: the template was saved without them, so nothing of theirs is
//! in its memory. The vsock device carries the pod's CID, and with it the way to the pod's
//! agent (vhost-device-vsock, one per pod, at a socket of the pod's state directory).

use std::path::Path;

use serde_json::json;

use crate::devices::qmp::Qmp;
use crate::Error;

/// The QMP ids of the plugged vsock device and its chardev.
pub const VSOCK_DEVICE: &str = "vmlet-vsock";
const VSOCK_CHARDEV: &str = "vmlet-vsock-backend";

/// Plugs a `vhost-user-vsock-pci` device into the hot-plug root port `port`, served by the
/// vhost-user backend listening at `backend` (which knows the pod's CID).
pub async fn plug_vsock(qmp: &Qmp, backend: &Path, port: &str) -> Result<(), Error> {
    let path = backend
        .to_str()
        .ok_or_else(|| Error::Internal(format!("{} is not UTF-8", backend.display())))?;
    qmp.execute(
        "chardev-add",
        json!({
            "id": VSOCK_CHARDEV,
            "backend": {"type": "socket", "data": {
                "addr": {"type": "unix", "data": {"path": path}},
                "server": false,
            }},
        }),
        Vec::new(),
    )
    .await?;
    let plugged = qmp
        .execute(
            "device_add",
            json!({
                "driver": "vhost-user-vsock-pci",
                "id": VSOCK_DEVICE,
                "chardev": VSOCK_CHARDEV,
                "bus": port,
            }),
            Vec::new(),
        )
        .await;
    if let Err(e) = plugged {
        let _ = qmp
            .execute("chardev-remove", json!({"id": VSOCK_CHARDEV}), Vec::new())
            .await;
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::qmp::tests::{fake_qemu, finished};
    use serde_json::Value;

    #[tokio::test]
    async fn the_vsock_device_is_plugged_into_the_port_named() {
        let (stream, server) = fake_qemu(|_| vec![json!({"return": {}})]);
        let qmp = Qmp::handshake(stream).await.unwrap();
        plug_vsock(&qmp, Path::new("/run/vmlet/p/vhost.sock"), "hotplug1")
            .await
            .unwrap();
        drop(qmp);
        let seen = finished(server).await;
        let chardev = &seen[1].0["arguments"];
        assert_eq!(
            chardev["backend"]["data"]["addr"]["data"]["path"],
            "/run/vmlet/p/vhost.sock"
        );
        let device = &seen[2].0["arguments"];
        assert_eq!(device["driver"], "vhost-user-vsock-pci");
        assert_eq!(device["bus"], "hotplug1");
        assert_eq!(device["chardev"], chardev["id"]);
    }

    #[tokio::test]
    async fn a_refused_device_leaves_no_chardev_behind() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "device_add" => vec![json!({"error": {"class": "GenericError", "desc": "no port"}})],
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let err = plug_vsock(&qmp, Path::new("/x"), "hotplug1")
            .await
            .unwrap_err();
        assert!(err.message().contains("no port"), "{err}");
        drop(qmp);
        let seen: Vec<Value> = finished(server).await.into_iter().map(|s| s.0).collect();
        assert_eq!(seen.last().unwrap()["execute"], "chardev-remove");
    }
}
