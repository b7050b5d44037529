//! Applying the pod network to the guest's NICs (netlink in the guest's own namespace).

use std::net::IpAddr;
use std::time::Duration;

use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use vmlet_protocol::agent::{ConfigureNetworkRequest, NetworkInterface};

use crate::Error;

/// Parses `a.b.c.d/n` (or an IPv6 CIDR).
pub fn parse_cidr(text: &str) -> Result<(IpAddr, u8), Error> {
    let bad = || Error::InvalidRequest(format!("bad CIDR {text:?}"));
    let (addr, prefix) = text.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(bad());
    }
    Ok((addr, prefix))
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Result<[u8; 6], Error> {
    let bad = || Error::InvalidRequest(format!("bad MAC {text:?}"));
    let bytes: Vec<u8> = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| bad())
}

async fn connect() -> Result<Handle, Error> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| Error::io("open netlink socket", e))?;
    tokio::spawn(connection);
    Ok(handle)
}

fn netlink(what: &str, e: rtnetlink::Error) -> Error {
    Error::Network(format!("{what}: {e}"))
}

/// Brings the loopback interface up.
pub async fn loopback_up() -> Result<(), Error> {
    let handle = connect().await?;
    let lo = link_by(&handle, |name, _| name == "lo").await?;
    handle
        .link()
        .set(LinkUnspec::new_with_index(lo).up().build())
        .execute()
        .await
        .map_err(|e| netlink("set lo up", e))
}

/// How long the NICs a request names may take to appear, all of them together (within the
/// shim's deadline for the request): a pod started from a template has its NICs plugged in
/// just before its vsock device, and the guest may still be probing them when the first
/// request arrives. A cold boot's are there from the start.
const NICS_APPEAR: Duration = Duration::from_secs(10);
/// How often the guest's links are listed meanwhile.
const NIC_POLL: Duration = Duration::from_millis(5);

async fn link_by(
    handle: &Handle,
    pred: impl Fn(&str, Option<&[u8]>) -> bool,
) -> Result<u32, Error> {
    find_link(handle, &pred)
        .await?
        .ok_or_else(|| Error::Network("no such interface in the guest".into()))
}

/// The link `pred` picks, waiting until `deadline` for it to appear.
async fn link_until(
    handle: &Handle,
    pred: impl Fn(&str, Option<&[u8]>) -> bool,
    deadline: tokio::time::Instant,
) -> Result<Option<u32>, Error> {
    loop {
        if let Some(index) = find_link(handle, &pred).await? {
            return Ok(Some(index));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(NIC_POLL).await;
    }
}

async fn find_link(
    handle: &Handle,
    pred: &impl Fn(&str, Option<&[u8]>) -> bool,
) -> Result<Option<u32>, Error> {
    let mut links = handle.link().get().execute();
    while let Some(link) = links
        .try_next()
        .await
        .map_err(|e| netlink("list links", e))?
    {
        let mut name = String::new();
        let mut mac = None;
        for attribute in &link.attributes {
            match attribute {
                LinkAttribute::IfName(n) => name = n.clone(),
                LinkAttribute::Address(a) => mac = Some(a.clone()),
                _ => {}
            }
        }
        if pred(&name, mac.as_deref()) {
            return Ok(Some(link.header.index));
        }
    }
    Ok(None)
}

/// Configures every interface of the request: finds each guest NIC by its MAC, names it as
/// the pod's interface is named, then sets its MTU, up, addresses, then routes.
pub async fn configure(req: &ConfigureNetworkRequest) -> Result<(), Error> {
    let handle = connect().await?;
    let deadline = tokio::time::Instant::now() + NICS_APPEAR;
    let mut links = Vec::with_capacity(req.interfaces.len());
    for interface in &req.interfaces {
        let mac = parse_mac(&interface.mac)?;
        let index = link_until(&handle, |_, m| m == Some(&mac[..]), deadline)
            .await?
            .ok_or_else(|| {
                Error::InvalidRequest(format!(
                    "no guest NIC with MAC {} within {} s",
                    interface.mac,
                    NICS_APPEAR.as_secs()
                ))
            })?;
        if links.contains(&index) {
            return Err(Error::InvalidRequest(format!(
                "two of the pod's interfaces have MAC {}: the guest cannot tell their NICs apart",
                interface.mac
            )));
        }
        links.push(index);
    }
    name_links(&handle, &req.interfaces, &links).await?;
    for (interface, index) in req.interfaces.iter().zip(links) {
        configure_one(&handle, interface, index).await?;
    }
    Ok(())
}

/// Whether `name` is one the kernel takes for a network interface as it is (its
/// `dev_valid_name`): 1 to 15 bytes, not `.` or `..`, without `/`, `:` or white space; and
/// without `%`, which the kernel would take for a pattern (`net%d`) and name the link
/// otherwise.
fn check_name(name: &str) -> Result<(), Error> {
    let valid = (1..=15).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c == '%' || c.is_whitespace() || c.is_control());
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidRequest(format!(
            "{name:?} is not a network interface name"
        )))
    }
}

