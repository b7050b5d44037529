//! Ownership marks on taps: every tap vmlet creates carries, as its interface alias
//! (`ip link show` prints it), the pod it belongs to and the CNI interface it is joined
//! to: `vmlet:<pod-id>:<interface>`. Tap names (`vmtap0`) are per namespace and say nothing
//! of the pod; the mark lets `vmletctl gc` find a tap whose pod's state was lost and remove
//! it with the ingress qdisc vmlet put on its interface, and nothing that is not marked.

use std::path::{Path, PathBuf};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::Handle;

use crate::links::{all_links, remove_ingress_qdisc, remove_link};
use crate::worker::in_netns;
use crate::Error;

/// How every mark starts.
pub const MARK_PREFIX: &str = "vmlet:";

/// The alias of a tap of `pod_id` joined to the interface `peer`.
pub fn mark(pod_id: &str, peer: &str) -> String {
    format!("{MARK_PREFIX}{pod_id}:{peer}")
}

/// The pod id and interface of a mark; None for any other alias. (containerd ids have no
/// `:`, so the first one after the prefix ends the pod id.)
pub fn parse_mark(alias: &str) -> Option<(&str, &str)> {
    let (pod, peer) = alias.strip_prefix(MARK_PREFIX)?.split_once(':')?;
    if pod.is_empty() || peer.is_empty() {
        return None;
    }
    Some((pod, peer))
}

/// A tap carrying vmlet's mark, as found in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedTap {
    pub netns: PathBuf,
    pub name: String,
    pub index: u32,
    pub pod_id: String,
    /// The CNI interface it was joined to.
    pub peer: String,
}

/// The marked taps in the namespace at `netns`.
pub fn marked_taps(netns: &Path) -> Result<Vec<MarkedTap>, Error> {
    let path = netns.to_owned();
    in_netns(netns, move |handle| async move {
        marked_in(&handle, &path).await
    })
}

/// The marked taps of the namespace `handle` talks to (`netns` names it in the result).
pub(crate) async fn marked_in(handle: &Handle, netns: &Path) -> Result<Vec<MarkedTap>, Error> {
    let mut found = Vec::new();
    for link in all_links(handle).await? {
        let mut name = String::new();
        let mut alias = None;
        for attribute in link.attributes {
            match attribute {
                LinkAttribute::IfName(n) => name = n,
                LinkAttribute::IfAlias(a) => alias = Some(a),
                _ => {}
            }
        }
        if let Some((pod, peer)) = alias.as_deref().and_then(parse_mark) {
            found.push(MarkedTap {
                netns: netns.to_owned(),
                name,
                index: link.header.index,
                pod_id: pod.to_owned(),
                peer: peer.to_owned(),
            });
        }
    }
    Ok(found)
}

/// Removes a marked tap and the ingress qdisc (with vmlet's redirect) of its interface,
/// after checking that the link is still that tap (same name and mark). Already gone is not
/// an error.
pub fn remove_marked_tap(tap: &MarkedTap) -> Result<(), Error> {
    let tap = tap.clone();
    in_netns(&tap.netns.clone(), move |handle| async move {
        let still = marked_in(&handle, &tap.netns)
            .await?
            .into_iter()
            .any(|t| t == tap);
        if !still {
            return Ok(());
        }
        remove_with_peer_qdisc(&handle, &tap).await
    })
}

/// Removes the ingress qdisc of `tap`'s interface (if it is still there) and the tap.
pub(crate) async fn remove_with_peer_qdisc(handle: &Handle, tap: &MarkedTap) -> Result<(), Error> {
    let peer = handle
        .link()
        .get()
        .match_name(tap.peer.clone())
        .execute()
        .try_next()
        .await;
    if let Ok(Some(peer)) = peer {
        remove_ingress_qdisc(handle, peer.header.index, &tap.peer).await?;
    }
    remove_link(handle, tap.index, &tap.name).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_names_the_pod_and_the_interface() {
        let alias = mark("pod-1.a_b", "eth0");
        assert_eq!(alias, "vmlet:pod-1.a_b:eth0");
        assert_eq!(parse_mark(&alias), Some(("pod-1.a_b", "eth0")));
        // An interface name may itself hold a colon (old-style aliases).
        assert_eq!(parse_mark("vmlet:p:eth0:1"), Some(("p", "eth0:1")));
    }

    #[test]
    fn other_aliases_are_not_marks() {
        for alias in [
            "",
            "vmlet",
            "vmlet:",
            "vmlet:pod",
            "vmlet::eth0",
            "vmlet:pod:",
            "uplink",
            "xvmlet:p:e",
        ] {
            assert_eq!(parse_mark(alias), None, "{alias:?}");
        }
    }
}
