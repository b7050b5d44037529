//! The devices that make a VM loaded from a template its pod's own, plugged in over vmlet's
//! QMP monitor after the load: the template was saved without them, so nothing of theirs is
//! in its memory. The vsock device carries the pod's CID, and with it the way to the pod's
//! agent (vhost-device-vsock, one per pod, at a socket of the pod's state directory); each
//! NIC carries the pod's MAC, on a tap of the pod's network namespace.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use serde_json::json;

use crate::devices::qmp::Qmp;
use crate::host::taps::TapDescription;
use crate::Error;

/// The QMP ids of the plugged vsock device and its chardev.
pub const VSOCK_DEVICE: &str = "vmlet-vsock";
const VSOCK_CHARDEV: &str = "vmlet-vsock-backend";
/// The monitor's name of the shim's connection to the backend, until the chardev takes it.
const VSOCK_FD: &str = "vmlet-vsock-connection";

/// How the plugged vsock device reaches the pod's vhost-device-vsock (which knows the pod's
/// CID).
#[derive(Debug)]
pub enum VsockBackend {
    /// QEMU connects the backend's socket itself (libvirt's QEMU).
    Socket(PathBuf),
    /// The shim's connection to it, handed over the monitor (QEMU the shim started).
    Connection(OwnedFd),
}

/// Plugs a `vhost-user-vsock-pci` device into the hot-plug root port `port`, served by
/// `backend`. An error names the device.
pub async fn plug_vsock(qmp: &Qmp, backend: VsockBackend, port: &str) -> Result<(), Error> {
    let what = match &backend {
        VsockBackend::Socket(path) => format!("backend {}", path.display()),
        VsockBackend::Connection(_) => "the shim's connection to its backend".to_owned(),
    };
    plug_vsock_device(qmp, backend, port)
        .await
        .map_err(|e| e.within(&format!("plug the vsock device ({what}) into {port}")))
}

