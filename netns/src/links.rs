//! The netlink primitives wiring and marks both use: listing a namespace's links and
//! removing a link or an ingress qdisc, where "already gone" is success.

use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::LinkMessage;
use rtnetlink::packet_route::tc::TcHandle;
use rtnetlink::Handle;

use crate::Error;

/// tc filter parent of the ingress qdisc (`ffff:`).
pub(crate) const INGRESS_PARENT: u32 = 0xffff_0000;

/// Every link of the namespace `handle` talks to.
pub(crate) async fn all_links(handle: &Handle) -> Result<Vec<LinkMessage>, Error> {
    handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::netlink("list links", e))
}

/// Whether a netlink error means "it is not there" (already removed).
fn is_gone(e: &rtnetlink::Error) -> bool {
    match e {
        rtnetlink::Error::NetlinkError(message) => message
            .code
            .map(|c| matches!(-c.get(), libc::ENOENT | libc::ENODEV | libc::EINVAL))
            .unwrap_or(false),
        _ => false,
    }
}

/// Removes the ingress qdisc (and with it vmlet's redirect filter) of link `index`.
pub(crate) async fn remove_ingress_qdisc(
    handle: &Handle,
    index: u32,
    name: &str,
) -> Result<(), Error> {
    let mut request = handle.qdisc().del(index as i32);
    request.message_mut().header.parent = TcHandle::INGRESS;
    request.message_mut().header.handle = TcHandle::from(INGRESS_PARENT);
    match request.execute().await {
        Err(e) if !is_gone(&e) => Err(Error::netlink(format!("remove ingress qdisc of {name}"), e)),
        _ => Ok(()),
    }
}

/// Removes link `index` (a tap: its own qdisc and filter go with it).
pub(crate) async fn remove_link(handle: &Handle, index: u32, name: &str) -> Result<(), Error> {
    match handle.link().del(index).execute().await {
        Err(e) if !is_gone(&e) => Err(Error::netlink(format!("remove {name}"), e)),
        _ => Ok(()),
    }
}
