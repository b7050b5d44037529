//! The DHCPv4 answers of a VM-mode pod's responder (RFC 2131, options from RFC 2132 and
//! RFC 3442), as whole Ethernet frames: [`Responder::answer`] reads a frame the guest sent
//! on its tap and returns the frame to send back, if any. It answers only its VM's MAC,
//! and only with the address, routes, MTU and DNS that CNI gave the pod interface, for
//! images that ignore cloud-init's network-config (the seeds' tapmanager does the same).
//!
//! Everything here is pure: the frame is the guest's, so it is parsed with bounds and
//! nothing in it is trusted beyond choosing which answer to send.

use std::net::Ipv4Addr;

use crate::{Interface, IpNet};

/// UDP ports of DHCP.
pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
/// The largest frame looked at (a DHCP message in one standard Ethernet frame).
pub const MAX_FRAME: usize = 1514;

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
const UDP_HEADER: usize = 8;
/// The fixed part of a DHCP message, up to and with the magic cookie.
const BOOTP_FIXED: usize = 240;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

/// Message types (option 53).
const DISCOVER: u8 = 1;
const OFFER: u8 = 2;
const REQUEST: u8 = 3;
const ACK: u8 = 5;
const NAK: u8 = 6;
const INFORM: u8 = 8;

/// Options.
const OPT_PAD: u8 = 0;
const OPT_SUBNET_MASK: u8 = 1;
const OPT_ROUTER: u8 = 3;
const OPT_DNS: u8 = 6;
const OPT_HOSTNAME: u8 = 12;
const OPT_DOMAIN_NAME: u8 = 15;
const OPT_MTU: u8 = 26;
const OPT_BROADCAST: u8 = 28;
const OPT_REQUESTED_IP: u8 = 50;
const OPT_LEASE_TIME: u8 = 51;
const OPT_MESSAGE_TYPE: u8 = 53;
const OPT_SERVER_ID: u8 = 54;
const OPT_CLASSLESS_ROUTES: u8 = 121;
const OPT_END: u8 = 255;

/// The lease never ends: the responder lives as long as the VM.
const INFINITE_LEASE: u32 = u32::MAX;

/// What one VM gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub mac: [u8; 6],
    pub address: Ipv4Addr,
    pub prefix: u8,
    /// The default route's gateway, which is also the responder's identifier.
    pub router: Option<Ipv4Addr>,
    /// Other routes through a gateway (destination, prefix, gateway).
    pub routes: Vec<(Ipv4Addr, u8, Ipv4Addr)>,
    pub mtu: u16,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub hostname: Option<String>,
}

impl Lease {
    /// The lease of a pod interface: its first IPv4 address and its IPv4 routes through a
    /// gateway. `None` when the interface has no IPv4 address.
    pub fn for_interface(iface: &Interface) -> Option<Lease> {
        let (address, prefix) = iface.addresses.iter().find_map(|a: &IpNet| match a.addr {
            std::net::IpAddr::V4(v4) => Some((v4, a.prefix.min(32))),
            _ => None,
        })?;
        let mut router = None;
        let mut routes = Vec::new();
        for route in &iface.routes {
            let Some(std::net::IpAddr::V4(via)) = route.gateway else {
                continue;
            };
            match &route.destination {
                None => router = Some(via),
                Some(IpNet {
                    addr: std::net::IpAddr::V4(dest),
                    prefix,
                }) => routes.push((*dest, (*prefix).min(32), via)),
                Some(_) => {}
            }
        }
        Some(Lease {
            mac: iface.mac,
            address,
            prefix,
            router,
            routes,
            mtu: iface.mtu.min(u16::MAX as u32) as u16,
            dns: Vec::new(),
            domain: None,
            hostname: None,
        })
    }

    fn mask(&self) -> Ipv4Addr {
        Ipv4Addr::from(prefix_mask(self.prefix))
    }

    /// The responder's identifier: the gateway when there is one (the guest's next hop),
    /// else the lease's own address.
    fn server_id(&self) -> Ipv4Addr {
        self.router.unwrap_or(self.address)
    }
}

fn prefix_mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

