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

/// How long a NIC the request names may take to appear: a pod started from a template has
/// its NICs plugged in just before its vsock device, and the guest may still be probing
/// them when the first request arrives. A cold boot's are there from the start.
const NIC_APPEARS: Duration = Duration::from_secs(10);
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

/// The link `pred` picks, waiting up to `within` for it to appear.
async fn link_within(
    handle: &Handle,
    pred: impl Fn(&str, Option<&[u8]>) -> bool,
    within: Duration,
) -> Result<Option<u32>, Error> {
    let deadline = tokio::time::Instant::now() + within;
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

/// Configures every interface of the request: MTU, up, addresses, then routes.
pub async fn configure(req: &ConfigureNetworkRequest) -> Result<(), Error> {
    let handle = connect().await?;
    for interface in &req.interfaces {
        configure_one(&handle, interface).await?;
    }
    Ok(())
}

async fn configure_one(handle: &Handle, interface: &NetworkInterface) -> Result<(), Error> {
    let mac = parse_mac(&interface.mac)?;
    let index = link_within(handle, |_, m| m == Some(&mac[..]), NIC_APPEARS)
        .await?
        .ok_or_else(|| {
            Error::InvalidRequest(format!(
                "no guest NIC with MAC {} within {} s",
                interface.mac,
                NIC_APPEARS.as_secs()
            ))
        })?;
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
