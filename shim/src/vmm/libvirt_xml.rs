//! What vmlet reads back from libvirt's domain XML, with an XML reader (namespaces
//! resolved, entities unescaped), never by splitting strings: the pod a domain belongs to
//! (vmlet's metadata), the vsock CID libvirt gave the guest; and the security drivers of its
//! host capabilities.

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::{Namespace, ResolveResult};
use quick_xml::reader::NsReader;

use crate::vmm::domain::VMLET_METADATA_NS;

/// The value of attribute `name` of `element`, unescaped.
fn attribute(element: &BytesStart, name: &[u8]) -> Option<String> {
    element
        .attributes()
        .filter_map(Result::ok)
        .find(|a| a.key.as_ref() == name)
        .and_then(|a| a.unescape_value().ok())
        .map(|v| v.into_owned())
}

/// The pod id in a domain XML's `<pod id=...>` element of vmlet's metadata namespace
/// (whatever its prefix), if the domain has vmlet's mark.
pub fn pod_id_in(xml: &str) -> Option<String> {
    let mut reader = NsReader::from_str(xml);
    loop {
        match reader.read_resolved_event().ok()? {
            (ResolveResult::Bound(Namespace(ns)), Event::Start(e) | Event::Empty(e))
                if ns == VMLET_METADATA_NS.as_bytes() && e.local_name().as_ref() == b"pod" =>
            {
                return attribute(&e, b"id");
            }
            (_, Event::Eof) => return None,
            _ => {}
        }
    }
}

/// The guest CID libvirt assigned (`<devices><vsock><cid auto='yes' address='N'/>` in the
/// live XML).
pub fn guest_cid(xml: &str) -> Option<u32> {
    let mut reader = NsReader::from_str(xml);
    // The names of the open elements, outermost first.
    let mut open: Vec<Vec<u8>> = Vec::new();
    loop {
        let (start, empty) = match reader.read_event().ok()? {
            Event::Start(e) => (Some(e), false),
            Event::Empty(e) => (Some(e), true),
            Event::End(_) => {
                open.pop();
                (None, false)
            }
            Event::Eof => return None,
            _ => (None, false),
        };
        let Some(element) = start else { continue };
        let name = element.name().as_ref().to_vec();
        if name == b"cid" && open.ends_with(&[b"devices".to_vec(), b"vsock".to_vec()]) {
            return attribute(&element, b"address")?.parse().ok();
        }
        if !empty {
            open.push(name);
        }
    }
}

/// The security drivers in libvirt's host capabilities XML (`<host><secmodel><model>`), in
/// order, e.g. `["none"]` or `["apparmor", "dac"]`.
pub fn security_models(capabilities: &str) -> Vec<String> {
    let mut reader = NsReader::from_str(capabilities);
    let mut open: Vec<Vec<u8>> = Vec::new();
    let mut models = Vec::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => open.push(e.name().as_ref().to_vec()),
            Ok(Event::End(_)) => {
                open.pop();
            }
            Ok(Event::Text(t))
                if open.ends_with(&[b"host".to_vec(), b"secmodel".to_vec(), b"model".to_vec()]) =>
            {
                if let Ok(text) = t.unescape() {
                    models.push(text.trim().to_owned());
                }
            }
            Ok(Event::Eof) | Err(_) => return models,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cid_from_live_xml() {
        let live = "<domain type='qemu'><name>vmlet-p</name><devices>\n<disk/><vsock model='virtio'>\n<cid auto='yes' address='7'/><alias name='vsock0'/></vsock></devices></domain>";
        assert_eq!(guest_cid(live), Some(7));
        assert_eq!(
            guest_cid("<domain><devices><vsock/></devices></domain>"),
            None
        );
        // A cid anywhere else (the metadata, say) is not the guest's.
        assert_eq!(
            guest_cid("<domain><metadata><cid address='9'/></metadata><devices/></domain>"),
            None
        );
        assert_eq!(
            guest_cid("<domain><devices><vsock><cid address='x'/>"),
            None
        );
        assert_eq!(guest_cid("not xml <<<"), None);
    }

    #[test]
    fn the_pod_id_comes_from_vmlets_namespace_whatever_its_prefix() {
        let ours = format!(
            r#"<domain><name>vmlet-p1</name><metadata><vmlet:pod xmlns:vmlet="{VMLET_METADATA_NS}" id="p1"/></metadata></domain>"#
        );
        assert_eq!(pod_id_in(&ours).as_deref(), Some("p1"));
        let other_prefix = format!(
            r#"<domain><metadata><x:pod id='p&amp;2' xmlns:x='{VMLET_METADATA_NS}'></x:pod></metadata></domain>"#
        );
        assert_eq!(pod_id_in(&other_prefix).as_deref(), Some("p&2"));
        let foreign = r#"<domain><metadata><y:pod xmlns:y="https://example.com/x" id="p3"/></metadata><pod id="p4"/></domain>"#;
        assert_eq!(pod_id_in(foreign), None);
    }

    #[test]
    fn security_models_come_from_the_hosts_secmodels() {
        let caps = "<capabilities><host><cpu><model>x</model></cpu>\
            <secmodel><model>apparmor</model><doi>0</doi></secmodel>\
            <secmodel><model>dac</model><doi>0</doi></secmodel></host>\
            <guest><secmodel><model>no</model></secmodel></guest></capabilities>";
        assert_eq!(security_models(caps), ["apparmor", "dac"]);
        assert!(security_models("<capabilities/>").is_empty());
    }
}
