//! What the guest must know of a CNI interface.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// An address with its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A route CNI set up through an interface (IPv4 main table, not the kernel's own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// `None` for the default route.
    pub destination: Option<IpNet>,
    pub gateway: Option<IpAddr>,
}

/// A network interface in the pod's namespace, as CNI left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addresses: Vec<IpNet>,
    pub routes: Vec<Route>,
}

impl Interface {
    /// The MAC as QEMU and the guest write it (`aa:bb:cc:dd:ee:ff`).
    pub fn mac_string(&self) -> String {
        format_mac(&self.mac)
    }
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Whether an interface is one the VM should get: not loopback, not one of vmlet's taps,
/// and with an Ethernet address.
pub fn is_pod_interface(name: &str, loopback: bool, mac: Option<&[u8]>) -> bool {
    !loopback && !name.starts_with(crate::TAP_PREFIX) && mac.is_some_and(|m| m.len() == 6)
}

/// IPv6 link-local (`fe80::/10`).
pub fn is_link_local(addr: &IpAddr) -> bool {
    matches!(addr, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_is_recognised() {
        assert!(is_link_local(&"fe80::1".parse().unwrap()));
        assert!(!is_link_local(&"fd00::1".parse().unwrap()));
        assert!(!is_link_local(&"10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn mac_is_lower_hex_with_colons() {
        assert_eq!(
            format_mac(&[0x0a, 0x58, 0xff, 0, 1, 0x2b]),
            "0a:58:ff:00:01:2b"
        );
    }

    #[test]
    fn loopback_and_own_taps_are_not_pod_interfaces() {
        let mac = [1u8, 2, 3, 4, 5, 6];
        assert!(is_pod_interface("eth0", false, Some(&mac)));
        assert!(!is_pod_interface("lo", true, Some(&[0; 6])));
        assert!(!is_pod_interface("vmtap0", false, Some(&mac)));
        assert!(!is_pod_interface("tun0", false, None));
    }

    #[test]
    fn ipnet_display() {
        let net = IpNet {
            addr: "10.88.0.5".parse().unwrap(),
            prefix: 16,
        };
        assert_eq!(net.to_string(), "10.88.0.5/16");
    }
}
