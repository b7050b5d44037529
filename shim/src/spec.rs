//! OCI spec -> agent request: the shim checks the spec and keeps only what the guest uses.

use std::collections::HashMap;
use std::path::PathBuf;

use oci_spec::runtime::{LinuxNamespaceType, PosixRlimitType, Spec};
use vmlet_protocol::agent::{
    CreateContainerRequest, Mount, Process, Resources, Rlimit, Seccomp, Stdio, User,
};

use crate::Error;

/// File systems the guest mounts itself inside the container.
const GUEST_LOCAL_FS: &[&str] = &[
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2",
];

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

/// The namespaces a task shares with its pod sandbox: CRI gives a container of a pod the
/// sandbox's IPC and UTS namespaces (and its PID namespace with shareProcessNamespace) as
/// `/proc/<sandbox pid>/ns/<name>`. In the VM that means joining the sandbox container's.
/// A path anywhere else (another container's, as CRI's TARGET mode gives, or a sandbox's
/// own) is refused, not silently replaced by a new namespace. `sandbox_pid` is the PID the
/// shim reported for the sandbox task (none: unknown, checked later).
pub fn shared_namespaces(
    spec: &Spec,
    role: &PodRole,
    sandbox_pid: Option<u32>,
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
        let sandboxs = sandbox_pid.map(|pid| format!("/proc/{pid}/ns/{name}"));
        let foreign = match role {
            PodRole::Sandbox => true,
            PodRole::Container { .. } => sandboxs.is_some_and(|s| s != path),
        };
        if foreign {
            return Err(Error::Unimplemented(format!(
                "joining the {name} namespace at {path} (only a pod's containers share the sandbox's)"
            )));
        }
        shared.push(name.to_owned());
    }
    Ok(shared)
}

/// CRI's annotation naming a task's role: `sandbox` or `container`.
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";
/// CRI's annotation naming the pod (sandbox) a task belongs to.
pub const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

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

/// A host path a container bind-mounts: the shim binds it into the share at `share_path`
/// (relative to the share's root), where the guest binds it into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBind {
    pub source: PathBuf,
    pub share_path: String,
    pub readonly: bool,
}

/// Whether a mount's options leave it read-only (`ro` or `rro`; the last of them and `rw`
/// wins, as the agent reads them). The host side of a share bind is read-only with all its
/// submounts either way: the guest sees one file system there.
fn is_readonly(options: &[String]) -> bool {
    options
        .iter()
        .rev()
        .find_map(|o| match o.as_str() {
            "ro" | "rro" => Some(true),
            "rw" => Some(false),
            _ => None,
        })
        .unwrap_or(false)
}

fn is_bind(fstype: &str, options: &[String]) -> bool {
    fstype == "bind" || options.iter().any(|o| o == "bind" || o == "rbind")
}

/// Path of a container's rootfs inside the VM's shared directory.
pub fn rootfs_in_share(container_id: &str) -> String {
    format!("{container_id}/rootfs")
}

fn rlimit_resource(kind: PosixRlimitType) -> u32 {
    match kind {
        PosixRlimitType::RlimitCpu => libc::RLIMIT_CPU,
        PosixRlimitType::RlimitFsize => libc::RLIMIT_FSIZE,
        PosixRlimitType::RlimitData => libc::RLIMIT_DATA,
        PosixRlimitType::RlimitStack => libc::RLIMIT_STACK,
        PosixRlimitType::RlimitCore => libc::RLIMIT_CORE,
        PosixRlimitType::RlimitRss => libc::RLIMIT_RSS,
        PosixRlimitType::RlimitNproc => libc::RLIMIT_NPROC,
        PosixRlimitType::RlimitNofile => libc::RLIMIT_NOFILE,
        PosixRlimitType::RlimitMemlock => libc::RLIMIT_MEMLOCK,
        PosixRlimitType::RlimitAs => libc::RLIMIT_AS,
        PosixRlimitType::RlimitLocks => libc::RLIMIT_LOCKS,
        PosixRlimitType::RlimitSigpending => libc::RLIMIT_SIGPENDING,
        PosixRlimitType::RlimitMsgqueue => libc::RLIMIT_MSGQUEUE,
        PosixRlimitType::RlimitNice => libc::RLIMIT_NICE,
        PosixRlimitType::RlimitRtprio => libc::RLIMIT_RTPRIO,
        PosixRlimitType::RlimitRttime => libc::RLIMIT_RTTIME,
    }
}

