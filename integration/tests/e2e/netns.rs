//! The netns crate against real network namespaces, veth pairs and tc (root, no VM).
//! Run by `make test`; alone: `scripts/e2e netns`.
//!
//! Traffic stays between two namespaces the test creates ("pod" and "peer", joined by a
//! veth pair on 10.213.0.0/24); nothing is sent from or to the host's own interfaces.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Command;

use std::time::{Duration, Instant};
use vmlet_integration::testnet::{ip, tc, TestNet};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

const POD_IP: [u8; 4] = [10, 213, 0, 2];
const PEER_IP: [u8; 4] = [10, 213, 0, 1];
/// virtio_net_hdr in front of every frame on an IFF_VNET_HDR tap.
const VNET_HDR_LEN: usize = 10;

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP echo request from the pod's address to the peer, as the guest would send it.
fn echo_request(src_mac: [u8; 6], dst_mac: [u8; 6], id: u16) -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0];
    icmp.extend_from_slice(&id.to_be_bytes());
    icmp.extend_from_slice(&1u16.to_be_bytes());
    icmp.extend_from_slice(b"vmlet-netns-test");
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let total = (20 + icmp.len()) as u16;
    let mut ipv4 = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 1, 0, 0];
    ipv4[2..4].copy_from_slice(&total.to_be_bytes());
    ipv4.extend_from_slice(&POD_IP);
    ipv4.extend_from_slice(&PEER_IP);
    let c = checksum(&ipv4);
    ipv4[10..12].copy_from_slice(&c.to_be_bytes());
    let mut frame = vec![0u8; VNET_HDR_LEN];
    frame.extend_from_slice(&dst_mac);
    frame.extend_from_slice(&src_mac);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&ipv4);
    frame.extend_from_slice(&icmp);
    frame
}