/// Where a temporary name is needed: each NIC renamed goes through one first, so that two
/// NICs the guest found in the other order can swap names.
const TEMPORARY_NAME: &str = "vmlet-rename";

/// The renames that give each link of `wanted` (index, name) its name, in order, given the
/// guest's links `current` (index, name): every link whose name differs first gets a
/// temporary name, then its own. A name held by a link that is not wanted, or wanted twice,
/// is an error.
fn renames(wanted: &[(u32, &str)], current: &[(u32, String)]) -> Result<Vec<(u32, String)>, Error> {
    for (n, (index, name)) in wanted.iter().enumerate() {
        check_name(name)?;
        if name.starts_with(TEMPORARY_NAME) {
            return Err(Error::InvalidRequest(format!(
                "interface name {name:?}: the agent uses names starting {TEMPORARY_NAME:?}"
            )));
        }
        if wanted[..n]
            .iter()
            .any(|(i, other)| other == name && i != index)
        {
            return Err(Error::InvalidRequest(format!(
                "two interfaces are both named {name:?}"
            )));
        }
        let held = current
            .iter()
            .any(|(i, other)| other == name && !wanted.iter().any(|(w, _)| w == i));
        if held {
            return Err(Error::InvalidRequest(format!(
                "the guest has an interface named {name:?} that is not the pod's"
            )));
        }
    }
    let name_of = |index: u32| current.iter().find(|(i, _)| *i == index).map(|(_, n)| n);
    let moving: Vec<(u32, &str)> = wanted
        .iter()
        .filter(|(index, name)| name_of(*index).map(String::as_str) != Some(*name))
        .copied()
        .collect();
    let mut steps: Vec<(u32, String)> = moving
        .iter()
        .enumerate()
        .map(|(n, (index, _))| (*index, format!("{TEMPORARY_NAME}{n}")))
        .collect();
    steps.extend(
        moving
            .iter()
            .map(|(index, name)| (*index, (*name).to_owned())),
    );
    Ok(steps)
}

/// Renames the guest's NICs (`links`, one per interface, still down) after the pod's
/// interfaces: a container sees eth0 and net1 as it would beside runc, whatever order the
/// guest's kernel found them in (a pod started from a template has them plugged in one by
/// one).
async fn name_links(
    handle: &Handle,
    interfaces: &[NetworkInterface],
    links: &[u32],
) -> Result<(), Error> {
    let wanted: Vec<(u32, &str)> = interfaces
        .iter()
        .zip(links)
        .filter(|(interface, _)| !interface.name.is_empty())
        .map(|(interface, index)| (*index, interface.name.as_str()))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let current = link_names(handle).await?;
    for (index, name) in renames(&wanted, &current)? {
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).name(name.clone()).build())
            .execute()
            .await
            .map_err(|e| netlink(&format!("name NIC {index} {name}"), e))?;
    }
    Ok(())
}

/// Every link of the guest: its index and name.
async fn link_names(handle: &Handle) -> Result<Vec<(u32, String)>, Error> {
    let mut names = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(link) = links
        .try_next()
        .await
        .map_err(|e| netlink("list links", e))?
    {
        for attribute in &link.attributes {
            if let LinkAttribute::IfName(name) = attribute {
                names.push((link.header.index, name.clone()));
            }
        }
    }
    Ok(names)
}

