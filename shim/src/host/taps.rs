//! Handing tap file descriptors to `vmlet-vmwrapper` (the seeds' tapmanager/vmwrapper
//! pattern): libvirt starts QEMU in the host network namespace and cannot pass it a tap
//! opened in the pod's, so the shim serves the fds on a per-VM unix socket and the wrapper,
//! started by libvirt as the domain's emulator, fetches them with SCM_RIGHTS before it
//! executes QEMU with `-netdev tap,fd=N`.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use serde::{Deserialize, Serialize};

use crate::host::qemu_peer::QemuPeer;
use crate::Error;

/// Environment variable naming the tap socket in the domain's `<qemu:env>`.
pub const TAP_SOCKET_ENV: &str = "VMLET_TAP_SOCKET";
/// Most taps one VM gets (a NIC slot each).
const MAX_TAPS: usize = crate::vmm::pci_slots::MAX_NICS;

/// What the wrapper needs to know of each tap (the fd travels beside it): its NIC as the
/// VM's description has it ([`crate::vmm::vm_spec::VmSpec::taps`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapDescription {
    pub mac: String,
    pub mtu: u32,
    /// The NIC's slot on the root bus.
    pub slot: usize,
}

/// QEMU arguments for the taps, given the fd numbers the wrapper received.
pub fn qemu_args(taps: &[TapDescription], fds: &[RawFd]) -> Vec<String> {
    let mut args = Vec::new();
    for (i, (tap, fd)) in taps.iter().zip(fds).enumerate() {
        let slot = crate::vmm::pci_slots::hex(tap.slot);
        args.push("-netdev".into());
        args.push(format!("tap,id=vmletnet{i},fd={fd},vhost=off"));
        args.push("-device".into());
        args.push(format!(
            "virtio-net-pci,netdev=vmletnet{i},mac={},host_mtu={},bus=pcie.0,addr={slot}",
            tap.mac, tap.mtu,
        ));
    }
    args
}

/// Hands `taps` with their `fds` to the first connection on `listener` made by `qemu` (the
/// domain's wrapper about to become its QEMU, in the same process), then closes the
/// listener and the shim's copies of the fds: nothing else ever gets them. A connection by
/// any other process gets nothing and is logged.
pub fn serve(
    listener: tokio::net::UnixListener,
    taps: Vec<TapDescription>,
    fds: Vec<OwnedFd>,
    qemu: QemuPeer,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let payload = match serde_json::to_vec(&taps) {
            Ok(p) => p,
            Err(e) => {
                log::error!("encode tap descriptions: {e}");
                return;
            }
        };
        let mut fds = Some(fds);
        while let Some(held) = fds.take() {
            let stream = crate::host::unix_accept::next(&listener, "tap socket").await;
            let admitted = stream
                .peer_cred()
                .map_err(|e| format!("an unknown peer ({e})"))
                .and_then(|cred| qemu.admits(&cred));
            if let Err(why) = admitted {
                log::warn!("tap socket: refused a connection: {why}");
                fds = Some(held);
                continue;
            }
            let sent = tokio::task::spawn_blocking(move || send(stream, &payload, &held)).await;
            if let Ok(Err(e)) = sent {
                log::warn!("send taps to vmlet-vmwrapper: {}", e.message());
            }
            // One hand-over: the listener and the fds are dropped here.
            return;
        }
    })
}

