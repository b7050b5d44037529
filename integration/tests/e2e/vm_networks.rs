//! End to end: a VM-mode CRI pod with two networks (docs/vm-mode.md). A second interface
//! in the pod's network namespace, as a second CNI network (Multus) adds one, gets a tap
//! and a NIC with its MAC; the seed's network-config gives the guest both addresses, and
//! the guest answers on each, and through `crictl port-forward` (which reaches the guest's
//! pod address). Run by `make test`.

use crate::support::stack;
use crate::vm_mode::{marker_in, vm_image, vm_pod};
use vmlet_integration::testnet::{
    ip, tcp_exchange, tcp_exchange_when_up, CrictlForward, SECOND_PEER_ADDR, SECOND_POD_CIDR,
};

/// The guest serves its host name on port 8080 and prints its interfaces' addresses.
const USER_DATA: &str = r#"runcmd:
  - mkdir -p /srv/www && hostname > /srv/www/name
  - systemd-run --unit vmlet-www python3 -m http.server 8080 --directory /srv/www
  - echo "vmlet-marker $(hostname) $(ip -4 -o addr show | awk '$2 != "lo" {print $2"="$4}' | sort | tr '\n' ' ')"
"#;

/// A namespace of the test's holding the second network's far end; removed on drop.
struct Peer(String);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_vm_pod_with_two_networks_answers_on_both_and_through_port_forward() {
    let s = stack();
    let node = std::env::var("VMLET_NODE_NETNS").expect("VMLET_NODE_NETNS (the stack's)");
    let mut p = vm_pod(&s, USER_DATA, &[]).await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let pod_ip = p.cri.pod_ip(&p.pod).await.unwrap();
    // The second network: `net1` in the pod's namespace, its peer in one of the test's.
    let netns = p.cri.pod_netns(&p.pod).await.unwrap();
    let peer = Peer(format!("vmlet-vmnet-{}", std::process::id() % 100_000));
    ip(&["netns", "add", &peer.0]);
    let in_pod = |args: &[&str]| {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .arg("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?} in the pod: {out:?}");
    };
    in_pod(&[
        "link", "add", "net1", "type", "veth", "peer", "name", "peer1", "netns", &peer.0,
    ]);
    in_pod(&["addr", "add", SECOND_POD_CIDR, "dev", "net1"]);
    in_pod(&["link", "set", "net1", "up"]);
    ip(&["-n", &peer.0, "link", "set", "peer1", "up"]);
    let peer_cidr = format!("{SECOND_PEER_ADDR}/24");
    ip(&["-n", &peer.0, "addr", "add", &peer_cidr, "dev", "peer1"]);

    let c = p.container("vm", &vm_image(), &[], 0).await;
    let marker = marker_in(&p.logs.join("vm.log"), &name, "v2").await;
    let second = SECOND_POD_CIDR.split('/').next().unwrap().to_owned();
    let answers = {
        let (node, peer, pod_ip, second) = (node.clone(), peer.0.clone(), pod_ip.clone(), second);
        tokio::task::spawn_blocking(move || {
            let get = "GET /name HTTP/1.0\r\n\r\n";
            [
                tcp_exchange_when_up(&node, &pod_ip, 8080, get),
                tcp_exchange_when_up(&peer, &second, 8080, get),
            ]
        })
        .await
        .unwrap()
    };
    // containerd dials localhost:PORT in the pod's namespace; the shim carries it to the
    // guest. A port nothing in the guest listens on closes the client's connection.
    let forwarded = {
        let (node, containerd, pod) = (node.clone(), s.containerd.clone(), p.pod.clone());
        tokio::task::spawn_blocking(move || {
            let crictl =
                CrictlForward::start(&node, &containerd, &pod, &["18090:8080", "18091:8081"]);
            let get = "GET /name HTTP/1.0\r\n\r\n";
            let pages: Vec<_> = (0..3)
                .map(|_| tcp_exchange(&node, "127.0.0.1", 18090, get))
                .collect();
            let nothing = tcp_exchange(&node, "127.0.0.1", 18091, get);
            (crictl.first_line.clone(), pages, nothing)
        })
        .await
        .unwrap()
    };
    p.finish(&[&c]).await;
    assert!(
        marker.contains(&format!("eth0={pod_ip}/"))
            && marker.contains(&format!("net1={SECOND_POD_CIDR}")),
        "the guest's addresses: {marker}"
    );
    for answer in answers {
        assert!(
            answer.contains("200 OK") && answer.trim_end().ends_with(&name),
            "{answer:?}"
        );
    }
    let (first, pages, nothing) = forwarded;
    assert!(first.contains("Forwarding from"), "crictl said {first:?}");
    for page in pages {
        assert!(
            page.as_deref()
                .is_some_and(|p| p.contains("200 OK") && p.trim_end().ends_with(&name)),
            "through the forward: {page:?}"
        );
    }
    assert_eq!(nothing, None, "a port nothing listens on answered");
}