async fn configure_one(
    handle: &Handle,
    interface: &NetworkInterface,
    index: u32,
) -> Result<(), Error> {
    let mut link = LinkUnspec::new_with_index(index).up();
    if interface.mtu > 0 {
        link = link.mtu(interface.mtu);
    }
    handle
        .link()
        .set(link.build())
        .execute()
        .await
        .map_err(|e| netlink(&format!("set NIC {} up", interface.mac), e))?;
    for cidr in &interface.addresses {
        let (addr, prefix) = parse_cidr(cidr)?;
        handle
            .address()
            .add(index, addr, prefix)
            .execute()
            .await
            .map_err(|e| netlink(&format!("add address {cidr}"), e))?;
    }
    for route in &interface.routes {
        let gateway = (!route.gateway.is_empty())
            .then(|| route.gateway.parse::<IpAddr>())
            .transpose()
            .map_err(|_| Error::InvalidRequest(format!("bad gateway {:?}", route.gateway)))?;
        let destination = (!route.destination.is_empty())
            .then(|| parse_cidr(&route.destination))
            .transpose()?;
        let message = match (destination, gateway) {
            (Some((IpAddr::V6(_), _)), _) | (_, Some(IpAddr::V6(_))) => {
                return Err(Error::InvalidRequest(
                    "IPv6 routes are not supported yet".into(),
                ))
            }
            (destination, gateway) => {
                let mut builder =
                    RouteMessageBuilder::<std::net::Ipv4Addr>::new().output_interface(index);
                if let Some((IpAddr::V4(dst), prefix)) = destination {
                    builder = builder.destination_prefix(dst, prefix);
                }
                if let Some(IpAddr::V4(gw)) = gateway {
                    builder = builder.gateway(gw);
                }
                builder.build()
            }
        };
        handle
            .route()
            .add(message)
            .execute()
            .await
            .map_err(|e| netlink(&format!("add route {route:?}"), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert_eq!(
            parse_cidr("10.88.0.5/16").unwrap(),
            ("10.88.0.5".parse().unwrap(), 16)
        );
        assert!(parse_cidr("fd00::1/64").is_ok());
        for bad in ["10.0.0.1", "10.0.0.1/33", "x/8", "fd00::1/129", ""] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn interface_names_the_kernel_takes() {
        for good in ["eth0", "net1", "a", "fifteen-chars-x"] {
            check_name(good).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "sixteen-chars-xy",
            "a/b",
            "a:b",
            "a b",
            "a\n",
            "net%d",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    fn current(links: &[(u32, &str)]) -> Vec<(u32, String)> {
        links.iter().map(|(i, n)| (*i, (*n).to_owned())).collect()
    }

    #[test]
    fn nics_found_in_the_other_order_swap_names_through_temporary_ones() {
        let links = current(&[(1, "lo"), (2, "eth0"), (3, "eth1")]);
        let steps = renames(&[(3, "eth0"), (2, "net1")], &links).unwrap();
        let names: Vec<(u32, &str)> = steps.iter().map(|(i, n)| (*i, n.as_str())).collect();
        assert_eq!(
            names,
            [
                (3, "vmlet-rename0"),
                (2, "vmlet-rename1"),
                (3, "eth0"),
                (2, "net1")
            ]
        );
    }

    #[test]
    fn nics_already_named_so_are_left_alone() {
        let links = current(&[(1, "lo"), (2, "eth0"), (3, "eth1")]);
        assert!(renames(&[(2, "eth0")], &links).unwrap().is_empty());
        let steps = renames(&[(2, "eth0"), (3, "net1")], &links).unwrap();
        assert_eq!(
            steps,
            [(3, "vmlet-rename0".to_owned()), (3, "net1".to_owned())]
        );
    }

    #[test]
    fn names_taken_or_repeated_are_refused_by_name() {
        let links = current(&[(1, "lo"), (2, "eth0"), (3, "eth1")]);
        for (wanted, says) in [
            (vec![(2, "lo")], "\"lo\" that is not the pod's"),
            (vec![(2, "eth1")], "\"eth1\" that is not the pod's"),
            (vec![(2, "net1"), (3, "net1")], "both named \"net1\""),
            (vec![(2, "vmlet-rename0")], "the agent uses"),
            (vec![(2, "a/b")], "not a network interface name"),
        ] {
            let err = renames(&wanted, &links).unwrap_err().to_string();
            assert!(err.contains(says), "{wanted:?}: {err}");
        }
    }

    #[test]
    fn macs() {
        assert_eq!(
            parse_mac("0a:58:0a:00:00:05").unwrap(),
            [0x0a, 0x58, 0x0a, 0, 0, 5]
        );
        for bad in ["", "0a:58", "zz:58:0a:00:00:05", "0a:58:0a:00:00:05:06"] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
    }
}
