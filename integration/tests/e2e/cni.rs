//! Pod networking with the real CNI plugins (`bridge` + `host-local` from Debian's
//! containernetworking-plugins), invoked as a container runtime invokes them. They run inside
//! a "node" network namespace the test creates, so the bridge, its gateway address and all
//! traffic stay in namespaces of the test. Pods are started with `ctr run --with-ns
//! network:<pod netns>`. Run by `make test` (needs the stack and root).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use vmlet_integration::bounded::{output_within, COMMAND_TIMEOUT};
use vmlet_integration::testnet::{ip, tcp_exchange_when_up};
use vmlet_integration::{unique_id, Stack, RUNTIME};

const CNI_PATH: &str = "/usr/lib/cni";
const GATEWAY: &str = "10.214.0.1";

/// The node namespace, the CNI network config and host-local's data dir.
pub(crate) struct Node {
    pub(crate) ns: String,
    data_dir: PathBuf,
}

impl Node {
    pub(crate) fn new() -> Self {
        let id = std::process::id() % 100_000;
        let node = Node {
            ns: format!("vmlet-node-{id}"),
            data_dir: std::env::temp_dir().join(format!("vmlet-cni-{id}")),
        };
        ip(&["netns", "add", &node.ns]);
        ip(&["-n", &node.ns, "link", "set", "lo", "up"]);
        node
    }

    fn config(&self) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "vmlet-test",
            "type": "bridge",
            "bridge": "vmletbr0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.214.0.0/24", "gateway": GATEWAY}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.data_dir,
            }
        })
        .to_string()
    }

    /// Runs the bridge plugin for `command` (ADD/DEL) on `netns`; returns its stdout.
    pub(crate) fn cni(
        &self,
        command: &str,
        container: &str,
        netns: &Path,
    ) -> Result<String, String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns, &format!("{CNI_PATH}/bridge")])
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", CNI_PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the CNI bridge plugin");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(self.config().as_bytes())
            .unwrap();
        let out = output_within(child, COMMAND_TIMEOUT, "the CNI bridge plugin").unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "CNI {command}: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A pod network namespace with CNI ADD done; CNI DEL and removal on drop.
pub(crate) struct Pod<'a> {
    node: &'a Node,
    pub(crate) name: String,
    pub(crate) ip: String,
}

impl<'a> Pod<'a> {
    pub(crate) fn new(node: &'a Node, tag: &str) -> Self {
        let name = format!("vmlet-cni-{tag}-{}", std::process::id() % 100_000);
        ip(&["netns", "add", &name]);
        let result = node
            .cni("ADD", &name, &Self::path_of(&name))
            .expect("CNI ADD");
        let json: serde_json::Value = serde_json::from_str(&result).unwrap();
        let address = json["ips"][0]["address"]
            .as_str()
            .expect("CNI result has an IP")
            .to_owned();
        let ip = address.split('/').next().unwrap().to_owned();
        Pod { node, name, ip }
    }

    fn path_of(name: &str) -> PathBuf {
        PathBuf::from("/run/netns").join(name)
    }

    pub(crate) fn path(&self) -> PathBuf {
        Self::path_of(&self.name)
    }

    /// Everything vmlet adds in the pod namespace that is still there.
    pub(crate) fn vmlet_leftovers(&self) -> String {
        let links = ip(&["-n", &self.name, "link", "show"]);
        let qdiscs = ip(&[
            "netns", "exec", &self.name, "tc", "qdisc", "show", "dev", "eth0",
        ]);
        let mut left = String::new();
        if links.contains("vmtap") {
            left.push_str(&links);
        }
        if qdiscs.contains("ingress") {
            left.push_str(&qdiscs);
        }
        left
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let _ = self.node.cni("DEL", &self.name, &self.path());
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs pod `id` (`ctr run`) in `pod`'s namespace: it pings the gateway and `peer_ip`, then
/// serves one TCP exchange with the node; asserts that each worked.
pub(crate) fn run_pod_reaching_gateway_and_peer(
    s: &Stack,
    node: &Node,
    pod: &Pod,
    id: &str,
    peer_ip: &str,
) {
    let script = format!(
        "ip addr; ping -c 1 -W 5 {GATEWAY} >/dev/null && echo GATEWAY-OK; \
         ping -c 1 -W 5 {peer_ip} >/dev/null && echo PEER-POD-OK; echo from-pod | nc -l -p 8080"
    );
    let with_ns = format!("network:{}", pod.path().display());
    let run = s
        .spawn_run(id, &["--with-ns", &with_ns], &["sh", "-c", &script])
        .unwrap();
    let reply = tcp_exchange_when_up(&node.ns, &pod.ip, 8080, "from-host\n");
    let out = output_within(run, COMMAND_TIMEOUT, "ctr run").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(reply.contains("from-pod"), "host got {reply:?}");
    for expected in [pod.ip.as_str(), "GATEWAY-OK", "PEER-POD-OK", "from-host"] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn pods_on_a_cni_bridge_reach_host_gateway_and_each_other() {
    let s = Stack::from_env().expect("the vmlet stack");
    let node = Node::new();
    let a = Pod::new(&node, "a");
    let b = Pod::new(&node, "b");

    // Pod B just runs; pod A checks the gateway and B, then serves one TCP exchange.
    let b_id = unique_id("cni-b");
    let run_b = s
        .ctr_output(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            "--with-ns",
            &format!("network:{}", b.path().display()),
            &s.image,
            &b_id,
            "sleep",
            "1000",
        ])
        .unwrap();
    assert!(
        run_b.status.success(),
        "{}",
        String::from_utf8_lossy(&run_b.stderr)
    );
    s.wait_status(&b_id, "RUNNING", Duration::from_secs(90))
        .unwrap();

    run_pod_reaching_gateway_and_peer(&s, &node, &a, &unique_id("cni-a"), &b.ip);

    s.kill_and_remove(&b_id).unwrap();
    assert_eq!(a.vmlet_leftovers(), "");
    assert_eq!(b.vmlet_leftovers(), "");
    for pod in [&a, &b] {
        node.cni("DEL", &pod.name, &pod.path())
            .expect("CNI DEL after the pod is gone");
    }
}
