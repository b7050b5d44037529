//! Test networks: two network namespaces the test creates ("pod", as CNI would leave it,
//! and "peer"), joined by a veth pair on 10.213.0.0/24. Traffic stays between them.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The pod side's address.
pub const POD_CIDR: &str = "10.213.0.2/24";
/// The peer's address (the pod's gateway).
pub const PEER_ADDR: &str = "10.213.0.1";
/// The pod's address on its second network ([`TestNet::add_second_network`]).
pub const SECOND_POD_CIDR: &str = "10.214.0.2/24";
/// The peer's address on the second network.
pub const SECOND_PEER_ADDR: &str = "10.214.0.1";

/// Runs `ip ARGS`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tc ARGS` inside namespace `ns`.
pub fn tc(ns: &str, args: &[&str]) -> String {
    let mut all = vec!["netns", "exec", ns, "tc"];
    all.extend_from_slice(args);
    ip(&all)
}

/// One TCP exchange from namespace `ns` with `addr:port` (busybox nc): sends `message`,
/// returns what came back, or `None` while nothing listens there yet.
pub fn tcp_exchange(ns: &str, addr: &str, port: u16, message: &str) -> Option<String> {
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "busybox",
            "nc",
            "-w",
            "3",
            addr,
            &port.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run busybox nc in a test namespace");
    // nc ends at once when nothing listens yet: its stdin is then a broken pipe.
    let sent = child.stdin.take().unwrap().write_all(message.as_bytes());
    let out = crate::bounded::output_within(child, crate::bounded::COMMAND_TIMEOUT, "busybox nc")
        .unwrap();
    if let Err(e) = sent {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "write to busybox nc: {e}"
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (!text.is_empty()).then_some(text)
}

/// Retries [`tcp_exchange`] until a server answers (a VM is booting); panics after 90 s.
pub fn tcp_exchange_when_up(ns: &str, addr: &str, port: u16, message: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(reply) = tcp_exchange(ns, addr, port, message) {
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "nothing accepted a connection on {addr}:{port}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `crictl port-forward POD LOCAL:REMOTE...` run in the node namespace `node`, where
/// containerd's CRI streaming server is; ended on drop.
pub struct CrictlForward {
    child: std::process::Child,
    /// Kept open: crictl prints a line per port, and a closed pipe would end it.
    _lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    /// crictl's first line ("Forwarding from 127.0.0.1:LOCAL -> REMOTE").
    pub first_line: String,
}

impl CrictlForward {
    /// Starts forwarding and waits for crictl's first line.
    pub fn start(node: &str, containerd: &str, pod: &str, ports: &[&str]) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new("ip")
            .args(["netns", "exec", node, "crictl", "--runtime-endpoint"])
            .arg(format!("unix://{containerd}"))
            .arg("port-forward")
            .arg(pod)
            .args(ports)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run crictl (scripts/install-deps builds it)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first_line = lines.next().and_then(Result::ok).unwrap_or_default();
        CrictlForward {
            child,
            _lines: lines,
            first_line,
        }
    }
}

impl Drop for CrictlForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The two namespaces; removed on drop.
pub struct TestNet {
    pub pod: String,
    pub peer: String,
}

impl TestNet {
    /// `eth0` (pod) and `peer0` (peer) with `mtu`, addresses, and a default route in the
    /// pod via the peer, as the bridge plugin would set up.
    pub fn new(tag: &str, mtu: u32) -> Self {
        let id = std::process::id() % 100_000;
        let net = TestNet {
            pod: format!("vmlet-{tag}-pod-{id}"),
            peer: format!("vmlet-{tag}-peer-{id}"),
        };
        ip(&["netns", "add", &net.pod]);
        ip(&["netns", "add", &net.peer]);
        ip(&[
            "-n", &net.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
            "netns", &net.peer,
        ]);
        let mtu = mtu.to_string();
        ip(&["-n", &net.pod, "link", "set", "eth0", "mtu", &mtu, "up"]);
        ip(&["-n", &net.pod, "link", "set", "lo", "up"]);
        ip(&["-n", &net.pod, "addr", "add", POD_CIDR, "dev", "eth0"]);
        ip(&["-n", &net.pod, "route", "add", "default", "via", PEER_ADDR]);
        ip(&["-n", &net.peer, "link", "set", "peer0", "mtu", &mtu, "up"]);
        ip(&["-n", &net.peer, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &net.peer,
            "addr",
            "add",
            "10.213.0.1/24",
            "dev",
            "peer0",
        ]);
        net
    }

    /// A second network, as a second CNI network (Multus) adds it: `net1` in the pod (after
    /// `eth0`, on another subnet, no route beyond it) and `peer1` in the peer.
    pub fn add_second_network(&self) {
        ip(&[
            "-n", &self.pod, "link", "add", "net1", "type", "veth", "peer", "name", "peer1",
            "netns", &self.peer,
        ]);
        ip(&["-n", &self.pod, "link", "set", "net1", "up"]);
        ip(&[
            "-n",
            &self.pod,
            "addr",
            "add",
            SECOND_POD_CIDR,
            "dev",
            "net1",
        ]);
        ip(&["-n", &self.peer, "link", "set", "peer1", "up"]);
        let peer_cidr = format!("{SECOND_PEER_ADDR}/24");
        ip(&["-n", &self.peer, "addr", "add", &peer_cidr, "dev", "peer1"]);
    }

    pub fn pod_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.pod)
    }

    /// The MAC of `dev` in namespace `ns`.
    pub fn mac(&self, ns: &str, dev: &str) -> [u8; 6] {
        let json: serde_json::Value =
            serde_json::from_str(&ip(&["-n", ns, "-j", "link", "show", dev])).unwrap();
        let text = json[0]["address"].as_str().unwrap().to_owned();
        let bytes: Vec<u8> = text
            .split(':')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        bytes.try_into().unwrap()
    }

    /// Whether anything vmlet adds (taps, ingress qdiscs) is left in the pod namespace.
    pub fn vmlet_leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let links = ip(&["-n", &self.pod, "link", "show"]);
        if links.contains("vmtap") {
            left.push(format!("taps: {links}"));
        }
        for dev in ["eth0", "net1"] {
            if !links.contains(&format!(" {dev}@")) {
                continue;
            }
            let qdiscs = tc(&self.pod, &["qdisc", "show", "dev", dev]);
            if qdiscs.contains("ingress") {
                left.push(format!("qdiscs of {dev}: {qdiscs}"));
            }
        }
        left
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for ns in [&self.pod, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
