//! A task's bundle: its spec loaded ([`load`], at the create) and what the create reads of
//! it besides the agent's request (the container's root, memory limit, host name and
//! environment, the pod's cgroup, the resolv.conf containerd wrote for it, a VM-mode pod's
//! identity), and the annotations the shim's start groups a pod's tasks by
//! ([`annotations_in`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use crate::host::pod_cgroup::PodCgroup;
use crate::Error;

/// The spec of the bundle at `bundle` (its `config.json`).
pub fn load(bundle: &Path) -> Result<Spec, Error> {
    Spec::load(bundle.join("config.json"))
        .map_err(|e| Error::InvalidArgument(format!("read {}/config.json: {e}", bundle.display())))
}

/// The spec's annotations (none: an empty map).
pub fn annotations(spec: &Spec) -> HashMap<String, String> {
    spec.annotations().clone().unwrap_or_default()
}

/// The annotations of the spec in the file at `path`, read before the shim parses any spec
/// (to group a pod's tasks under one shim); a file that is not there or not a spec with
/// string annotations has none.
pub fn annotations_in(path: &Path) -> HashMap<String, String> {
    std::fs::read(path)
        .ok()
        .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
        .and_then(|spec| serde_json::from_value(spec.get("annotations")?.clone()).ok())
        .unwrap_or_default()
}

/// The container's root directory in the bundle (`root.path`, else `rootfs`), absolute.
pub fn root(spec: &Spec, bundle: &Path) -> PathBuf {
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .unwrap_or_else(|| PathBuf::from("rootfs"));
    if root.is_absolute() {
        root
    } else {
        bundle.join(root)
    }
}

/// The host cgroup of the spec's `cgroupsPath`.
pub fn cgroup(spec: &Spec) -> Result<Option<PodCgroup>, Error> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().as_ref())
        .map(|p| PodCgroup::from_spec_path(&p.to_string_lossy()))
        .transpose()
}

/// The memory limit of a container's spec, in MiB.
pub fn memory_limit_mib(spec: &Spec) -> Option<u64> {
    crate::devices::memory::limit_mib(
        spec.linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.memory().as_ref())
            .and_then(|m| m.limit()),
    )
}

/// The spec's host name, when it names one.
pub fn hostname(spec: &Spec) -> Option<String> {
    spec.hostname().clone().filter(|h| !h.is_empty())
}

/// The process's environment (`NAME=value`).
pub fn env(spec: &Spec) -> Vec<String> {
    spec.process()
        .as_ref()
        .and_then(|p| p.env().clone())
        .unwrap_or_default()
}

/// The host file the spec binds over `/etc/resolv.conf` (the one containerd's CRI plugin
/// wrote for the pod).
pub fn resolv_conf(spec: &Spec) -> Option<PathBuf> {
    spec.mounts()
        .as_ref()?
        .iter()
        .find(|m| m.destination() == Path::new("/etc/resolv.conf"))
        .and_then(|m| m.source().clone())
}

/// A VM-mode pod's identity for cloud-init: its instance id the pod's UID, its host name
/// the spec's, else the pod's name; each else `id` (the sandbox's).
pub fn pod_identity(spec: &Spec, id: &str) -> (String, String) {
    let annotations = annotations(spec);
    let named = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
    (
        named(crate::spec::SANDBOX_UID_ANNOTATION).unwrap_or_else(|| id.to_owned()),
        hostname(spec)
            .or_else(|| named(crate::spec::SANDBOX_NAME_ANNOTATION))
            .unwrap_or_else(|| id.to_owned()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_a_spec_groups_by_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        assert!(annotations_in(&config).is_empty());
        std::fs::write(&config, "not json").unwrap();
        assert!(annotations_in(&config).is_empty());
        std::fs::write(
            &config,
            r#"{"ociVersion": "1.0.2", "annotations": {"io.kubernetes.cri.sandbox-id": "p1"}}"#,
        )
        .unwrap();
        assert_eq!(
            annotations_in(&config)["io.kubernetes.cri.sandbox-id"],
            "p1"
        );
    }

    #[test]
    fn a_vm_mode_pod_is_known_by_its_uid_and_name_else_its_id() {
        let spec: Spec = serde_json::from_str(
            r#"{"ociVersion": "1.0.2", "annotations": {
                "io.kubernetes.cri.sandbox-uid": "uid-1",
                "io.kubernetes.cri.sandbox-name": "web-0"}}"#,
        )
        .unwrap();
        assert_eq!(pod_identity(&spec, "p1"), ("uid-1".into(), "web-0".into()));
        let bare: Spec = serde_json::from_str(r#"{"ociVersion": "1.0.2"}"#).unwrap();
        assert_eq!(pod_identity(&bare, "p1"), ("p1".into(), "p1".into()));
        assert_eq!(root(&bare, Path::new("/b")), Path::new("/b/rootfs"));
    }
}
