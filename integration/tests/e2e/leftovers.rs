//! What the end-to-end suites leave behind. `scripts/e2e` runs `before_the_suite` first,
//! which records what is already there (a developer's pods, another runtime's namespaces),
//! and `nothing_is_left_behind` last, which names everything that appeared since, each with
//! what made it.

use std::collections::BTreeSet;
use std::process::Command;

use vmlet_integration::{bounded, Stack};

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn before_the_suite() {
    let s = Stack::from_env().expect("the vmlet stack");
    let found = survey(&s);
    let text: String = found.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(before_file(&s), text).expect("writing what was there before the suite");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn nothing_is_left_behind() {
    let s = Stack::from_env().expect("the vmlet stack");
    let before: BTreeSet<String> = std::fs::read_to_string(before_file(&s))
        .expect(
            "what was there before the suite (scripts/e2e runs leftovers:before_the_suite first)",
        )
        .lines()
        .map(str::to_owned)
        .collect();
    let left: Vec<String> = survey(&s).difference(&before).cloned().collect();
    assert!(
        left.is_empty(),
        "the suite left {} thing(s) behind:\n  {}",
        left.len(),
        left.join("\n  ")
    );
}

fn before_file(s: &Stack) -> String {
    format!("{}/e2e-before", s.dir)
}

/// Everything a run can leave on the node, one line each, naming what made it.
fn survey(s: &Stack) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for d in s.vmlet_domains().expect("libvirt domains") {
        found.insert(format!("libvirt domain {d}: a pod's VM (vmlet's shim)"));
    }
    for (pid, cmdline) in s.stack_processes() {
        let short: String = cmdline.chars().take(160).collect();
        found.insert(format!("process {pid}: {short}"));
    }
    for m in s.state_mounts() {
        found.insert(format!("mount {m}: a pod's rootfs or share (vmlet's shim)"));
    }
    // The node's KVM answer (`accel = "auto"`), kept for the host's boot, and its counters
    // of every pod's start (`vmletctl metrics`) are no pod's.
    let node_files = [
        vmlet_shim::vmm::kvm_probe::ANSWER_FILE,
        vmlet_shim::vmm::kvm_probe::LOCK_FILE,
        vmlet_shim::task::node_counters::FILE,
        vmlet_shim::task::node_counters::LOCK,
        vmlet_shim::task::node_counters::TMP,
    ];
    for entry in std::fs::read_dir(format!("{}/state", s.dir)).expect("the pod state dir") {
        let name = entry.expect("a pod state entry").file_name();
        if node_files.iter().any(|f| name == *f) {
            continue;
        }
        // What the shims publish for the metrics group: the node's counters stay, a pod's
        // figures socket goes with its pod.
        if name == vmlet_shim::task::metrics_dir::DIR {
            let published = format!("{}/state/{}", s.dir, name.to_string_lossy());
            for file in std::fs::read_dir(&published).expect("the metrics directory") {
                let file = file.expect("a published file").file_name();
                if file != vmlet_shim::task::metrics_dir::COUNTERS {
                    found.insert(format!(
                        "published {}: a pod's figures socket left (vmlet's shim)",
                        file.to_string_lossy()
                    ));
                }
            }
            continue;
        }
        // The pods' locks: the directory stays, a pod's lock goes with its pod.
        if name == vmlet_shim::host::pod_lock::LOCKS_DIR {
            let locks = format!("{}/state/{}", s.dir, name.to_string_lossy());
            for lock in std::fs::read_dir(&locks).expect("the pods' locks") {
                found.insert(format!(
                    "pod lock {}: a pod's lock file left (vmlet's shim)",
                    lock.expect("a lock").file_name().to_string_lossy()
                ));
            }
            continue;
        }
        // The pods' uid claims: the directory, its lock and where the next claim starts
        // stay, a claim goes with its pod.
        if name == vmlet_shim::host::pod_user::CLAIMS_DIR {
            let claims = format!("{}/state/{}", s.dir, name.to_string_lossy());
            for claim in std::fs::read_dir(&claims).expect("the uid claims") {
                let claim = claim.expect("a claim").file_name();
                if claim != vmlet_shim::host::pod_user::LOCK_FILE
                    && claim != vmlet_shim::host::pod_user::NEXT_FILE
                {
                    found.insert(format!(
                        "uid claim {}: a pod's uid never given back (vmlet's shim)",
                        claim.to_string_lossy()
                    ));
                }
            }
            continue;
        }
        found.insert(format!(
            "pod state dir {}: a pod's host files (vmlet's shim)",
            name.to_string_lossy()
        ));
    }
    // The stack's containerd keeps its pods' network namespaces under its state dir.
    let containerd_dir = format!("{}/containerd/", s.dir);
    for (path, fs) in mounts() {
        if fs == "nsfs" && path.starts_with(&containerd_dir) {
            found.insert(format!(
                "network namespace {path}: a CRI pod's (containerd's CRI plugin)"
            ));
        }
    }
    let node = std::env::var("VMLET_NODE_NETNS").unwrap_or_default();
    for name in named_netns() {
        if name.starts_with("vmlet-") && name != node {
            found.insert(format!(
                "network namespace /run/netns/{name}: an end-to-end test's (integration/src/testnet.rs or a test's own)"
            ));
        } else if name.starts_with("cni-") {
            found.insert(format!(
                "network namespace /run/netns/{name}: a CRI pod's (a containerd that keeps them in /run/netns)"
            ));
        }
    }
    for pod in cri_pods(s) {
        found.insert(format!(
            "CRI pod {pod}: a CRI test's or critest's (crictl rmp)"
        ));
    }
    for container in ctr_containers(s) {
        found.insert(format!(
            "container {container}: made through ctr or nerdctl (ctr tasks rm -f; ctr containers rm)"
        ));
    }
    found
}

/// `(mount point, file system type)` of every mount this process sees.
fn mounts() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("/proc/self/mountinfo")
        .lines()
        .filter_map(|l| {
            let point = l.split_whitespace().nth(4)?;
            let (_, after) = l.split_once(" - ")?;
            let fs = after.split_whitespace().next()?;
            Some((point.to_owned(), fs.to_owned()))
        })
        .collect()
}

fn named_netns() -> Vec<String> {
    let out = bounded::output(Command::new("ip").args(["netns", "list"])).expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// `namespace/name (id)` of each pod the CRI plugin has.
fn cri_pods(s: &Stack) -> Vec<String> {
    let out =
        bounded::output(vmlet_integration::cri::crictl(&s.containerd).args(["pods", "-o", "json"]))
            .expect("crictl pods");
    assert!(
        out.status.success(),
        "crictl pods: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("crictl pods -o json");
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let m = &p["metadata"];
            format!(
                "{}/{} ({})",
                m["namespace"].as_str().unwrap_or("?"),
                m["name"].as_str().unwrap_or("?"),
                p["id"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// `namespace/id` of each container containerd has, in every namespace.
fn ctr_containers(s: &Stack) -> Vec<String> {
    let ctr = |args: &[&str]| {
        let out = bounded::output(Command::new("ctr").args(["-a", &s.containerd]).args(args))
            .expect("ctr");
        assert!(
            out.status.success(),
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let mut found = Vec::new();
    for ns in ctr(&["namespaces", "ls", "-q"]) {
        for id in ctr(&["-n", &ns, "containers", "ls", "-q"]) {
            found.push(format!("{ns}/{id}"));
        }
    }
    found
}
