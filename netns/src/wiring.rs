//! Wiring each CNI interface to a tap with tc mirred, and removing exactly that again.

use std::os::fd::OwnedFd;
use std::path::Path;

use futures_util::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol,
};
use rtnetlink::{Handle, LinkUnspec};

use crate::interface::{is_link_local, is_pod_interface, Interface, IpNet, Route};
use crate::links::{all_links, remove_ingress_qdisc, remove_link, INGRESS_PARENT};
use crate::marks::mark;
use crate::tap::{open_tap, tap_name};
use crate::worker::in_netns;
use crate::Error;

/// `ETH_P_ALL` in network byte order, as tc wants the filter protocol: every protocol.
const ETH_P_ALL_BE: u16 = 0x0003u16.to_be();

/// One CNI interface joined to one tap.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Wiring {
    pub interface: Interface,
    pub tap_name: String,
    pub tap_index: u32,
}

/// The result of [`wire`]: what was joined, and the taps' queue fds for QEMU (same order).
#[derive(Debug, Default)]
pub struct Wired {
    pub wirings: Vec<Wiring>,
    pub taps: Vec<OwnedFd>,
}

/// Lists the pod interfaces in the namespace at `netns` and joins each to a new tap marked
/// as `pod_id`'s (see [`crate::marks`]). On failure, whatever was added is removed again
/// before the error is returned.
pub fn wire(netns: &Path, pod_id: &str) -> Result<Wired, Error> {
    let path = netns.to_owned();
    let pod_id = pod_id.to_owned();
    in_netns(netns, move |handle| async move {
        let interfaces = list_interfaces(&handle).await?;
        if interfaces.is_empty() {
            return Err(Error::NoInterface(path));
        }
        let mut wired = Wired::default();
        for (n, interface) in interfaces.into_iter().enumerate() {
            match wire_one(&handle, n, interface, &pod_id).await {
                Ok((wiring, tap)) => {
                    wired.wirings.push(wiring);
                    wired.taps.push(tap);
                }
                Err(e) => {
                    if let Err(undo) = unwire_all(&handle, &wired.wirings).await {
                        log::warn!("undo partial wiring: {undo}");
                    }
                    return Err(e);
                }
            }
        }
        Ok(wired)
    })
}

/// Removes what [`wire`] added for `pod_id`: the ingress qdiscs (and with them the filters)
/// and the taps of `wirings`, then any other tap carrying the pod's mark (one made just
/// before its shim died, never recorded), all in one visit to the namespace. Things already
/// gone are not an error.
pub fn unwire(netns: &Path, pod_id: &str, wirings: &[Wiring]) -> Result<(), Error> {
    let (pod_id, wirings) = (pod_id.to_owned(), wirings.to_vec());
    in_netns(netns, move |handle| async move {
        unwire_all(&handle, &wirings).await?;
        for tap in crate::marks::marked_in(&handle, Path::new("")).await? {
            if tap.pod_id == pod_id {
                crate::marks::remove_with_peer_qdisc(&handle, &tap).await?;
            }
        }
        Ok(())
    })
}

async fn list_interfaces(handle: &Handle) -> Result<Vec<Interface>, Error> {
    let mut found = Vec::new();
    for link in all_links(handle).await? {
        let mut name = String::new();
        let mut mac = None;
        let mut mtu = 1500;
        for attribute in &link.attributes {
            match attribute {
                LinkAttribute::IfName(n) => name = n.clone(),
                LinkAttribute::Address(a) => mac = Some(a.clone()),
                LinkAttribute::Mtu(m) => mtu = *m,
                _ => {}
            }
        }
        let loopback = link.header.flags.contains(LinkFlags::Loopback);
        if !is_pod_interface(&name, loopback, mac.as_deref()) {
            continue;
        }
        let mac: [u8; 6] = mac.unwrap_or_default().try_into().unwrap_or_default();
        found.push(Interface {
            addresses: addresses_of(handle, link.header.index).await?,
            routes: Vec::new(),
            name,
            index: link.header.index,
            mac,
            mtu,
        });
    }
    found.sort_by_key(|i| i.index);
    let mut routes = handle
        .route()
        .get(rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new().build())
        .execute();
    while let Some(message) = routes
        .try_next()
        .await
        .map_err(|e| Error::netlink("list routes", e))?
    {
        if let Some((oif, route)) = cni_route(&message) {
            if let Some(interface) = found.iter_mut().find(|i| i.index == oif) {
                interface.routes.push(route);
            }
        }
    }
    Ok(found)
}