/// The agent's view of an OCI process (a container's, or an exec's). `what` names it in
/// errors.
pub fn agent_process(process: &oci_spec::runtime::Process, what: &str) -> Result<Process, Error> {
    let args = process.args().clone().unwrap_or_default();
    if args.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} has no args")));
    }
    let user = process.user();
    Ok(Process {
        args,
        env: process.env().clone().unwrap_or_default(),
        cwd: process.cwd().to_string_lossy().into_owned(),
        user: Some(User {
            uid: user.uid(),
            gid: user.gid(),
            additional_gids: user.additional_gids().clone().unwrap_or_default(),
            ..Default::default()
        })
        .into(),
        rlimits: process
            .rlimits()
            .iter()
            .flatten()
            .map(|r| Rlimit {
                resource: rlimit_resource(r.typ()),
                soft: r.soft(),
                hard: r.hard(),
                ..Default::default()
            })
            .collect(),
        terminal: process.terminal().unwrap_or(false),
        capabilities: process
            .capabilities()
            .as_ref()
            .map(|c| crate::capabilities::agent_capabilities(c, what))
            .transpose()?
            .into(),
        no_new_privileges: process.no_new_privileges().unwrap_or(false),
        ..Default::default()
    })
}

/// The cgroup limits of OCI resources (CPU shares become cgroup v2's weight as runc
/// converts them).
pub fn agent_resources(r: &oci_spec::runtime::LinuxResources) -> Resources {
    let cpu = r.cpu().as_ref();
    let weight = cpu
        .and_then(|c| c.shares())
        .filter(|s| *s > 0)
        .map_or(0, |s| 1 + (s.saturating_sub(2) * 9999) / 262_142);
    Resources {
        memory_limit: r.memory().as_ref().and_then(|m| m.limit()).unwrap_or(0),
        cpu_quota: cpu.and_then(|c| c.quota()).unwrap_or(0),
        cpu_period: cpu.and_then(|c| c.period()).unwrap_or(0),
        cpu_weight: weight,
        pids_limit: r.pids().as_ref().map_or(0, |p| p.limit()),
        ..Default::default()
    }
}

/// The resources of an update request: containerd sends OCI `LinuxResources` as JSON.
pub fn update_resources(json: &[u8], task_id: &str) -> Result<Resources, Error> {
    let r: oci_spec::runtime::LinuxResources = serde_json::from_slice(json).map_err(|e| {
        Error::InvalidArgument(format!(
            "update of task {task_id}: resources are not valid: {e}"
        ))
    })?;
    Ok(agent_resources(&r))
}

/// The process of an exec request: containerd sends the OCI process as JSON.
pub fn exec_process(json: &[u8], exec_id: &str) -> Result<Process, Error> {
    let process: oci_spec::runtime::Process = serde_json::from_slice(json).map_err(|e| {
        Error::InvalidArgument(format!(
            "exec {exec_id}: the process spec is not valid: {e}"
        ))
    })?;
    agent_process(&process, &format!("exec {exec_id}'s process"))
}

