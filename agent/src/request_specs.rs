//! What a create or exec request asks for, checked and turned into the specs the container
//! and exec processes run: paths stay inside the share, a process has args.

use std::path::{Component, Path, PathBuf};

use vmlet_protocol::agent::{self as proto, CreateContainerRequest};

use crate::init_spec::{InitSpec, MountSpec, ProcessSpec, RlimitSpec};
use crate::pod_volumes::PodVolumes;
use crate::Error;

/// A path below the share (rootfs, bind source): relative, no `..`.
fn rootfs_path(share: &Path, rootfs: &str) -> Result<PathBuf, Error> {
    let relative = Path::new(rootfs);
    let clean = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    if rootfs.is_empty() || !clean {
        return Err(Error::InvalidRequest(format!(
            "{rootfs:?} must be a relative path inside the share"
        )));
    }
    Ok(share.join(relative))
}

/// The process part of a request, checked.
pub(crate) fn process_spec(process: Option<&proto::Process>) -> Result<ProcessSpec, Error> {
    let process = process.ok_or_else(|| Error::InvalidRequest("no process".into()))?;
    if process.args.is_empty() {
        return Err(Error::InvalidRequest("process has no args".into()));
    }
    let user = process.user.as_ref();
    Ok(ProcessSpec {
        args: process.args.clone(),
        env: process.env.clone(),
        cwd: process.cwd.clone(),
        uid: user.map_or(0, |u| u.uid),
        gid: user.map_or(0, |u| u.gid),
        additional_gids: user.map_or_else(Vec::new, |u| u.additional_gids.clone()),
        rlimits: process
            .rlimits
            .iter()
            .map(|r| RlimitSpec {
                resource: r.resource,
                soft: r.soft,
                hard: r.hard,
            })
            .collect(),
        terminal: process.terminal,
        capabilities: process
            .capabilities
            .as_ref()
            .map(|c| crate::init_spec::CapabilitySpec {
                bounding: c.bounding.clone(),
                effective: c.effective.clone(),
                permitted: c.permitted.clone(),
                inheritable: c.inheritable.clone(),
                ambient: c.ambient.clone(),
            }),
        no_new_privileges: process.no_new_privileges,
        seccomp: process
            .seccomp
            .as_ref()
            .map(|s| crate::init_spec::SeccompSpec {
                program: s.program.clone(),
                flags: s.flags,
            }),
    })
}

/// The container's init spec. A pod volume's bind takes its directory in `volumes` (which
/// the caller has mounted: [`PodVolumes::ensure`]).
pub(crate) fn init_spec(
    share: &Path,
    volumes: &PodVolumes,
    req: &CreateContainerRequest,
) -> Result<InitSpec, Error> {
    let process = process_spec(req.process.as_ref())?;
    Ok(InitSpec {
        rootfs: rootfs_path(share, &req.rootfs)?
            .to_string_lossy()
            .into_owned(),
        readonly_rootfs: req.readonly_rootfs,
        hostname: req.hostname.clone(),
        mounts: req
            .mounts
            .iter()
            .map(|m| {
                // A pod volume's bind: the volume's directory, or for a subPath a path
                // resolved beneath it by the container's init.
                if let Some(volume) = m.pod_volume.as_ref() {
                    if m.type_ != "bind" {
                        return Err(Error::InvalidRequest(format!(
                            "the mount of pod volume {} at {} must be a bind",
                            volume.name, m.destination
                        )));
                    }
                    let dir = volumes
                        .path_of(&volume.name)?
                        .to_string_lossy()
                        .into_owned();
                    let (source, source_beneath) = if m.source.is_empty() {
                        (dir, None)
                    } else {
                        rootfs_path(Path::new(""), &m.source)?;
                        (m.source.clone(), Some(dir))
                    };
                    return Ok(MountSpec {
                        destination: m.destination.clone(),
                        fstype: m.type_.clone(),
                        source,
                        options: m.options.clone(),
                        source_beneath,
                    });
                }
                // A bind's source is a path inside the share, where the shim put it.
                let source = if m.type_ == "bind" {
                    rootfs_path(share, &m.source)?
                        .to_string_lossy()
                        .into_owned()
                } else {
                    m.source.clone()
                };
                Ok(MountSpec {
                    destination: m.destination.clone(),
                    fstype: m.type_.clone(),
                    source,
                    options: m.options.clone(),
                    source_beneath: None,
                })
            })
            .collect::<Result<_, Error>>()?,
        process,
        join_namespaces: Vec::new(),
        join_pid: 0,
        devices: Vec::new(),
        masked_paths: req.masked_paths.clone(),
        sysctls: req.sysctls.clone().into_iter().collect(),
        all_guest_devices: req.all_guest_devices,
        readonly_paths: req.readonly_paths.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_volumes_subpath_is_resolved_beneath_the_volume() {
        let volumes = PodVolumes::new("/run/vmlet/pod-volumes");
        let share = Path::new("/run/vmlet/share");
        let request = |source: &str| CreateContainerRequest {
            rootfs: "c1/rootfs".into(),
            process: Some(proto::Process {
                args: vec!["sh".into()],
                ..Default::default()
            })
            .into(),
            mounts: vec![proto::Mount {
                destination: "/etc/app.yaml".into(),
                type_: "bind".into(),
                source: source.into(),
                pod_volume: Some(proto::PodVolume {
                    name: "cache".into(),
                    size_bytes: 1 << 20,
                    mode: 0o777,
                    ..Default::default()
                })
                .into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let whole = init_spec(share, &volumes, &request("")).unwrap();
        assert_eq!(whole.mounts[0].source, "/run/vmlet/pod-volumes/cache");
        assert_eq!(whole.mounts[0].source_beneath, None);
        let sub = init_spec(share, &volumes, &request("conf/app.yaml")).unwrap();
        assert_eq!(sub.mounts[0].source, "conf/app.yaml");
        assert_eq!(
            sub.mounts[0].source_beneath.as_deref(),
            Some("/run/vmlet/pod-volumes/cache")
        );
        for bad in ["../x", "/etc", "a/../../b"] {
            assert!(init_spec(share, &volumes, &request(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn rootfs_must_stay_inside_the_share() {
        let share = Path::new("/run/vmlet/share");
        assert_eq!(
            rootfs_path(share, "c1/rootfs").unwrap(),
            PathBuf::from("/run/vmlet/share/c1/rootfs")
        );
        for bad in ["", "/etc", "../x", "c1/../../x", "./c1"] {
            assert!(rootfs_path(share, bad).is_err(), "{bad}");
        }
    }
}
