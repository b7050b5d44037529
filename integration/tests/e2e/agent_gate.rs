//! Nobody but the pod's own shim reaches its agent. Attack tests, through the transport the
//! stack uses (vhost-device-vsock's socket; kernel vhost-vsock runs the same handshake, which
//! the shim's and the agent's unit tests cover): root without the VM's key connects to the
//! agent's ttrpc, stream and port-forward ports and gets nothing but the agent's challenge,
//! whatever it sends; a user who is not root cannot connect at all; a flood of connections
//! that never prove the key does not keep the shim out. Run by `make test`.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{stack, text};
use vmlet_integration::unique_id;
use vmlet_protocol::auth::{Auth, HELLO_LEN};
use vmlet_protocol::{AGENT_PORT, FORWARD_PORT, STREAM_PORT};

/// What the pod's guest serves on its loopback: a port-forward that got through would
/// carry it back.
const CANARY: &str = "gate-canary-served-on-the-guests-loopback";

/// Connects to guest `port` through vhost-device-vsock's socket as the shim would, but
/// without the key: the `CONNECT` and its `OK`, then `request`; returns every byte the
/// guest sent after the `OK` until it closed (at most 4 KiB, within 15 s).
fn attack(uds: &Path, port: u32, request: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(uds).expect("root reaches the socket");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut ok = Vec::new();
    let mut byte = [0u8; 1];
    while !ok.ends_with(b"\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "vhost-device-vsock closed");
        ok.push(byte[0]);
        assert!(ok.len() < 64, "CONNECT reply {ok:?}");
    }
    assert!(ok.starts_with(b"OK "), "CONNECT {port}: {}", text(&ok));
    let _ = s.write_all(request);
    let mut got = Vec::new();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "port {port}: the agent neither answered nor closed within {:?}: {e} (got {})",
                started.elapsed(),
                text(&got)
            ),
        }
        assert!(got.len() <= 4096, "port {port}: {}", text(&got));
    }
    got
}

/// The agent's challenge alone: `VMLET1 <nonce>\n`.
fn only_the_challenge(port: u32, got: &[u8]) {
    assert!(
        got.len() == HELLO_LEN && got.starts_with(b"VMLET1 "),
        "port {port}: the agent sent more than its challenge: {}",
        text(got)
    );
}

fn mode_and_owner(path: &Path) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.permissions().mode() & 0o7777, meta.uid())
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn only_the_pods_shim_reaches_its_agent() {
    let s = stack();
    let id = unique_id("gate");
    let script = format!(
        "mkdir -p /www && echo {CANARY} >/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /www"
    );
    s.run_detached(&id, &["sh", "-c", &script]).unwrap();
    let listening = "until netstat -ltn | grep -q '127.0.0.1:8080 '; do sleep 0.2; done";
    let out = s
        .ctr_output(&["task", "exec", "--exec-id", "l", &id, "sh", "-c", listening])
        .unwrap();
    assert!(out.status.success(), "httpd: {}", text(&out.stderr));

    let pod_dir = Path::new(&s.dir).join("state").join(&id);
    let uds = pod_dir.join("vsock.sock");
    the_pods_sockets_are_roots_or_qemus(&pod_dir);
    root_without_the_key_gets_only_the_challenge(&uds, &id);
    nobody_reaches_the_socket(&uds);

    // The agent logged each refusal, and the pod's own shim still gets through.
    let console = std::fs::read_to_string(pod_dir.join("log/console.log")).unwrap();
    let refused = console.matches("refused a connection").count();
    assert!(refused >= 6, "{refused} refusals logged:\n{console}");
    let out = s
        .ctr_output(&[
            "task",
            "exec",
            "--exec-id",
            "after",
            &id,
            "cat",
            "/www/index.html",
        ])
        .unwrap();
    assert!(out.status.success(), "exec: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), CANARY);
    s.kill_and_remove(&id).unwrap();
    assert!(!pod_dir.exists(), "the pod's state is left");
}

/// Connects to guest `port` through the vsock backend's socket `uds` without the key and
/// holds the connection (none: the backend or the guest refused it).
fn unproven(uds: &Path, port: u32) -> Option<UnixStream> {
    let mut s = UnixStream::connect(uds).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("CONNECT {port}\n").as_bytes()).ok()?;
    let mut ok = [0u8; 3];
    s.read_exact(&mut ok).ok()?;
    (&ok == b"OK ").then_some(s)
}

