//! How `vmletctl` shows the node's pods (`ps`'s table) and finds one by the name an
//! operator knows it by (`console NAMESPACE/NAME`): the record each pod's shim keeps in its
//! state directory ([`vmlet_shim::host::pod_record`]).

use std::path::Path;

use vmlet_shim::Error;

use crate::ctl::{self, PodView};

/// `ps`'s table: one line a pod, `now` in seconds since the epoch (for the age).
pub fn table(pods: &[PodView], now: u64) -> String {
    let rows: Vec<[String; 10]> = pods
        .iter()
        .map(|p| {
            let record = p.record();
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            [
                or_dash(record.map(|r| r.names.qualified())),
                or_dash(record.map(|r| r.kind.as_str().into())),
                or_dash(record.map(|r| r.vcpus.to_string())),
                or_dash(record.map(|r| format!("{}Mi", r.memory_mib))),
                or_dash(record.map(|r| r.accel.clone())),
                p.state().into(),
                or_dash(record.map(|r| age(now.saturating_sub(r.started)))),
                p.vm().into(),
                p.taps.len().to_string(),
                p.pod_id.clone(),
            ]
        })
        .collect();
    let header = [
        "NAMESPACE/NAME",
        "KIND",
        "VCPUS",
        "MEMORY",
        "ACCEL",
        "STATE",
        "AGE",
        "VM",
        "TAPS",
        "POD ID",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The pods under `state_dir` whose shim runs, each as `NAMESPACE/NAME (pod id)` (or its id
/// alone, without a record).
pub fn running(state_dir: &Path) -> Vec<String> {
    ctl::state_dirs(state_dir)
        .into_iter()
        .filter(|d| d.shim_pid.is_some())
        .map(|d| match d.record {
            Some(Ok(r)) => format!("{} ({})", r.names.qualified(), d.pod_id),
            _ => d.pod_id,
        })
        .collect()
}

/// An age as `kubectl get` prints it: seconds, minutes, hours or days, whole.
pub fn age(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The pod id of `pod`, given as a pod id or as `NAMESPACE/NAME` (Kubernetes' for a CRI
/// pod, containerd's namespace and the task's id for `ctr run`).
pub fn resolve(state_dir: &Path, pod: &str) -> Result<String, Error> {
    let Some((namespace, name)) = pod.split_once('/') else {
        ctl::check_pod_id(pod)?;
        return Ok(pod.to_owned());
    };
    // Kubernetes' and containerd's names: letters, digits, '.', '_' and '-'.
    let well_formed = |part: &str| {
        !part.is_empty()
            && part.len() <= 253
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && part.bytes().any(|b| b.is_ascii_alphanumeric())
    };
    if !well_formed(namespace) || !well_formed(name) {
        return Err(Error::InvalidArgument(format!(
            "pod {pod:?}: expected a pod id or NAMESPACE/NAME"
        )));
    }
    let found: Vec<ctl::StateDir> = ctl::state_dirs(state_dir)
        .into_iter()
        .filter(|d| {
            d.record.as_ref().is_some_and(|r| {
                r.as_ref()
                    .is_ok_and(|r| r.names.namespace == namespace && r.names.name == name)
            })
        })
        .collect();
    // A pod being replaced under the same name: the one whose shim lives.
    let live: Vec<&ctl::StateDir> = found.iter().filter(|d| d.shim_pid.is_some()).collect();
    match (found.as_slice(), live.as_slice()) {
        ([], _) => Err(Error::NotFound(format!(
            "no pod {pod} on this node (`vmletctl ps` lists them)"
        ))),
        ([one], _) => Ok(one.pod_id.clone()),
        (_, [one]) => Ok(one.pod_id.clone()),
        (all, _) => Err(Error::InvalidArgument(format!(
            "pod {pod} names {} pods here ({}): give its pod id",
            all.len(),
            all.iter()
                .map(|d| d.pod_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmlet_shim::host::pod_record::{PodKind, PodNames, PodRecord, VERSION};
    use vmlet_shim::host::state::PodState;

    fn pod(dir: &Path, id: &str, namespace: &str, name: &str, shim_pid: Option<u32>) {
        let state = PodState {
            dir: dir.join(id),
            shim_pid,
            ..Default::default()
        };
        std::fs::create_dir_all(&state.dir).unwrap();
        state.save().unwrap();
        PodRecord {
            version: VERSION,
            names: PodNames {
                namespace: namespace.into(),
                name: name.into(),
            },
            kind: PodKind::Containers,
            vcpus: 1,
            memory_mib: 256,
            accel: "tcg".into(),
            launcher: "libvirt".into(),
            started: 1000,
        }
        .write(&state.dir)
        .unwrap();
    }

    #[test]
    fn a_pod_is_found_by_its_names_or_its_id() {
        let dir = tempfile::tempdir().unwrap();
        pod(dir.path(), "aaa", "default", "web", None);
        pod(dir.path(), "bbb", "default", "db", None);
        assert_eq!(resolve(dir.path(), "default/web").unwrap(), "aaa");
        assert_eq!(resolve(dir.path(), "bbb").unwrap(), "bbb");
        let err = resolve(dir.path(), "kube-system/web")
            .unwrap_err()
            .message();
        assert!(err.contains("no pod kube-system/web"), "{err}");
        for bad in ["/web", "default/", "a/b/c", "../x"] {
            assert!(resolve(dir.path(), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn two_pods_of_one_name_are_told_apart_by_a_live_shim_or_named() {
        let dir = tempfile::tempdir().unwrap();
        pod(dir.path(), "old", "default", "web", None);
        pod(
            dir.path(),
            "new",
            "default",
            "web",
            Some(std::process::id()),
        );
        // PodState's shim check wants the shim's own command line: this test's process is
        // no shim, so neither counts as live and both are named.
        let err = resolve(dir.path(), "default/web").unwrap_err().message();
        assert!(err.contains("names 2 pods") && err.contains("new") && err.contains("old"));
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(600), "10m");
        assert_eq!(age(3 * 3600), "3h");
        assert_eq!(age(5 * 86_400), "5d");
    }

    #[test]
    fn the_table_shows_the_record_and_dashes_without_one() {
        let dir = tempfile::tempdir().unwrap();
        pod(dir.path(), "aaa", "default", "web", None);
        std::fs::create_dir_all(dir.path().join("bare")).unwrap();
        let pods: Vec<PodView> = ctl::state_dirs(dir.path())
            .into_iter()
            .map(|d| PodView {
                pod_id: d.pod_id,
                shim_pid: d.shim_pid,
                has_state: true,
                domain_active: None,
                qemu_pid: None,
                taps: Vec::new(),
                helpers: Vec::new(),
                record: d.record,
            })
            .collect();
        let text = table(&pods, 1600);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE/NAME  KIND"), "{text}");
        let web = lines.iter().find(|l| l.contains("aaa")).unwrap();
        for cell in [
            "default/web",
            "containers",
            "256Mi",
            "tcg",
            "orphaned",
            "10m",
        ] {
            assert!(web.contains(cell), "{cell} in {web}");
        }
        let bare = lines.iter().find(|l| l.contains("bare")).unwrap();
        assert!(bare.starts_with('-'), "{bare}");
    }
}