fn send(stream: tokio::net::UnixStream, payload: &[u8], fds: &[OwnedFd]) -> Result<(), Error> {
    let stream = stream.into_std().map_err(|e| Error::io("tap socket", e))?;
    stream
        .set_nonblocking(false)
        .map_err(|e| Error::io("tap socket", e))?;
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    sendmsg::<UnixAddr>(
        stream.as_raw_fd(),
        &[IoSlice::new(payload)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| Error::io("send tap fds", e.into()))?;
    Ok(())
}

/// The wrapper's side: fetches the descriptions and fds (without close-on-exec, so QEMU
/// inherits them).
pub fn fetch(socket: &Path) -> Result<(Vec<TapDescription>, Vec<RawFd>), Error> {
    let stream = UnixStream::connect(socket)
        .map_err(|e| Error::io(format!("connect {}", socket.display()), e))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_TAPS]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<UnixAddr>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )
    .map_err(|e| Error::io("receive tap fds", e.into()))?;
    let mut fds = Vec::new();
    for c in msg
        .cmsgs()
        .map_err(|e| Error::io("tap control message", e.into()))?
    {
        if let ControlMessageOwned::ScmRights(received) = c {
            fds.extend(received);
        }
    }
    let len = msg.bytes;
    let taps: Vec<TapDescription> = serde_json::from_slice(&buf[..len])
        .map_err(|e| Error::Internal(format!("tap descriptions: {e}")))?;
    if taps.len() != fds.len() {
        return Err(Error::Internal(format!(
            "{} tap descriptions but {} fds",
            taps.len(),
            fds.len()
        )));
    }
    Ok((taps, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::qemu_peer::QemuPid;
    use std::path::PathBuf;

    #[test]
    fn args_name_fd_mac_mtu_and_slot() {
        let taps = vec![
            TapDescription {
                mac: "0a:58:0a:00:00:05".into(),
                mtu: 1400,
                slot: 0x12,
            },
            TapDescription {
                mac: "0a:58:0a:00:00:06".into(),
                mtu: 1500,
                slot: 0x13,
            },
        ];
        let args = qemu_args(&taps, &[7, 9]);
        assert_eq!(
            args,
            [
                "-netdev",
                "tap,id=vmletnet0,fd=7,vhost=off",
                "-device",
                "virtio-net-pci,netdev=vmletnet0,mac=0a:58:0a:00:00:05,host_mtu=1400,bus=pcie.0,addr=0x12",
                "-netdev",
                "tap,id=vmletnet1,fd=9,vhost=off",
                "-device",
                "virtio-net-pci,netdev=vmletnet1,mac=0a:58:0a:00:00:06,host_mtu=1500,bus=pcie.0,addr=0x13",
            ]
        );
    }

    /// This process, as the QEMU the taps are for.
    fn this_process() -> QemuPeer {
        QemuPeer {
            uid: nix::unistd::geteuid().as_raw(),
            pid: QemuPid::Is(std::process::id()),
        }
    }

    fn one_tap() -> Vec<TapDescription> {
        vec![TapDescription {
            mac: "0a:00:00:00:00:01".into(),
            mtu: 1500,
            slot: 0x12,
        }]
    }

    /// A tap server (one fd: /dev/null) for `qemu` on a socket in a new directory.
    fn tap_server(name: &str, qemu: QemuPeer) -> (PathBuf, tokio::task::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!("vmlet-taps-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = tokio::net::UnixListener::bind(dir.join("taps.sock")).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let server = serve(listener, one_tap(), vec![OwnedFd::from(file)], qemu);
        (dir, server)
    }

    async fn fetch_from(dir: &Path) -> Result<(Vec<TapDescription>, Vec<RawFd>), Error> {
        let path = dir.join("taps.sock");
        tokio::task::spawn_blocking(move || fetch(&path))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn fds_and_descriptions_travel_together() {
        let (dir, server) = tap_server("once", this_process());
        let (got, fds) = fetch_from(&dir).await.unwrap();
        assert_eq!(got, one_tap());
        assert_eq!(fds.len(), 1);
        // SAFETY: the fd was just received and is owned by nobody else.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) });
        // One hand-over only: the server is done and a second connection gets nothing.
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .expect("the server ends after one hand-over")
            .unwrap();
        assert!(
            fetch_from(&dir).await.is_err(),
            "a second connection got taps"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn another_user_gets_nothing() {
        let other = QemuPeer {
            uid: nix::unistd::geteuid().as_raw().wrapping_add(1),
            pid: QemuPid::Is(std::process::id()),
        };
        let (dir, server) = tap_server("uid", other);
        assert!(
            fetch_from(&dir).await.is_err(),
            "a peer of the wrong user got taps"
        );
        assert!(!server.is_finished(), "still waiting for the QEMU user");
        server.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn only_the_process_libvirt_started_gets_them() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("vmlet-p1.pid");
        let libvirts = QemuPeer {
            uid: nix::unistd::geteuid().as_raw(),
            pid: QemuPid::InFile(pid_file.clone()),
        };
        let (sockets, server) = tap_server("pid", libvirts);
        // The QEMU uid, before libvirt started anything, then beside another PID.
        assert!(fetch_from(&sockets).await.is_err(), "taken before QEMU ran");
        std::fs::write(&pid_file, "1\n").unwrap();
        assert!(fetch_from(&sockets).await.is_err(), "taken by another PID");
        std::fs::write(&pid_file, format!("{}\n", std::process::id())).unwrap();
        let (got, fds) = fetch_from(&sockets).await.unwrap();
        assert_eq!(got, one_tap());
        // SAFETY: the fd was just received and is owned by nobody else.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) });
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .expect("the server ends after one hand-over")
            .unwrap();
        std::fs::remove_dir_all(&sockets).unwrap();
    }
}
