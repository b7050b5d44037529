//! The pod network reaches the VM: a container started with `ctr run --with-ns
//! network:<pod netns>` (the namespace set up as CNI's bridge plugin would) gets the pod's
//! address, MTU and default route, reaches its gateway, and serves TCP to the peer. A pod
//! with a second network has each of its NICs under its pod interface's name.
//! Run by `make test` (needs the stack and root).

use std::process::Command;

use vmlet_integration::bounded::{output_within, COMMAND_TIMEOUT};
use vmlet_integration::testnet::{
    tcp_exchange_when_up, TestNet, PEER_ADDR, SECOND_PEER_ADDR, SECOND_POD_CIDR,
};
use vmlet_integration::{unique_id, Stack};

/// Runs pod `id` in `net` (which has a second network): the guest's `eth0` and `net1` must
/// carry the MACs of the pod namespace's `eth0` and `net1`, each with its address, and each
/// must reach its peer.
pub(crate) fn run_pod_on_two_networks(s: &Stack, net: &TestNet, id: &str) {
    let script = format!(
        "cat /sys/class/net/eth0/address /sys/class/net/net1/address; \
         for d in eth0 net1; do echo \"addresses of $d: $(ip -4 -o addr show dev $d)\"; done; \
         ping -c 1 -W 5 {PEER_ADDR} >/dev/null && echo ETH0-OK; \
         ping -c 1 -W 5 {SECOND_PEER_ADDR} >/dev/null && echo NET1-OK"
    );
    let with_ns = format!("network:{}", net.pod_path().display());
    let out = s
        .run(id, &["--with-ns", &with_ns], &["sh", "-c", &script])
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ctr run: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mac = |dev| vmlet_netns::format_mac(&net.mac(&net.pod, dev));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..2], [mac("eth0"), mac("net1")], "{stdout}");
    for (dev, cidr) in [("eth0", "10.213.0.2/24"), ("net1", SECOND_POD_CIDR)] {
        let addresses = format!("addresses of {dev}: ");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&addresses) && l.contains(cidr)),
            "{dev} has no {cidr}:\n{stdout}"
        );
    }
    for expected in ["ETH0-OK", "NET1-OK"] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    assert_eq!(net.vmlet_leftovers(), Vec::<String>::new());
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn container_gets_the_pod_network() {
    let s = Stack::from_env().expect("the vmlet stack");
    let net = TestNet::new("ctr", 1400);
    let id = unique_id("net");
    let script = format!(
        "ip addr; ip route; cat /sys/class/net/eth0/mtu; \
         ping -c 1 -W 5 {PEER_ADDR} >/dev/null && echo PING-OK; \
         echo from-pod | nc -l -p 8080"
    );
    let with_ns = format!("network:{}", net.pod_path().display());
    let child = s
        .spawn_run(&id, &["--with-ns", &with_ns], &["sh", "-c", &script])
        .unwrap();

    let reply = tcp_exchange_when_up(&net.peer, "10.213.0.2", 8080, "from-peer\n");
    let out = output_within(child, COMMAND_TIMEOUT, "ctr run").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ctr run: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(reply.contains("from-pod"), "peer got {reply:?}");
    for expected in [
        "10.213.0.2/24",
        "default via 10.213.0.1",
        "1400",
        "PING-OK",
        "from-peer",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    assert_eq!(net.vmlet_leftovers(), Vec::<String>::new());
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn a_pod_with_two_networks_has_each_nic_under_its_pod_interfaces_name() {
    let s = Stack::from_env().expect("the vmlet stack");
    let net = TestNet::new("two", 1500);
    net.add_second_network();
    run_pod_on_two_networks(&s, &net, &unique_id("two-nets"));
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn a_pod_namespace_without_interfaces_fails_clearly() {
    let s = Stack::from_env().expect("the vmlet stack");
    let name = format!("vmlet-empty-ctr-{}", std::process::id() % 100_000);
    vmlet_integration::testnet::ip(&["netns", "add", &name]);
    let id = unique_id("nonet");
    let out = s
        .run(
            &id,
            &["--with-ns", &format!("network:/run/netns/{name}")],
            &["true"],
        )
        .unwrap();
    let _ = Command::new("ip").args(["netns", "del", &name]).status();
    let _ = s.ctr_output(&["container", "rm", &id]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no usable interface"), "{stderr}");
    assert!(
        !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
        "state left behind"
    );
}
