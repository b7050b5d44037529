//! The pod's side of a spec: whether the task brings up its pod's VM or joins one, the
//! network namespace carried into the VM, the namespaces a pod's container shares with its
//! sandbox, and the limits that size the VM.

use std::collections::HashMap;
use std::path::PathBuf;

use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::Error;

/// The pod network namespace to carry into the VM: the path of the spec's network
/// namespace. A network namespace without a path means a new, empty one (the VM gets no
/// NIC, as runc gives such a container only loopback); no network namespace at all means
/// the host's network, which a VM cannot share.
pub fn network_namespace(spec: &Spec) -> Result<Option<PathBuf>, Error> {
    let namespaces = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default();
    match namespaces
        .iter()
        .find(|n| n.typ() == LinuxNamespaceType::Network)
    {
        Some(ns) => Ok(ns.path().clone()),
        None => Err(Error::Unimplemented(
            "the host network namespace (--net-host)".into(),
        )),
    }
}

/// CRI's sandbox annotations with the pod's summed limits (containerd 1.7 and later, when
/// kubelet sends the pod's resources).
const SANDBOX_CPU_QUOTA: &str = "io.kubernetes.cri.sandbox-cpu-quota";
const SANDBOX_CPU_PERIOD: &str = "io.kubernetes.cri.sandbox-cpu-period";
const SANDBOX_MEMORY: &str = "io.kubernetes.cri.sandbox-memory";

/// The pod's limits for sizing its VM: CRI's sandbox annotations where containerd gives
/// them, else the spec's own `linux.resources` (`ctr run --cpus/--memory-limit`). A bad
/// annotation value is an error naming it.
pub fn pod_limits(
    spec: &Spec,
    annotations: &HashMap<String, String>,
) -> Result<vmlet_config::PodLimits, Error> {
    fn number<T: std::str::FromStr>(
        annotations: &HashMap<String, String>,
        key: &str,
    ) -> Result<Option<T>, Error> {
        annotations
            .get(key)
            .map(|v| {
                v.trim().parse::<T>().map_err(|_| {
                    Error::InvalidArgument(format!("annotation {key}: {v:?} is not a number"))
                })
            })
            .transpose()
    }
    let quota = number::<i64>(annotations, SANDBOX_CPU_QUOTA)?;
    let period = number::<u64>(annotations, SANDBOX_CPU_PERIOD)?;
    let memory = number::<i64>(annotations, SANDBOX_MEMORY)?;
    if quota.is_some() || memory.is_some() {
        return Ok(vmlet_config::PodLimits::from_cgroup_values(
            quota.unwrap_or(0),
            period.unwrap_or(0),
            memory.unwrap_or(0),
        ));
    }
    let resources = spec.linux().as_ref().and_then(|l| l.resources().as_ref());
    let cpu = resources.and_then(|r| r.cpu().as_ref());
    Ok(vmlet_config::PodLimits::from_cgroup_values(
        cpu.and_then(|c| c.quota()).unwrap_or(0),
        cpu.and_then(|c| c.period()).unwrap_or(0),
        resources
            .and_then(|r| r.memory().as_ref())
            .and_then(|m| m.limit())
            .unwrap_or(0),
    ))
}

/// What the shim knows of a running pod when one more of its containers is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodSoFar {
    /// The PID the shim reported for the sandbox task (every task of a pod reports its
    /// VM's host PID).
    pub sandbox_pid: u32,
    /// Whether a container of the pod already runs in a PID namespace of its own: the pod
    /// does not share its process namespace.
    pub own_pid_namespaces: bool,
}

/// The namespaces a task shares with its pod sandbox: CRI gives a container of a pod the
/// sandbox's IPC and UTS namespaces (and its PID namespace with shareProcessNamespace) as
/// `/proc/<sandbox pid>/ns/<name>`. In the VM that means joining the sandbox container's.
/// A path anywhere else (a sandbox's own, another process's) is refused, not silently
/// replaced by a new namespace. CRI's TARGET mode (`kubectl debug --target`) names the
/// target container's PID, which is the sandbox's too: in a pod whose containers have PID
/// namespaces of their own it is refused by name, since the target cannot be told (in a
/// pod that shares its process namespace the target runs in the sandbox's, which is joined).
/// `pod` is what the shim knows of a running sandbox (none: unknown, checked later).
pub fn shared_namespaces(
    spec: &Spec,
    role: &PodRole,
    pod: Option<PodSoFar>,
) -> Result<Vec<String>, Error> {
    let namespaces = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default();
    let mut shared = Vec::new();
    for ns in namespaces.iter().filter(|n| n.path().is_some()) {
        let name = match ns.typ() {
            LinuxNamespaceType::Network | LinuxNamespaceType::Mount => continue,
            LinuxNamespaceType::Ipc => "ipc",
            LinuxNamespaceType::Uts => "uts",
            LinuxNamespaceType::Pid => "pid",
            other => {
                return Err(Error::Unimplemented(format!(
                    "joining an existing {other:?} namespace"
                )))
            }
        };
        let path = ns.path().as_ref().map(|p| p.display().to_string());
        let path = path.unwrap_or_default();
        let sandboxs = pod.map(|p| format!("/proc/{}/ns/{name}", p.sandbox_pid));
        let foreign = match role {
            PodRole::Sandbox => true,
            PodRole::Container { .. } => sandboxs.is_some_and(|s| s != path),
        };
        if foreign {
            return Err(Error::Unimplemented(format!(
                "joining the {name} namespace at {path} (only a pod's containers share the sandbox's)"
            )));
        }
        if name == "pid" && pod.is_some_and(|p| p.own_pid_namespaces) {
            return Err(Error::Unimplemented(format!(
                "joining another container's PID namespace ({path}, CRI's TARGET mode, as `kubectl debug --target` asks: every task of a vmlet pod reports its VM's host PID, so the target cannot be told; leave out --target and the container still runs in the pod's VM, or give the pod shareProcessNamespace: true)"
            )));
        }
        shared.push(name.to_owned());
    }
    Ok(shared)
}