/// Reads frames from the tap until an ICMP echo reply with `id` arrives.
fn wait_for_echo_reply(tap: &OwnedFd, id: u16, timeout: Duration) -> bool {
    let mut file = std::fs::File::from(tap.try_clone().unwrap());
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    while Instant::now() < deadline {
        let mut fds = [PollFd::new(tap.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(200u16)).unwrap_or(0) == 0 {
            continue;
        }
        let n = file.read(&mut buf).unwrap();
        let frame = &buf[VNET_HDR_LEN.min(n)..n];
        let is_reply = frame.len() >= 14 + 20 + 8
            && frame[12..14] == [0x08, 0x00]
            && frame[14 + 9] == 1
            && frame[14 + 20] == 0
            && frame[14 + 24..14 + 26] == id.to_be_bytes();
        if is_reply {
            return true;
        }
    }
    false
}

#[test]
#[ignore = "needs root and iproute2: make test"]
fn wires_taps_to_cni_interfaces_and_unwires_them() {
    let net = TestNet::new("wire", 1400);
    let pod_mac = net.mac(&net.pod, "eth0");
    let peer_mac = net.mac(&net.peer, "peer0");

    let wired = vmlet_netns::wire(&net.pod_path(), "wire-test-pod").unwrap();
    assert_eq!(wired.wirings.len(), 1);
    assert_eq!(wired.taps.len(), 1);
    let w = &wired.wirings[0];
    assert_eq!(w.interface.name, "eth0");
    assert_eq!(w.interface.mac, pod_mac);
    assert_eq!(w.interface.mtu, 1400);
    assert_eq!(
        w.interface
            .addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        ["10.213.0.2/24"]
    );
    assert_eq!(w.tap_name, "vmtap0");
    assert_eq!(w.interface.routes.len(), 1, "{:?}", w.interface.routes);
    assert_eq!(w.interface.routes[0].destination, None);
    assert_eq!(
        w.interface.routes[0].gateway,
        Some("10.213.0.1".parse().unwrap())
    );

    let tap_link: serde_json::Value =
        serde_json::from_str(&ip(&["-n", &net.pod, "-j", "link", "show", "vmtap0"])).unwrap();
    assert_eq!(tap_link[0]["mtu"], 1400);
    assert_eq!(
        tap_link[0]["ifalias"], "vmlet:wire-test-pod:eth0",
        "the tap's mark"
    );
    for (dev, to) in [("eth0", "vmtap0"), ("vmtap0", "eth0")] {
        let filters = tc(&net.pod, &["filter", "show", "dev", dev, "ingress"]);
        assert!(
            filters.contains("mirred") && filters.contains(&format!("Redirect to device {to}")),
            "{dev}: {filters}"
        );
    }

    // A frame the guest would send leaves through eth0; the peer's reply comes back to the
    // tap. The peer knows the pod's MAC already: the test does not answer ARP.
    let mac_text = pod_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    ip(&[
        "-n",
        &net.peer,
        "neigh",
        "replace",
        "10.213.0.2",
        "lladdr",
        &mac_text,
        "dev",
        "peer0",
    ]);
    let mut tap = std::fs::File::from(wired.taps[0].try_clone().unwrap());
    tap.write_all(&echo_request(pod_mac, peer_mac, 0x5a5a))
        .unwrap();
    let replied = wait_for_echo_reply(&wired.taps[0], 0x5a5a, Duration::from_secs(5));
    assert!(
        replied,
        "no echo reply reached the tap\npeer: {}\ntap filter: {}\neth0 filter: {}",
        ip(&["-n", &net.peer, "-s", "link", "show", "peer0"]),
        tc(
            &net.pod,
            &["-s", "filter", "show", "dev", "vmtap0", "ingress"]
        ),
        tc(
            &net.pod,
            &["-s", "filter", "show", "dev", "eth0", "ingress"]
        ),
    );

    drop(tap);
    let wirings = wired.wirings.clone();
    drop(wired);
    vmlet_netns::unwire(&net.pod_path(), "wire-test-pod", &wirings).unwrap();
    assert_eq!(net.vmlet_leftovers(), Vec::<String>::new());
    // Unwiring twice finds nothing to do.
    vmlet_netns::unwire(&net.pod_path(), "wire-test-pod", &wirings).unwrap();
}

#[test]
#[ignore = "needs root and iproute2: make test"]
fn a_tap_whose_state_was_lost_is_found_by_its_mark_and_removed_alone() {
    let net = TestNet::new("marks", 1500);
    let wired = vmlet_netns::wire(&net.pod_path(), "lost-pod").unwrap();
    // The wirings are forgotten (as when the pod's state file is gone) while the tap lives
    // on: QEMU holds its fd (a tap nobody holds is gone with its last fd).
    let _held_by_qemu = wired.taps;
    // Not vmlet's: a tap named like vmlet's without the mark, one with another alias.
    ip(&["-n", &net.pod, "tuntap", "add", "vmtap7", "mode", "tap"]);
    ip(&["-n", &net.pod, "tuntap", "add", "other0", "mode", "tap"]);
    ip(&[
        "-n",
        &net.pod,
        "link",
        "set",
        "other0",
        "alias",
        "uplink of something",
    ]);

    let found = vmlet_netns::marked_taps(&net.pod_path()).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let tap = &found[0];
    assert_eq!(
        (tap.name.as_str(), tap.pod_id.as_str(), tap.peer.as_str()),
        ("vmtap0", "lost-pod", "eth0")
    );
    assert_eq!(tap.netns, net.pod_path());

    vmlet_netns::remove_marked_tap(tap).unwrap();
    let links = ip(&["-n", &net.pod, "-brief", "link", "show"]);
    assert!(!links.contains("vmtap0"), "{links}");
    assert!(
        links.contains("vmtap7") && links.contains("other0"),
        "{links}"
    );
    let qdiscs = tc(&net.pod, &["qdisc", "show", "dev", "eth0"]);
    assert!(
        !qdiscs.contains("ingress"),
        "eth0's redirect removed: {qdiscs}"
    );
    assert!(vmlet_netns::marked_taps(&net.pod_path())
        .unwrap()
        .is_empty());
    // Removing it again finds nothing to do.
    vmlet_netns::remove_marked_tap(tap).unwrap();
}

#[test]
#[ignore = "needs root and iproute2: make test"]
fn a_namespace_without_interfaces_is_refused() {
    let name = format!("vmlet-empty-{}", std::process::id() % 100_000);
    ip(&["netns", "add", &name]);
    let result = vmlet_netns::wire(&PathBuf::from("/run/netns").join(&name), "wire-test-pod");
    let _ = Command::new("ip").args(["netns", "del", &name]).status();
    let err = result.unwrap_err().to_string();
    assert!(err.contains("no usable interface"), "{err}");
}

#[test]
#[ignore = "needs root and iproute2: make test"]
fn a_missing_namespace_is_refused() {
    let err = vmlet_netns::wire(
        &PathBuf::from("/run/netns/vmlet-does-not-exist"),
        "wire-test-pod",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot enter network namespace"), "{err}");
}