/// Connections that never prove the key: 1,000 held open on the agent's ttrpc and stream
/// ports, and more opened all the while (the oldest let go), cannot keep the pod's shim out:
/// its execs get through, and the agent holds no more of the flood than its slots.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_flood_of_unproven_connections_does_not_keep_the_shim_out() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let s = stack();
    let id = unique_id("flood");
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    let uds = crate::direct_pods::pod_dir(&s, &id).join("vsock.sock");
    let mut held = std::collections::VecDeque::new();
    for i in 0..1000 {
        let port = if i % 2 == 0 { AGENT_PORT } else { STREAM_PORT };
        held.extend(unproven(&uds, port));
    }
    eprintln!("{} of 1,000 connections held", held.len());
    let (stop, opened) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    // Two flooders side by side, each keeping its last 500 open.
    let second = held.split_off(held.len() / 2);
    let flood: Vec<_> = [held, second]
        .into_iter()
        .map(|mut held| {
            let (uds, stop, opened) = (uds.clone(), stop.clone(), opened.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for port in [AGENT_PORT, STREAM_PORT] {
                        held.extend(unproven(&uds, port));
                        opened.fetch_add(1, Ordering::Relaxed);
                    }
                    while held.len() > 500 {
                        held.pop_front();
                    }
                }
            })
        })
        .collect();
    for n in 0..5 {
        let exec_id = format!("during-{n}");
        let out = s
            .ctr_output(&[
                "task",
                "exec",
                "--exec-id",
                &exec_id,
                &id,
                "echo",
                "through",
            ])
            .unwrap();
        assert!(
            out.status.success() && text(&out.stdout).trim() == "through",
            "exec {n} during the flood: {}",
            text(&out.stderr)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for flooder in flood {
        flooder.join().unwrap();
    }
    assert!(
        opened.load(Ordering::Relaxed) > 100,
        "the flood went on during the execs"
    );
    // The refusals were logged by count, not each.
    let console = std::fs::read_to_string(
        Path::new(&s.dir)
            .join("state")
            .join(&id)
            .join("log/console.log"),
    )
    .unwrap();
    let logged = console.matches("refused a connection").count();
    assert!((16..200).contains(&logged), "{logged} refusals logged");
    // The agent held no more of the flood than its slots: newer connections took them.
    assert!(
        console.contains("newer connections took the handshake slots"),
        "no handshake was ended for a newer one:\n{console}"
    );
    s.kill_and_remove(&id).unwrap();
}

/// Every socket of the pod has its mode set, not the umask's: the shim's own 0600 root,
/// QEMU's 0600 QEMU's user, its figures' 0660 root's and the metrics group's (in the
/// metrics directory beside the pods'); the key's file is gone once QEMU read it.
fn the_pods_sockets_are_roots_or_qemus(pod_dir: &Path) {
    let uds = pod_dir.join("vsock.sock");
    let qemu_uid = std::fs::symlink_metadata(pod_dir.join("qmp.sock"))
        .unwrap()
        .uid();
    assert_ne!(qemu_uid, 0, "qmp.sock is QEMU's user's");
    assert_eq!(mode_and_owner(&uds), (0o600, 0), "vsock.sock");
    let pod_id = pod_dir.file_name().unwrap().to_string_lossy();
    let figures = pod_dir
        .parent()
        .unwrap()
        .join(format!(".metrics/{pod_id}.sock"));
    assert_eq!(
        mode_and_owner(&figures),
        (0o660, 0),
        "{}",
        figures.display()
    );
    assert!(!pod_dir.join("metrics.sock").exists());
    // (vhost-device-vsock removes its vhost-user socket once QEMU has connected it.)
    assert_eq!(
        mode_and_owner(&pod_dir.join("qmp.sock")),
        (0o600, qemu_uid),
        "qmp.sock"
    );
    assert!(
        !pod_dir.join("agent.key").exists(),
        "the key's file is gone once QEMU read it"
    );
}

/// Root without the key, each port with what its service would take, sent at once: the
/// agent sends its challenge and nothing else.
fn root_without_the_key_gets_only_the_challenge(uds: &Path, id: &str) {
    let attacks: Vec<(u32, Vec<u8>)> = vec![
        (FORWARD_PORT, b"FORWARD 8080\n".to_vec()),
        (STREAM_PORT, format!("STREAM {id} - stdout\n").into_bytes()),
        (STREAM_PORT, format!("STREAM {id} - stdin\n").into_bytes()),
        // A ttrpc frame: a request for Ping.
        (AGENT_PORT, ttrpc_ping_frame()),
        // A well-formed proof under another key.
        (
            FORWARD_PORT,
            Auth {
                nonce: [7; 16],
                proof: [9; 32],
            }
            .to_line()
            .into_bytes(),
        ),
        // Nothing at all: closed at the agent's deadline.
        (AGENT_PORT, Vec::new()),
    ];
    let threads: Vec<_> = attacks
        .into_iter()
        .map(|(port, request)| {
            let uds = uds.to_owned();
            std::thread::spawn(move || (port, attack(&uds, port, &request)))
        })
        .collect();
    for thread in threads {
        let (port, got) = thread.join().unwrap();
        only_the_challenge(port, &got);
        assert!(!text(&got).contains(CANARY));
    }
}

/// A user who is not root does not reach the socket at all.
pub(crate) fn nobody_reaches_the_socket(uds: &Path) {
    user_cannot_reach_the_socket("nobody", "nogroup", uds);
}

/// A process of `uid` and `gid` (names or numbers), without other groups, cannot connect
/// to `uds`.
pub(crate) fn user_cannot_reach_the_socket(uid: &str, gid: &str, uds: &Path) {
    let out = as_user(uid, gid)
        .args(["socat", "-u", "OPEN:/dev/null"])
        .arg(format!("UNIX-CONNECT:{}", uds.display()))
        .output()
        .expect("setpriv and socat (scripts/install-deps)");
    assert!(
        !out.status.success(),
        "{uid} connected to {}",
        uds.display()
    );
    assert!(
        text(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out.stderr)
    );
}

/// `setpriv` running what follows as `uid` and `gid` (names or numbers), without other
/// groups.
pub(crate) fn as_user(uid: &str, gid: &str) -> std::process::Command {
    let mut command = std::process::Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups");
    command
}

/// A process of `uid` and `gid`, without other groups, cannot read `path`.
pub(crate) fn user_cannot_read(uid: &str, gid: &str, path: &Path) {
    let out = as_user(uid, gid)
        .arg("cat")
        .arg(path)
        .output()
        .expect("setpriv (util-linux)");
    assert!(!out.status.success(), "{uid} read {}", path.display());
}

/// A ttrpc request frame (10-byte header, then the `Request` message) for the agent's
/// Ping, as a ttrpc client writes it first on a new connection.
fn ttrpc_ping_frame() -> Vec<u8> {
    let service = b"vmlet.agent.v1.Agent";
    let method = b"Ping";
    // Request { service = 1, method = 2, payload = 3 (empty) }
    let mut body = vec![0x0a, service.len() as u8];
    body.extend_from_slice(service);
    body.extend_from_slice(&[0x12, method.len() as u8]);
    body.extend_from_slice(method);
    body.extend_from_slice(&[0x1a, 0]);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&1u32.to_be_bytes()); // stream id
    frame.extend_from_slice(&[1, 0]); // a request, no flags
    frame.extend_from_slice(&body);
    frame
}