/// CRI's annotation naming a task's role: `sandbox` or `container`.
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";
/// The image a CRI container was created from, as the pod spec names it.
pub const IMAGE_NAME_ANNOTATION: &str = "io.kubernetes.cri.image-name";
/// CRI's annotation naming the pod (sandbox) a task belongs to.
pub const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";
/// CRI's annotations on a sandbox naming the pod: its UID and name.
pub const SANDBOX_UID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-uid";
pub const SANDBOX_NAME_ANNOTATION: &str = "io.kubernetes.cri.sandbox-name";
pub const SANDBOX_NAMESPACE_ANNOTATION: &str = "io.kubernetes.cri.sandbox-namespace";

/// A CRI pod's Kubernetes name and namespace, from its sandbox's annotations.
pub fn kube_names(annotations: &HashMap<String, String>) -> Option<(String, String)> {
    Some((
        annotations.get(SANDBOX_NAME_ANNOTATION)?.clone(),
        annotations.get(SANDBOX_NAMESPACE_ANNOTATION)?.clone(),
    ))
}

/// What an operator knows task `id`'s pod by: Kubernetes' names (CRI), else containerd's
/// namespace and the task's id.
pub fn pod_names(
    id: &str,
    annotations: &HashMap<String, String>,
    containerd_namespace: &str,
) -> crate::host::pod_record::PodNames {
    let (name, namespace) =
        kube_names(annotations).unwrap_or_else(|| (id.to_owned(), containerd_namespace.to_owned()));
    crate::host::pod_record::PodNames { namespace, name }
}

/// Whether a task brings up its pod's VM or joins an existing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodRole {
    /// A pod sandbox, or a plain task (`ctr run`): it owns a VM.
    Sandbox,
    /// A container of the pod `sandbox_id`: it runs in that pod's VM.
    Container { sandbox_id: String },
}

/// Reads the task's role from CRI's annotations.
pub fn pod_role(annotations: &HashMap<String, String>) -> Result<PodRole, Error> {
    match annotations
        .get(CONTAINER_TYPE_ANNOTATION)
        .map(String::as_str)
    {
        None | Some("sandbox") => Ok(PodRole::Sandbox),
        Some("container") => match annotations.get(SANDBOX_ID_ANNOTATION) {
            Some(id) if !id.is_empty() => Ok(PodRole::Container {
                sandbox_id: id.clone(),
            }),
            _ => Err(Error::InvalidArgument(format!(
                "a container task needs the {SANDBOX_ID_ANNOTATION} annotation"
            ))),
        },
        Some(other) => Err(Error::InvalidArgument(format!(
            "annotation {CONTAINER_TYPE_ANNOTATION}: unknown value {other:?}"
        ))),
    }
}