/// Builds the agent's create request and the host paths to bind into the share. Which stdio
/// streams exist is the caller's to say.
pub fn create_request(
    container_id: &str,
    spec: &Spec,
    stdio: Stdio,
) -> Result<(CreateContainerRequest, Vec<HostBind>), Error> {
    let process = spec
        .process()
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the OCI spec has no process".into()))?;
    let mut process = agent_process(process, "the OCI spec's process")?;
    let linux = spec.linux().as_ref();
    if let Some(profile) = linux.and_then(|l| l.seccomp().as_ref()) {
        let compiled = crate::seccomp::compile(profile)?;
        process.seccomp = Some(Seccomp {
            program: compiled.program,
            flags: compiled.flags,
            ..Default::default()
        })
        .into();
    }
    let mut mounts = Vec::new();
    let mut binds = Vec::new();
    for m in spec.mounts().iter().flatten() {
        let fstype = m.typ().clone().unwrap_or_default();
        let destination = m.destination().to_string_lossy().into_owned();
        let options = m.options().clone().unwrap_or_default();
        if is_bind(&fstype, &options) {
            let source = m.source().clone().ok_or_else(|| {
                Error::InvalidArgument(format!("bind mount at {destination} has no source"))
            })?;
            if !source.exists() {
                return Err(Error::InvalidArgument(format!(
                    "bind mount source {} for {destination} does not exist",
                    source.display()
                )));
            }
            let share_path = format!("{container_id}/mounts/{}", binds.len());
            binds.push(HostBind {
                source,
                share_path: share_path.clone(),
                readonly: is_readonly(&options),
            });
            mounts.push(Mount {
                destination,
                type_: "bind".into(),
                source: share_path,
                options,
                ..Default::default()
            });
            continue;
        }
        if !GUEST_LOCAL_FS.contains(&fstype.as_str()) {
            return Err(Error::Unimplemented(format!(
                "mount of type {fstype:?} at {destination} (only binds and guest-local file systems are supported)"
            )));
        }
        mounts.push(Mount {
            destination,
            type_: fstype,
            source: m
                .source()
                .as_ref()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            options,
            ..Default::default()
        });
    }
    let request = CreateContainerRequest {
        container_id: container_id.into(),
        rootfs: rootfs_in_share(container_id),
        readonly_rootfs: spec
            .root()
            .as_ref()
            .and_then(|r| r.readonly())
            .unwrap_or(false),
        hostname: spec.hostname().clone().unwrap_or_default(),
        process: Some(process).into(),
        mounts,
        stdio: Some(stdio).into(),
        resources: linux
            .and_then(|l| l.resources().as_ref())
            .map(agent_resources)
            .into(),
        masked_paths: linux
            .and_then(|l| l.masked_paths().clone())
            .unwrap_or_default(),
        readonly_paths: linux
            .and_then(|l| l.readonly_paths().clone())
            .unwrap_or_default(),
        sysctls: linux
            .and_then(|l| l.sysctl().clone())
            .unwrap_or_default()
            .into_iter()
            .collect(),
        all_guest_devices: crate::block_devices::every_device_allowed(spec),
        ..Default::default()
    };
    Ok((request, binds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    const BASE: &str = r#"{
        "ociVersion": "1.0.2",
        "process": {"args": ["sh", "-c", "exit 7"], "env": ["PATH=/bin"], "cwd": "/",
                    "user": {"uid": 1000, "gid": 100, "additionalGids": [10]},
                    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 512}]},
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "box",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]}]
    }"#;

    #[test]
    fn translates_process_mounts_and_root() {
        let (req, binds) = create_request("c1", &spec(BASE), Stdio::default()).unwrap();
        assert!(binds.is_empty());
        assert_eq!(req.rootfs, "c1/rootfs");
        assert!(req.readonly_rootfs);
        assert_eq!(req.hostname, "box");
        let p = req.process.unwrap();
        assert_eq!(p.args, ["sh", "-c", "exit 7"]);
        let user = p.user.unwrap();
        assert_eq!(
            (user.uid, user.gid, user.additional_gids.clone()),
            (1000, 100, vec![10])
        );
        assert_eq!(p.rlimits[0].resource, libc::RLIMIT_NOFILE);
        assert_eq!((p.rlimits[0].soft, p.rlimits[0].hard), (512, 1024));
        assert_eq!(req.mounts.len(), 2);
        assert_eq!(req.mounts[1].options, ["nosuid", "mode=755"]);
    }

    #[test]
    fn bind_mounts_go_through_the_share() {
        let dir = std::env::temp_dir();
        let s = spec(&BASE.replace(
            r#"{"destination": "/proc", "type": "proc", "source": "proc"}"#,
            &format!(r#"{{"destination": "/data", "type": "bind", "source": "{}", "options": ["rbind", "ro"]}}"#, dir.display()),
        ));
        let (req, binds) = create_request("c1", &s, Stdio::default()).unwrap();
        assert_eq!(
            binds,
            [HostBind {
                source: dir,
                share_path: "c1/mounts/0".into(),
                readonly: true
            }]
        );
        let m = &req.mounts[0];
        assert_eq!(
            (m.destination.as_str(), m.type_.as_str(), m.source.as_str()),
            ("/data", "bind", "c1/mounts/0")
        );
    }

    #[test]
    fn recursive_read_only_binds_are_read_only_on_the_host_too() {
        let opts = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_readonly(&opts(&["rbind", "rprivate", "rro"])));
        assert!(is_readonly(&opts(&["rw", "ro"])));
        assert!(!is_readonly(&opts(&["ro", "rw"])));
        assert!(!is_readonly(&opts(&["rbind"])));
    }

    #[test]
    fn missing_bind_source_is_refused_clearly() {
        let s = spec(&BASE.replace(
            r#"{"destination": "/proc", "type": "proc", "source": "proc"}"#,
            r#"{"destination": "/data", "type": "none", "source": "/nonexistent/vmlet", "options": ["rbind"]}"#,
        ));
        let err = create_request("c1", &s, Stdio::default()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/vmlet"), "{err}");
    }

    #[test]
    fn other_host_file_systems_are_refused_clearly() {
        let s = spec(&BASE.replace(
            r#"{"destination": "/proc", "type": "proc", "source": "proc"}"#,
            r#"{"destination": "/data", "type": "nfs", "source": "srv:/x"}"#,
        ));
        let err = create_request("c1", &s, Stdio::default()).unwrap_err();
        assert!(err.to_string().contains("/data"), "{err}");
    }

    #[test]
    fn network_namespace_path_empty_or_host() {
        let with = |namespaces: &str| {
            spec(&BASE.replace(
                r#""hostname": "box","#,
                &format!(r#""hostname": "box", "linux": {{"namespaces": {namespaces}}},"#),
            ))
        };
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

    #[test]
    fn pod_containers_share_the_sandboxs_namespaces_only() {
        let with = |namespaces: &str| {
            spec(&BASE.replace(
                r#""hostname": "box","#,
                &format!(r#""hostname": "box", "linux": {{"namespaces": {namespaces}}},"#),
            ))
        };
        let container = PodRole::Container {
            sandbox_id: "pod".into(),
        };
        let cri = with(
            r#"[{"type": "pid"}, {"type": "ipc", "path": "/proc/7/ns/ipc"}, {"type": "uts", "path": "/proc/7/ns/uts"}, {"type": "network", "path": "/var/run/netns/x"}, {"type": "mount"}]"#,
        );
        assert_eq!(
            shared_namespaces(&cri, &container, Some(7)).unwrap(),
            ["ipc", "uts"]
        );
        let own = with(r#"[{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}]"#);
        assert!(shared_namespaces(&own, &container, Some(7))
            .unwrap()
            .is_empty());
        let shared_pid = with(r#"[{"type": "pid", "path": "/proc/7/ns/pid"}]"#);
        assert_eq!(
            shared_namespaces(&shared_pid, &container, Some(7)).unwrap(),
            ["pid"]
        );
        // CRI's TARGET mode: another container's PID namespace.
        let err = shared_namespaces(&shared_pid, &container, Some(9)).unwrap_err();
        assert!(
            err.to_string().contains("pid namespace at /proc/7/ns/pid"),
            "{err}"
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
    fn resources_become_cgroup_limits() {
        let r = update_resources(
            br#"{"memory":{"limit":67108864},"cpu":{"shares":1024,"quota":50000,"period":100000},"pids":{"limit":64}}"#,
            "t1",
        )
        .unwrap();
        assert_eq!(r.memory_limit, 64 << 20);
        assert_eq!((r.cpu_quota, r.cpu_period), (50_000, 100_000));
        assert_eq!(r.cpu_weight, 39, "runc's conversion of 1024 shares");
        assert_eq!(r.pids_limit, 64);
        let none = update_resources(b"{}", "t1").unwrap();
        assert_eq!(
            (none.memory_limit, none.cpu_weight, none.pids_limit),
            (0, 0, 0)
        );
        let err = update_resources(b"[1]", "t9").unwrap_err();
        assert!(err.to_string().contains("task t9"), "{err}");
    }

    #[test]
    fn terminal_reaches_the_agent() {
        let s = spec(&BASE.replace(r#""args""#, r#""terminal": true, "args""#));
        let (req, _) = create_request("c1", &s, Stdio::default()).unwrap();
        assert!(req.process.terminal);
    }

    #[test]
    fn sysctls_reach_the_agent() {
        let json = BASE.replace(
            r#""hostname""#,
            r#""linux": {"sysctl": {"net.ipv4.ip_forward": "1"}}, "hostname""#,
        );
        let (req, _) = create_request("c1", &spec(&json), Stdio::default()).unwrap();
        assert_eq!(req.sysctls["net.ipv4.ip_forward"], "1");
    }

    #[test]
    fn a_privileged_container_gets_the_guest_s_devices() {
        let privileged = BASE.replace(
            r#""hostname""#,
            r#""linux": {"resources": {"devices": [{"allow": true, "access": "rwm"}]}}, "hostname""#,
        );
        let (req, _) = create_request("c1", &spec(&privileged), Stdio::default()).unwrap();
        assert!(req.all_guest_devices);
        let one_class = BASE.replace(
            r#""hostname""#,
            r#""linux": {"resources": {"devices": [{"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]}}, "hostname""#,
        );
        let (req, _) = create_request("c1", &spec(&one_class), Stdio::default()).unwrap();
        assert!(!req.all_guest_devices);
    }

    #[test]
    fn the_seccomp_profile_reaches_the_agent_compiled() {
        let with = |profile: &str| {
            let json = BASE.replace(
                r#""hostname""#,
                &format!(r#""linux": {{"seccomp": {profile}}}, "hostname""#),
            );
            create_request("c1", &spec(&json), Stdio::default())
        };
        let (req, _) =
            with(r#"{"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"]}"#)
                .unwrap();
        let seccomp = req.process.seccomp.as_ref().unwrap();
        assert_eq!((seccomp.program.len() % 8, seccomp.flags), (0, 2));
        let (req, _) = create_request("c1", &spec(BASE), Stdio::default()).unwrap();
        assert!(req.process.seccomp.is_none());
        let err = with(r#"{"defaultAction": "SCMP_ACT_NOTIFY"}"#).unwrap_err();
        assert!(err.to_string().contains("SCMP_ACT_NOTIFY"), "{err}");
    }

    #[test]
    fn exec_process_from_containerd_json() {
        let p = exec_process(
            br#"{"args":["sh","-c","true"],"cwd":"/tmp","env":["A=1"],"user":{"uid":5,"gid":6},"terminal":true}"#,
            "e1",
        )
        .unwrap();
        assert_eq!(p.args, ["sh", "-c", "true"]);
        assert_eq!((p.cwd.as_str(), p.user.uid, p.user.gid), ("/tmp", 5, 6));
        assert!(p.terminal);
        let err = exec_process(br#"{"args":[],"cwd":"/"}"#, "e2").unwrap_err();
        assert!(err.to_string().contains("exec e2"), "{err}");
        let err = exec_process(b"not json", "e3").unwrap_err();
        assert!(err.to_string().contains("exec e3"), "{err}");
    }
}
