//! The container's side of a spec: the agent's create request (process, mounts, root,
//! resources, seccomp, sysctls, devices), exec processes and resource updates from
//! containerd's JSON, and the host paths the container binds (through the share).

use std::path::PathBuf;

use oci_spec::runtime::{PosixRlimitType, Spec};
use vmlet_protocol::agent::{
    ConsoleSize, CreateContainerRequest, Mount, Process, Resources, Rlimit, Seccomp, Stdio, User,
};

use crate::Error;

/// File systems the guest mounts itself inside the container.
const GUEST_LOCAL_FS: &[&str] = &[
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2",
];

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
pub fn is_readonly(options: &[String]) -> bool {
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

/// The terminal size a process starts with (the spec's `consoleSize`, which nerdctl sets
/// for `exec -t`), checked to fit a terminal's 16-bit fields; ignored without a terminal,
/// as runc does.
fn console_size(
    process: &oci_spec::runtime::Process,
    what: &str,
) -> Result<Option<ConsoleSize>, Error> {
    let Some(size) = process
        .console_size()
        .filter(|_| process.terminal() == Some(true))
    else {
        return Ok(None);
    };
    let (height, width) = (size.height(), size.width());
    let cell = |n: u64| u32::try_from(n).ok().filter(|n| *n <= u32::from(u16::MAX));
    match (cell(height), cell(width)) {
        (Some(height), Some(width)) => Ok(Some(ConsoleSize {
            height,
            width,
            ..Default::default()
        })),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: consoleSize {height}x{width} is larger than a terminal can be (65535x65535)"
        ))),
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
            .map(|c| crate::spec::capabilities::agent_capabilities(c, what))
            .transpose()?
            .into(),
        no_new_privileges: process.no_new_privileges().unwrap_or(false),
        console_size: console_size(process, what)?.into(),
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
        let compiled = crate::spec::seccomp::compile(profile)?;
        process.seccomp = Some(Seccomp {
            program: compiled.program,
            flags: compiled.flags,
            ..Default::default()
        })
        .into();
    }
    let (mounts, binds) = guest_mounts(container_id, spec)?;
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
        all_guest_devices: crate::spec::devices::every_device_allowed(spec),
        ..Default::default()
    };
    Ok((request, binds))
}

/// The spec's mounts as the guest makes them, and the host paths the binds among them
/// take into the share (a pod's memory emptyDir is the guest's own tmpfs, shared by the
/// pod's containers).
fn guest_mounts(container_id: &str, spec: &Spec) -> Result<(Vec<Mount>, Vec<HostBind>), Error> {
    let mut mounts = Vec::new();
    let mut binds = Vec::new();
    // The CRI plugin names the container's pod (containerd 1.7 and later).
    let pod_uid = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(super::SANDBOX_UID_ANNOTATION))
        .map(String::as_str);
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
            if let Some(bind) = super::pod_volume::memory_empty_dir(&source, pod_uid)? {
                mounts.push(Mount {
                    destination,
                    type_: "bind".into(),
                    source: bind.subpath,
                    options,
                    pod_volume: Some(bind.volume).into(),
                    ..Default::default()
                });
                continue;
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
    Ok((mounts, binds))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{spec, BASE};
    use super::*;

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

    #[test]
    fn console_size_reaches_the_agent_with_a_terminal_only() {
        let with = |terminal: bool, size: &str| {
            exec_process(
                format!(r#"{{"args":["sh"],"cwd":"/","user":{{"uid":0,"gid":0}},"terminal":{terminal},"consoleSize":{size}}}"#)
                    .as_bytes(),
                "e1",
            )
        };
        let p = with(true, r#"{"height":33,"width":77}"#).unwrap();
        let size = p.console_size.as_ref().unwrap();
        assert_eq!((size.height, size.width), (33, 77));
        assert!(with(false, r#"{"height":33,"width":77}"#)
            .unwrap()
            .console_size
            .is_none());
        let err = with(true, r#"{"height":70000,"width":77}"#).unwrap_err();
        assert!(err.to_string().contains("consoleSize 70000x77"), "{err}");
    }
}