/// The shim grouping key: every task of one pod goes to one shim (and one VM).
pub fn grouping(annotations: &HashMap<String, String>, task_id: &str) -> String {
    annotations
        .get(SANDBOX_ID_ANNOTATION)
        .filter(|id| !id.is_empty())
        .cloned()
        .unwrap_or_else(|| task_id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{spec, BASE};
    use super::*;

    /// The base spec with `namespaces` (a JSON list) as its Linux namespaces.
    fn with(namespaces: &str) -> Spec {
        spec(&BASE.replace(
            r#""hostname": "box","#,
            &format!(r#""hostname": "box", "linux": {{"namespaces": {namespaces}}},"#),
        ))
    }

    #[test]
    fn network_namespace_path_empty_or_host() {
        let pod = with(r#"[{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]"#);
        assert_eq!(
            network_namespace(&pod).unwrap(),
            Some(PathBuf::from("/var/run/netns/cni-1"))
        );
        assert_eq!(
            network_namespace(&with(r#"[{"type": "network"}]"#)).unwrap(),
            None
        );
        let err = network_namespace(&with(r#"[{"type": "pid"}]"#)).unwrap_err();
        assert!(err.to_string().contains("host network"), "{err}");
    }

    /// A pod whose sandbox reported `pid` and whose containers so far share its PID namespace.
    fn sharing(pid: u32) -> PodSoFar {
        PodSoFar {
            sandbox_pid: pid,
            own_pid_namespaces: false,
        }
    }

    #[test]
    fn pod_containers_share_the_sandboxs_namespaces_only() {
        let container = PodRole::Container {
            sandbox_id: "pod".into(),
        };
        let cri = with(
            r#"[{"type": "pid"}, {"type": "ipc", "path": "/proc/7/ns/ipc"}, {"type": "uts", "path": "/proc/7/ns/uts"}, {"type": "network", "path": "/var/run/netns/x"}, {"type": "mount"}]"#,
        );
        assert_eq!(
            shared_namespaces(&cri, &container, Some(sharing(7))).unwrap(),
            ["ipc", "uts"]
        );
        let own = with(r#"[{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}]"#);
        assert!(shared_namespaces(&own, &container, Some(sharing(7)))
            .unwrap()
            .is_empty());
        let shared_pid = with(r#"[{"type": "pid", "path": "/proc/7/ns/pid"}]"#);
        assert_eq!(
            shared_namespaces(&shared_pid, &container, Some(sharing(7))).unwrap(),
            ["pid"]
        );
        // A path that is not the sandbox's.
        let err = shared_namespaces(&shared_pid, &container, Some(sharing(9))).unwrap_err();
        assert!(
            err.to_string().contains("pid namespace at /proc/7/ns/pid"),
            "{err}"
        );
        // CRI's TARGET mode in a pod whose containers have PID namespaces of their own.
        let separate = PodSoFar {
            own_pid_namespaces: true,
            ..sharing(7)
        };
        let err = shared_namespaces(&shared_pid, &container, Some(separate)).unwrap_err();
        assert!(err.to_string().contains("kubectl debug --target"), "{err}");
        assert_eq!(
            shared_namespaces(&cri, &container, Some(separate)).unwrap(),
            ["ipc", "uts"]
        );
        let err = shared_namespaces(&cri, &PodRole::Sandbox, None).unwrap_err();
        assert!(err.to_string().contains("/proc/7/ns/ipc"), "{err}");
    }

    #[test]
    fn pod_limits_from_cri_annotations_or_the_spec() {
        let limited = spec(&BASE.replace(
            r#""hostname": "box","#,
            r#""hostname": "box", "linux": {"resources": {"cpu": {"quota": 150000, "period": 100000}, "memory": {"limit": 314572800}}},"#,
        ));
        let none = HashMap::new();
        let limits = pod_limits(&limited, &none).unwrap();
        assert_eq!((limits.vcpus, limits.memory_mib), (Some(2), Some(300)));
        let cri: HashMap<String, String> = [
            (SANDBOX_CPU_QUOTA, "400000"),
            (SANDBOX_CPU_PERIOD, "100000"),
            (SANDBOX_MEMORY, "1073741824"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let limits = pod_limits(&limited, &cri).unwrap();
        assert_eq!((limits.vcpus, limits.memory_mib), (Some(4), Some(1024)));
        let bad: HashMap<String, String> =
            [(SANDBOX_MEMORY.to_string(), "lots".to_string())].into();
        let err = pod_limits(&limited, &bad).unwrap_err();
        assert!(err.message().contains(SANDBOX_MEMORY), "{}", err.message());
        let plain = spec(BASE);
        assert_eq!(pod_limits(&plain, &none).unwrap(), Default::default());
    }

    #[test]
    fn roles_and_grouping_follow_cri_annotations() {
        let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(pod_role(&map(&[])).unwrap(), PodRole::Sandbox);
        let sandbox = map(&[
            (CONTAINER_TYPE_ANNOTATION, "sandbox"),
            (SANDBOX_ID_ANNOTATION, "p1"),
        ]);
        assert_eq!(pod_role(&sandbox).unwrap(), PodRole::Sandbox);
        assert_eq!(grouping(&sandbox, "p1"), "p1");
        let container = map(&[
            (CONTAINER_TYPE_ANNOTATION, "container"),
            (SANDBOX_ID_ANNOTATION, "p1"),
        ]);
        assert_eq!(
            pod_role(&container).unwrap(),
            PodRole::Container {
                sandbox_id: "p1".into()
            }
        );
        assert_eq!(grouping(&container, "c1"), "p1");
        assert_eq!(grouping(&map(&[]), "t1"), "t1");
        assert!(pod_role(&map(&[(CONTAINER_TYPE_ANNOTATION, "container")])).is_err());
        assert!(pod_role(&map(&[(CONTAINER_TYPE_ANNOTATION, "weird")])).is_err());
    }

    #[test]
    fn kube_names_need_both_annotations() {
        let mut a = HashMap::new();
        a.insert(
            "io.kubernetes.cri.sandbox-name".to_owned(),
            "web".to_owned(),
        );
        assert_eq!(kube_names(&a), None);
        a.insert(
            "io.kubernetes.cri.sandbox-namespace".to_owned(),
            "prod".to_owned(),
        );
        assert_eq!(kube_names(&a), Some(("web".into(), "prod".into())));
    }
}
