//! The libvirt daemon of a connection URI, as the node's processes see it: the PID of the
//! process that holds its local socket (the daemon, or under systemd's socket activation
//! PID 1, which shares the daemon's mounts), and the file where the daemon keeps a
//! domain's QEMU's PID, read through that process's root (`/proc/PID/root`, which sees its
//! mounts) so that a daemon in a mount namespace of its own (a private stack's) is read as
//! it wrote it. A daemon in a PID namespace of its own is refused by name: the PIDs it
//! writes are not the node's. The shim pins the connections it takes for a libvirt
//! domain's QEMU to that PID; `vmletctl check` looks at the daemon's directories.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the daemon's socket may take to take a connection.
const DAEMON_CONNECT: Duration = Duration::from_secs(2);
/// Where a system daemon's QEMU driver keeps each running domain's `NAME.pid`, in the
/// daemon's root (libvirtd's and virtqemud's `stateDir`).
const QEMU_STATE_DIR: &str = "run/libvirt/qemu";
/// The system daemons' sockets, virtqemud's first, where the URI names none.
const SYSTEM_SOCKETS: [&str; 2] = ["/run/libvirt/virtqemud-sock", "/run/libvirt/libvirt-sock"];

/// The PID of the daemon listening on `uri`'s local socket: its `socket=` parameter, or the
/// system daemon's (virtqemud's, or libvirtd's); none where neither is there. A remote URI
/// is an error: its QEMU is not this node's.
pub fn daemon_pid(uri: &str) -> Result<Option<i32>, String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let scheme = uri.split("://").next().unwrap_or_default();
    if scheme
        .split_once('+')
        .is_some_and(|(_, transport)| transport != "unix")
    {
        return Err(format!("{uri} is another host's libvirt"));
    }
    let socket = match uri.split_once("socket=") {
        Some((_, rest)) => PathBuf::from(rest.split('&').next().unwrap_or_default()),
        None => match SYSTEM_SOCKETS
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        {
            Some(socket) => socket,
            None => return Ok(None),
        },
    };
    // On a thread of its own: a daemon whose backlog is full would hold the connect.
    let (tx, rx) = std::sync::mpsc::channel();
    let asked = socket.clone();
    std::thread::spawn(move || {
        let pid = std::os::unix::net::UnixStream::connect(&asked)
            .map_err(|e| e.to_string())
            .and_then(|stream| getsockopt(&stream, PeerCredentials).map_err(|e| e.to_string()))
            .map(|cred| cred.pid());
        let _ = tx.send(pid);
    });
    match rx.recv_timeout(DAEMON_CONNECT) {
        Ok(Ok(pid)) if pid > 0 => Ok(Some(pid)),
        Ok(Ok(pid)) => Err(format!("{} names PID {pid}", socket.display())),
        Ok(Err(e)) => Err(format!("connect {}: {e}", socket.display())),
        Err(_) => Err(format!(
            "{} took no connection within {DAEMON_CONNECT:?}",
            socket.display()
        )),
    }
}

/// The file in which `uri`'s daemon keeps the PID of domain `name`'s QEMU (it writes it
/// before QEMU's program runs), as this process reaches it. Only a system daemon's
/// (`qemu:///system`) is known.
pub fn qemu_pid_file(uri: &str, name: &str) -> Result<PathBuf, crate::Error> {
    pid_file_of(uri, name).map_err(|e| {
        crate::Error::Libvirt(format!(
            "where libvirt keeps the PID of {name}'s QEMU (the shim takes no other process for it): {e}"
        ))
    })
}

fn pid_file_of(uri: &str, name: &str) -> Result<PathBuf, String> {
    let path = uri
        .split_once("://")
        .map(|(_, rest)| rest.split('?').next().unwrap_or_default())
        .unwrap_or_default();
    if path != "/system" {
        return Err(format!(
            "{uri} is not a system libvirt (qemu:///system): where it keeps its QEMUs' PIDs is not known"
        ));
    }
    let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    if !plain {
        return Err(format!("{name:?} is not a domain name"));
    }
    let pid = daemon_pid(uri)?.ok_or_else(|| format!("no libvirt daemon listens for {uri}"))?;
    // The PIDs it writes must be the node's as the shim sees them.
    let namespace = |of: &str| std::fs::read_link(format!("/proc/{of}/ns/pid"));
    match (namespace(&pid.to_string()), namespace("self")) {
        (Ok(its), Ok(ours)) if its == ours => {}
        (Ok(_), Ok(_)) => {
            return Err(format!(
                "libvirt's daemon (PID {pid}) runs in a PID namespace of its own: the PIDs it \
                 writes are not the node's"
            ))
        }
        (Err(e), _) | (_, Err(e)) => return Err(format!("PID namespace of {pid}: {e}")),
    }
    Ok(in_root(&PathBuf::from(format!("/proc/{pid}/root")), name))
}

/// `name`'s PID file beneath a daemon's `root`.
fn in_root(root: &Path, name: &str) -> PathBuf {
    root.join(QEMU_STATE_DIR).join(format!("{name}.pid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libvirts_daemon_is_asked_only_where_it_is_this_nodes() {
        let remote = daemon_pid("qemu+ssh://node-2/system").unwrap_err();
        assert!(remote.contains("another host's"), "{remote}");
        let dir = tempfile::tempdir().unwrap();
        let missing = format!(
            "qemu:///system?socket={}/none&mode=direct",
            dir.path().display()
        );
        let err = daemon_pid(&missing).unwrap_err();
        assert!(err.contains("/none"), "{err}");
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        let uri = format!("qemu+unix:///system?socket={}/sock", dir.path().display());
        assert_eq!(daemon_pid(&uri).unwrap(), Some(std::process::id() as i32));
        drop(listener);
    }

    #[test]
    fn a_domains_pid_file_is_read_in_the_daemons_root() {
        let dir = tempfile::tempdir().unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        let uri = format!("qemu:///system?socket={}/sock", dir.path().display());
        assert_eq!(
            pid_file_of(&uri, "vmlet-p1").unwrap(),
            PathBuf::from(format!(
                "/proc/{}/root/run/libvirt/qemu/vmlet-p1.pid",
                std::process::id()
            ))
        );
        let session = format!("qemu:///session?socket={}/sock", dir.path().display());
        let err = pid_file_of(&session, "vmlet-p1").unwrap_err();
        assert!(err.contains("not a system libvirt"), "{err}");
        let err = pid_file_of(&uri, "../x").unwrap_err();
        assert!(err.contains("not a domain name"), "{err}");
        let gone = format!("qemu:///system?socket={}/none", dir.path().display());
        assert!(pid_file_of(&gone, "vmlet-p1")
            .unwrap_err()
            .contains("/none"));
    }
}