/// A route to hand to the guest: main table, not created by the kernel for an address
/// (the guest's kernel adds those itself), with an output interface.
fn cni_route(message: &RouteMessage) -> Option<(u32, Route)> {
    if message.header.table != RouteHeader::RT_TABLE_MAIN
        || message.header.protocol == RouteProtocol::Kernel
    {
        return None;
    }
    let mut oif = None;
    let mut destination = None;
    let mut gateway = None;
    let ip = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(std::net::IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(std::net::IpAddr::V6(*v6)),
        _ => None,
    };
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Destination(a) => {
                destination = ip(a).map(|addr| IpNet {
                    addr,
                    prefix: message.header.destination_prefix_length,
                })
            }
            RouteAttribute::Gateway(a) => gateway = ip(a),
            _ => {}
        }
    }
    Some((
        oif?,
        Route {
            destination,
            gateway,
        },
    ))
}

async fn addresses_of(handle: &Handle, index: u32) -> Result<Vec<IpNet>, Error> {
    let mut stream = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute();
    let mut addresses = Vec::new();
    while let Some(message) = stream
        .try_next()
        .await
        .map_err(|e| Error::netlink("list addresses", e))?
    {
        for attribute in &message.attributes {
            if let AddressAttribute::Address(addr) = attribute {
                if is_link_local(addr) {
                    // The guest derives its own from the same MAC.
                    continue;
                }
                addresses.push(IpNet {
                    addr: *addr,
                    prefix: message.header.prefix_len,
                });
            }
        }
    }
    Ok(addresses)
}

async fn link_index(handle: &Handle, name: &str) -> Result<u32, Error> {
    handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
        .map_err(|e| Error::netlink(format!("look up {name}"), e))?
        .map(|l| l.header.index)
        .ok_or_else(|| Error::netlink(format!("look up {name}"), "no such link"))
}

async fn wire_one(
    handle: &Handle,
    n: usize,
    interface: Interface,
    pod_id: &str,
) -> Result<(Wiring, OwnedFd), Error> {
    let name = tap_name(n);
    let tap = open_tap(&name)?;
    let tap_index = link_index(handle, &name).await?;
    let wiring = Wiring {
        interface,
        tap_name: name.clone(),
        tap_index,
    };
    let joined = async {
        handle
            .link()
            .set(
                LinkUnspec::new_with_index(tap_index)
                    .mtu(wiring.interface.mtu)
                    .append_extra_attribute(LinkAttribute::IfAlias(mark(
                        pod_id,
                        &wiring.interface.name,
                    )))
                    .up()
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("set {name} up"), e))?;
        for (from, to) in [
            (wiring.interface.index, tap_index),
            (tap_index, wiring.interface.index),
        ] {
            handle
                .qdisc()
                .add(from as i32)
                .ingress()
                .execute()
                .await
                .map_err(|e| Error::netlink(format!("add ingress qdisc on link {from}"), e))?;
            handle
                .traffic_filter(from as i32)
                .add()
                .parent(INGRESS_PARENT)
                .protocol(ETH_P_ALL_BE)
                .redirect(to)
                .map_err(|e| Error::netlink("build mirred filter", e))?
                .execute()
                .await
                .map_err(|e| Error::netlink(format!("add mirred filter {from} -> {to}"), e))?;
        }
        Ok::<_, Error>(())
    }
    .await;
    match joined {
        Ok(()) => Ok((wiring, tap)),
        Err(e) => {
            let _ = unwire_all(handle, std::slice::from_ref(&wiring)).await;
            Err(e)
        }
    }
}

async fn unwire_all(handle: &Handle, wirings: &[Wiring]) -> Result<(), Error> {
    let mut first = None;
    for wiring in wirings {
        let removed = remove_ingress_qdisc(handle, wiring.interface.index, &wiring.interface.name)
            .await
            .and(remove_link(handle, wiring.tap_index, &wiring.tap_name).await);
        if let Err(e) = removed {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}