async fn plug_vsock_device(qmp: &Qmp, backend: VsockBackend, port: &str) -> Result<(), Error> {
    let handed = matches!(backend, VsockBackend::Connection(_));
    let addr = match backend {
        VsockBackend::Socket(path) => {
            let path = path
                .to_str()
                .ok_or_else(|| Error::Internal(format!("{} is not UTF-8", path.display())))?
                .to_owned();
            json!({"type": "unix", "data": {"path": path}})
        }
        VsockBackend::Connection(fd) => {
            // The chardev takes the descriptor from the monitor (no connect of its own).
            qmp.execute("getfd", json!({"fdname": VSOCK_FD}), vec![fd])
                .await?;
            json!({"type": "fd", "data": {"str": VSOCK_FD}})
        }
    };
    let added = qmp
        .execute(
            "chardev-add",
            json!({
                "id": VSOCK_CHARDEV,
                "backend": {"type": "socket", "data": {"addr": addr, "server": false}},
            }),
            Vec::new(),
        )
        .await;
    if let Err(e) = added {
        // A descriptor the chardev did not take stays the monitor's until closed.
        if handed {
            let _ = qmp
                .execute("closefd", json!({"fdname": VSOCK_FD}), Vec::new())
                .await;
        }
        return Err(e);
    }
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

/// Plugs NIC `index` into the root port `port`: a `virtio-net-pci` device with the pod's
/// MAC and MTU, on the tap `fd` (opened by the shim in the pod's network namespace; QEMU
/// gets the descriptor over the monitor and never a path). An error names the NIC.
pub async fn plug_nic(
    qmp: &Qmp,
    index: usize,
    tap: &TapDescription,
    fd: OwnedFd,
    port: &str,
) -> Result<(), Error> {
    plug_nic_device(qmp, index, tap, fd, port)
        .await
        .map_err(|e| e.within(&format!("plug NIC {index} (MAC {}) into {port}", tap.mac)))
}

async fn plug_nic_device(
    qmp: &Qmp,
    index: usize,
    tap: &TapDescription,
    fd: OwnedFd,
    port: &str,
) -> Result<(), Error> {
    let (fd_name, netdev, device) = (
        format!("vmlet-tap{index}"),
        format!("vmletnet{index}"),
        format!("vmlet-nic{index}"),
    );
    qmp.execute("getfd", json!({"fdname": fd_name}), vec![fd])
        .await?;
    let added = qmp
        .execute(
            "netdev_add",
            json!({"type": "tap", "id": netdev, "fd": fd_name, "vhost": false}),
            Vec::new(),
        )
        .await;
    if let Err(e) = added {
        let _ = qmp
            .execute("closefd", json!({"fdname": fd_name}), Vec::new())
            .await;
        return Err(e);
    }
    let plugged = qmp
        .execute(
            "device_add",
            json!({
                "driver": "virtio-net-pci",
                "id": device,
                "netdev": netdev,
                "mac": tap.mac,
                "host_mtu": tap.mtu,
                "bus": port,
            }),
            Vec::new(),
        )
        .await;
    if let Err(e) = plugged {
        let _ = qmp
            .execute("netdev_del", json!({"id": netdev}), Vec::new())
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
        let backend = VsockBackend::Socket(PathBuf::from("/run/vmlet/p/vhost.sock"));
        plug_vsock(&qmp, backend, "hotplug1").await.unwrap();
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
    async fn the_shims_connection_to_the_backend_is_handed_to_the_chardev() {
        let (stream, server) = fake_qemu(|_| vec![json!({"return": {}})]);
        let qmp = Qmp::handshake(stream).await.unwrap();
        let (ours, _backend) = std::os::unix::net::UnixStream::pair().unwrap();
        plug_vsock(&qmp, VsockBackend::Connection(ours.into()), "hotplug1")
            .await
            .unwrap();
        drop(qmp);
        let seen = finished(server).await;
        let commands: Vec<_> = seen[1..]
            .iter()
            .map(|(c, _)| c["execute"].clone())
            .collect();
        assert_eq!(commands, ["getfd", "chardev-add", "device_add"]);
        assert_eq!(seen[1].1, 1, "the connection travels with getfd");
        let (getfd, chardev) = (&seen[1].0["arguments"], &seen[2].0["arguments"]);
        let addr = &chardev["backend"]["data"]["addr"];
        assert_eq!(addr["type"], "fd");
        assert_eq!(addr["data"]["str"], getfd["fdname"]);
        assert_eq!(chardev["backend"]["data"]["server"], false);
        assert_eq!(seen[3].0["arguments"]["chardev"], chardev["id"]);
    }

    #[tokio::test]
    async fn a_refused_chardev_gives_the_connection_back() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "chardev-add" => vec![json!({"error": {"class": "GenericError", "desc": "no"}})],
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let (ours, _backend) = std::os::unix::net::UnixStream::pair().unwrap();
        let err = plug_vsock(&qmp, VsockBackend::Connection(ours.into()), "hotplug1")
            .await
            .unwrap_err();
        assert!(err.message().contains("the shim's connection"), "{err}");
        drop(qmp);
        let seen: Vec<Value> = finished(server).await.into_iter().map(|s| s.0).collect();
        assert_eq!(seen.last().unwrap()["execute"], "closefd");
    }

    #[tokio::test]
    async fn a_nic_is_plugged_on_the_tap_it_is_handed_with_the_pods_mac() {
        let (stream, server) = fake_qemu(|_| vec![json!({"return": {}})]);
        let qmp = Qmp::handshake(stream).await.unwrap();
        let tap = TapDescription {
            mac: "0a:58:0a:00:00:05".into(),
            mtu: 1400,
            slot: 0x12,
        };
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        plug_nic(&qmp, 1, &tap, fd, "vmlet-nic-port1")
            .await
            .unwrap();
        drop(qmp);
        let seen = finished(server).await;
        let commands: Vec<_> = seen[1..]
            .iter()
            .map(|(c, _)| c["execute"].clone())
            .collect();
        assert_eq!(commands, ["getfd", "netdev_add", "device_add"]);
        assert_eq!(seen[1].1, 1, "the tap's fd travels with getfd");
        let (getfd, netdev, device) = (
            &seen[1].0["arguments"],
            &seen[2].0["arguments"],
            &seen[3].0["arguments"],
        );
        assert_eq!(netdev["fd"], getfd["fdname"]);
        assert_eq!(netdev["vhost"], false);
        assert_eq!(device["netdev"], netdev["id"]);
        assert_eq!(device["driver"], "virtio-net-pci");
        assert_eq!(device["mac"], "0a:58:0a:00:00:05");
        assert_eq!(device["host_mtu"], 1400);
        assert_eq!(device["bus"], "vmlet-nic-port1");
    }

    #[tokio::test]
    async fn a_refused_nic_leaves_no_netdev_behind() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "device_add" => vec![json!({"error": {"class": "GenericError", "desc": "no port"}})],
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let tap = TapDescription {
            mac: "0a:58:0a:00:00:05".into(),
            mtu: 1500,
            slot: 0x12,
        };
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let err = plug_nic(&qmp, 0, &tap, fd, "nowhere").await.unwrap_err();
        assert!(err.message().contains("no port"), "{err}");
        assert!(
            err.message()
                .contains("plug NIC 0 (MAC 0a:58:0a:00:00:05) into nowhere"),
            "{err}"
        );
        drop(qmp);
        let seen: Vec<Value> = finished(server).await.into_iter().map(|s| s.0).collect();
        assert_eq!(seen.last().unwrap()["execute"], "netdev_del");
    }

    #[tokio::test]
    async fn a_refused_device_leaves_no_chardev_behind() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "device_add" => vec![json!({"error": {"class": "GenericError", "desc": "no port"}})],
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let err = plug_vsock(&qmp, VsockBackend::Socket(PathBuf::from("/x")), "hotplug1")
            .await
            .unwrap_err();
        assert!(err.message().contains("no port"), "{err}");
        assert!(err.message().contains("vsock device"), "{err}");
        drop(qmp);
        let seen: Vec<Value> = finished(server).await.into_iter().map(|s| s.0).collect();
        assert_eq!(seen.last().unwrap()["execute"], "chardev-remove");
    }
}