/// A DHCP request, as much of it as the responder reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub src_mac: [u8; 6],
    pub xid: [u8; 4],
    pub flags: [u8; 2],
    pub ciaddr: Ipv4Addr,
    pub chaddr: [u8; 6],
    pub message_type: u8,
    pub requested_ip: Option<Ipv4Addr>,
    pub server_id: Option<Ipv4Addr>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn ipv4(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

/// Parses an Ethernet frame as a DHCP request to a server; anything else is `None`.
pub fn parse(frame: &[u8]) -> Option<Request> {
    if frame.len() > MAX_FRAME || frame.len() < ETH_HEADER {
        return None;
    }
    if be16(frame, 12) != ETHERTYPE_IPV4 {
        return None;
    }
    let src_mac: [u8; 6] = frame[6..12].try_into().ok()?;
    let ip = &frame[ETH_HEADER..];
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(be16(ip, 2));
    // Fragments are not DHCP requests.
    if ihl < 20 || total < ihl || total > ip.len() || ip[9] != IPPROTO_UDP {
        return None;
    }
    if be16(ip, 6) & 0x3fff != 0 {
        return None;
    }
    let udp = &ip[ihl..total];
    if udp.len() < UDP_HEADER || be16(udp, 2) != SERVER_PORT {
        return None;
    }
    let udp_len = usize::from(be16(udp, 4));
    if udp_len < UDP_HEADER || udp_len > udp.len() {
        return None;
    }
    let msg = &udp[UDP_HEADER..udp_len];
    if msg.len() < BOOTP_FIXED || msg[0] != 1 || msg[1] != 1 || msg[2] != 6 {
        return None;
    }
    if msg[236..240] != MAGIC_COOKIE {
        return None;
    }
    let mut request = Request {
        src_mac,
        xid: msg[4..8].try_into().ok()?,
        flags: msg[10..12].try_into().ok()?,
        ciaddr: ipv4(&msg[12..16]),
        chaddr: msg[28..34].try_into().ok()?,
        message_type: 0,
        requested_ip: None,
        server_id: None,
    };
    let mut options = &msg[BOOTP_FIXED..];
    while let Some((&code, rest)) = options.split_first() {
        match code {
            OPT_PAD => {
                options = rest;
                continue;
            }
            OPT_END => break,
            _ => {}
        }
        let (&len, rest) = rest.split_first()?;
        let value = rest.get(..usize::from(len))?;
        options = &rest[usize::from(len)..];
        match (code, value.len()) {
            (OPT_MESSAGE_TYPE, 1) => request.message_type = value[0],
            (OPT_REQUESTED_IP, 4) => request.requested_ip = Some(ipv4(value)),
            (OPT_SERVER_ID, 4) => request.server_id = Some(ipv4(value)),
            _ => {}
        }
    }
    (request.message_type != 0).then_some(request)
}

/// One VM's responder.
#[derive(Debug, Clone)]
pub struct Responder {
    pub lease: Lease,
}

impl Responder {
    /// The frame to send back for `frame`, if it is a request from this VM that calls for
    /// an answer (DISCOVER: an offer; REQUEST: an acknowledgement of the lease's address,
    /// or a refusal of another one asked of this server; INFORM: the options). Requests
    /// from another MAC, for another server, and everything else get none.
    pub fn answer(&self, frame: &[u8]) -> Option<Vec<u8>> {
        let request = parse(frame)?;
        let lease = &self.lease;
        if request.src_mac != lease.mac || request.chaddr != lease.mac {
            return None;
        }
        let ours = request.server_id.is_none_or(|id| id == lease.server_id());
        match request.message_type {
            DISCOVER => Some(self.reply(&request, OFFER)),
            REQUEST if !ours => None,
            REQUEST => {
                let wanted = request.requested_ip.unwrap_or(request.ciaddr);
                if wanted == lease.address {
                    Some(self.reply(&request, ACK))
                } else if request.server_id.is_some() || request.requested_ip.is_some() {
                    Some(self.reply(&request, NAK))
                } else {
                    None
                }
            }
            INFORM => Some(self.reply(&request, ACK)),
            _ => None,
        }
    }

    fn reply(&self, request: &Request, kind: u8) -> Vec<u8> {
        let lease = &self.lease;
        let server = lease.server_id();
        let inform = request.message_type == INFORM;
        let mut msg = vec![0u8; BOOTP_FIXED];
        msg[0] = 2; // BOOTREPLY
        msg[1] = 1;
        msg[2] = 6;
        msg[4..8].copy_from_slice(&request.xid);
        msg[10..12].copy_from_slice(&request.flags);
        if inform {
            msg[12..16].copy_from_slice(&request.ciaddr.octets());
        } else if kind != NAK {
            msg[16..20].copy_from_slice(&lease.address.octets());
        }
        msg[20..24].copy_from_slice(&server.octets());
        msg[28..34].copy_from_slice(&lease.mac);
        msg[236..240].copy_from_slice(&MAGIC_COOKIE);
        let mut opt = |code: u8, value: &[u8]| {
            // Every value here is short; a longer one (a domain name) is cut at 255.
            let value = &value[..value.len().min(255)];
            msg.push(code);
            msg.push(value.len() as u8);
            msg.extend_from_slice(value);
        };
        opt(OPT_MESSAGE_TYPE, &[kind]);
        opt(OPT_SERVER_ID, &server.octets());
        if kind != NAK {
            if !inform {
                opt(OPT_LEASE_TIME, &INFINITE_LEASE.to_be_bytes());
            }
            opt(OPT_SUBNET_MASK, &lease.mask().octets());
            let broadcast = u32::from(lease.address) | !prefix_mask(lease.prefix);
            opt(OPT_BROADCAST, &broadcast.to_be_bytes());
            if let Some(router) = lease.router {
                opt(OPT_ROUTER, &router.octets());
            }
            if !lease.routes.is_empty() {
                // A client that reads option 121 ignores option 3: the default route goes
                // in too (RFC 3442).
                let mut value = Vec::new();
                let default = lease.router.map(|r| (Ipv4Addr::UNSPECIFIED, 0u8, r));
                for (dest, prefix, via) in default.iter().chain(lease.routes.iter()) {
                    let significant = usize::from(prefix.div_ceil(8));
                    value.push(*prefix);
                    value.extend_from_slice(&dest.octets()[..significant]);
                    value.extend_from_slice(&via.octets());
                }
                opt(OPT_CLASSLESS_ROUTES, &value);
            }
            if lease.mtu >= 68 {
                opt(OPT_MTU, &lease.mtu.to_be_bytes());
            }
            if !lease.dns.is_empty() {
                let servers: Vec<u8> = lease.dns.iter().take(8).flat_map(|a| a.octets()).collect();
                opt(OPT_DNS, &servers);
            }
            if let Some(domain) = &lease.domain {
                opt(OPT_DOMAIN_NAME, domain.as_bytes());
            }
            if let Some(hostname) = &lease.hostname {
                opt(OPT_HOSTNAME, hostname.as_bytes());
            }
        }
        msg.push(OPT_END);
        // To the client's address once it has one, else broadcast (RFC 2131 4.1).
        let (dst_ip, dst_mac) = if inform && !request.ciaddr.is_unspecified() {
            (request.ciaddr, lease.mac)
        } else if kind == NAK || request.flags[0] & 0x80 != 0 {
            (Ipv4Addr::BROADCAST, [0xff; 6])
        } else {
            (lease.address, lease.mac)
        };
        frame(server, dst_ip, dst_mac, &msg)
    }
}

/// An Ethernet + IPv4 + UDP frame from the server port to the client port. The source MAC
/// is a locally administered one of vmlet's (the guest learns nothing from it).
fn frame(src_ip: Ipv4Addr, dst_ip: Ipv4Addr, dst_mac: [u8; 6], payload: &[u8]) -> Vec<u8> {
    const SRC_MAC: [u8; 6] = [0x02, 0x76, 0x6d, 0x6c, 0x65, 0x74];
    let udp_len = UDP_HEADER + payload.len();
    let ip_len = 20 + udp_len;
    let mut f = Vec::with_capacity(ETH_HEADER + ip_len);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    ip[12..16].copy_from_slice(&src_ip.octets());
    ip[16..20].copy_from_slice(&dst_ip.octets());
    let checksum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&SERVER_PORT.to_be_bytes());
    f.extend_from_slice(&CLIENT_PORT.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no UDP checksum (allowed over IPv4)
    f.extend_from_slice(payload);
    f
}

fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

    fn lease() -> Lease {
        Lease {
            mac: VM_MAC,
            address: Ipv4Addr::new(10, 88, 0, 5),
            prefix: 16,
            router: Some(Ipv4Addr::new(10, 88, 0, 1)),
            routes: vec![],
            mtu: 1450,
            dns: vec![Ipv4Addr::new(10, 96, 0, 10)],
            domain: Some("default.svc.cluster.local".into()),
            hostname: Some("web-0".into()),
        }
    }

    /// A client's request frame, as dhclient sends it (broadcast, from 0.0.0.0).
    fn request(mac: [u8; 6], kind: u8, options: &[(u8, &[u8])]) -> Vec<u8> {
        let mut msg = vec![0u8; BOOTP_FIXED];
        msg[0] = 1;
        msg[1] = 1;
        msg[2] = 6;
        msg[4..8].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        msg[28..34].copy_from_slice(&mac);
        msg[236..240].copy_from_slice(&MAGIC_COOKIE);
        msg.extend_from_slice(&[OPT_MESSAGE_TYPE, 1, kind]);
        for (code, value) in options {
            msg.push(*code);
            msg.push(value.len() as u8);
            msg.extend_from_slice(value);
        }
        msg.push(OPT_END);
        let mut f = frame(Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST, [0xff; 6], &msg);
        f[6..12].copy_from_slice(&mac);
        // frame() writes server -> client ports; a request goes client -> server.
        let udp = ETH_HEADER + 20;
        f[udp..udp + 2].copy_from_slice(&CLIENT_PORT.to_be_bytes());
        f[udp + 2..udp + 4].copy_from_slice(&SERVER_PORT.to_be_bytes());
        f
    }

    /// The options of a reply frame, by code.
    fn options(reply: &[u8]) -> std::collections::HashMap<u8, Vec<u8>> {
        let msg = &reply[ETH_HEADER + 20 + UDP_HEADER..];
        let mut out = std::collections::HashMap::new();
        let mut o = &msg[BOOTP_FIXED..];
        while o[0] != OPT_END {
            let len = usize::from(o[1]);
            out.insert(o[0], o[2..2 + len].to_vec());
            o = &o[2 + len..];
        }
        out
    }

    fn yiaddr(reply: &[u8]) -> Ipv4Addr {
        ipv4(&reply[ETH_HEADER + 20 + UDP_HEADER + 16..])
    }

    #[test]
    fn a_discover_gets_an_offer_of_the_cni_address() {
        let r = Responder { lease: lease() };
        let offer = r.answer(&request(VM_MAC, DISCOVER, &[])).unwrap();
        assert_eq!(&offer[..6], &VM_MAC);
        assert_eq!(internet_checksum(&offer[ETH_HEADER..ETH_HEADER + 20]), 0);
        assert_eq!(yiaddr(&offer), Ipv4Addr::new(10, 88, 0, 5));
        let o = options(&offer);
        assert_eq!(o[&OPT_MESSAGE_TYPE], [OFFER]);
        assert_eq!(o[&OPT_SERVER_ID], [10, 88, 0, 1]);
        assert_eq!(o[&OPT_SUBNET_MASK], [255, 255, 0, 0]);
        assert_eq!(o[&OPT_BROADCAST], [10, 88, 255, 255]);
        assert_eq!(o[&OPT_ROUTER], [10, 88, 0, 1]);
        assert_eq!(o[&OPT_DNS], [10, 96, 0, 10]);
        assert_eq!(o[&OPT_MTU], 1450u16.to_be_bytes());
        assert_eq!(o[&OPT_HOSTNAME], b"web-0");
        assert_eq!(o[&OPT_DOMAIN_NAME], b"default.svc.cluster.local");
        assert_eq!(o[&OPT_LEASE_TIME], u32::MAX.to_be_bytes());
        assert!(!o.contains_key(&OPT_CLASSLESS_ROUTES));
    }

    #[test]
    fn a_request_for_the_address_is_acknowledged_and_another_refused() {
        let r = Responder { lease: lease() };
        let server = [10, 88, 0, 1];
        let ack = r
            .answer(&request(
                VM_MAC,
                REQUEST,
                &[
                    (OPT_REQUESTED_IP, &[10, 88, 0, 5]),
                    (OPT_SERVER_ID, &server),
                ],
            ))
            .unwrap();
        assert_eq!(options(&ack)[&OPT_MESSAGE_TYPE], [ACK]);
        assert_eq!(yiaddr(&ack), Ipv4Addr::new(10, 88, 0, 5));
        let nak = r
            .answer(&request(
                VM_MAC,
                REQUEST,
                &[(OPT_REQUESTED_IP, &[192, 168, 1, 9])],
            ))
            .unwrap();
        assert_eq!(options(&nak)[&OPT_MESSAGE_TYPE], [NAK]);
        assert_eq!(yiaddr(&nak), Ipv4Addr::UNSPECIFIED);
        assert_eq!(&nak[..6], &[0xff; 6]);
        // A request to another server is that server's.
        let other = request(
            VM_MAC,
            REQUEST,
            &[
                (OPT_REQUESTED_IP, &[10, 88, 0, 5]),
                (OPT_SERVER_ID, &[10, 0, 0, 9]),
            ],
        );
        assert_eq!(r.answer(&other), None);
    }

    #[test]
    fn only_the_vms_mac_is_answered() {
        let r = Responder { lease: lease() };
        let other_mac = [0x52, 0x54, 0, 0, 0, 1];
        assert_eq!(r.answer(&request(other_mac, DISCOVER, &[])), None);
        let mut spoofed = request(VM_MAC, DISCOVER, &[]);
        spoofed[6..12].copy_from_slice(&other_mac);
        assert_eq!(r.answer(&spoofed), None);
    }

    #[test]
    fn other_routes_go_in_option_121_with_the_default() {
        let mut l = lease();
        l.routes = vec![(
            Ipv4Addr::new(10, 99, 0, 0),
            16,
            Ipv4Addr::new(10, 88, 0, 254),
        )];
        let r = Responder { lease: l };
        let offer = r.answer(&request(VM_MAC, DISCOVER, &[])).unwrap();
        assert_eq!(
            options(&offer)[&OPT_CLASSLESS_ROUTES],
            [0, 10, 88, 0, 1, 16, 10, 99, 10, 88, 0, 254]
        );
    }

    #[test]
    fn what_is_not_a_request_is_ignored() {
        let r = Responder { lease: lease() };
        let good = request(VM_MAC, DISCOVER, &[]);
        // Every truncation of a request, and a few bytes changed, are not answered wrongly.
        for len in 0..good.len() - 1 {
            if let Some(reply) = r.answer(&good[..len]) {
                panic!("answered a frame cut at {len}: {reply:?}");
            }
        }
        let mut wrong_port = good.clone();
        wrong_port[ETH_HEADER + 20 + 2..ETH_HEADER + 20 + 4].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(r.answer(&wrong_port), None);
        let mut reply_op = good.clone();
        reply_op[ETH_HEADER + 20 + UDP_HEADER] = 2;
        assert_eq!(r.answer(&reply_op), None);
        let mut bad_option = good.clone();
        let end = bad_option.len() - 1;
        bad_option[end] = OPT_HOSTNAME; // an option whose length runs past the frame
        assert_eq!(parse(&bad_option), None);
        assert_eq!(r.answer(&request(VM_MAC, 7, &[])), None); // RELEASE
    }

    #[test]
    fn a_lease_comes_from_the_pod_interface() {
        let iface = Interface {
            name: "eth0".into(),
            index: 2,
            mac: VM_MAC,
            mtu: 1500,
            addresses: vec![
                IpNet {
                    addr: "fd00::5".parse().unwrap(),
                    prefix: 64,
                },
                IpNet {
                    addr: "10.88.0.5".parse().unwrap(),
                    prefix: 16,
                },
            ],
            routes: vec![
                crate::Route {
                    destination: None,
                    gateway: Some("10.88.0.1".parse().unwrap()),
                },
                crate::Route {
                    destination: None,
                    gateway: Some("fd00::1".parse().unwrap()),
                },
            ],
        };
        let l = Lease::for_interface(&iface).unwrap();
        assert_eq!(
            (l.address, l.prefix, l.router),
            (
                Ipv4Addr::new(10, 88, 0, 5),
                16,
                Some(Ipv4Addr::new(10, 88, 0, 1))
            )
        );
        assert_eq!(l.mtu, 1500);
    }

    proptest::proptest! {
        /// Whatever the guest sends, the responder reads within the frame and answers, if
        /// at all, only its VM's MAC.
        #[test]
        fn any_frame_is_read_within_bounds(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600),
            flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 0..8),
        ) {
            let r = Responder { lease: lease() };
            if let Some(reply) = r.answer(&bytes) {
                proptest::prop_assert!(reply[..6] == VM_MAC || reply[..6] == [0xff; 6]);
            }
            let mut mutated = request(VM_MAC, REQUEST, &[(OPT_REQUESTED_IP, &[10, 88, 0, 5])]);
            for (at, value) in flips {
                let at = at % mutated.len();
                mutated[at] = value;
            }
            if let Some(reply) = r.answer(&mutated) {
                proptest::prop_assert!(reply[..6] == VM_MAC || reply[..6] == [0xff; 6]);
                proptest::prop_assert_eq!(&reply[28 + ETH_HEADER + 20 + UDP_HEADER..34 + ETH_HEADER + 20 + UDP_HEADER], &VM_MAC[..]);
            }
        }
    }
}
