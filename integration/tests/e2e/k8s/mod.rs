//! vmlet under a real kubelet and API server: the single-node cluster `scripts/k8s up` runs
//! on the stack (its containerd, its CNI), pods with `runtimeClassName: vmlet` (the
//! RuntimeClass as deploy/runtimeclass.yaml ships it) driven through kubectl. Run by
//! `make test` in its own phase, after the other areas (a kubelet owns every CRI pod of
//! the node: it would remove the other areas' and critest's).

use std::time::{Duration, Instant};

use crate::support::{stack, text};
use vmlet_integration::cluster::Cluster;
use vmlet_integration::unique_id;

mod installer;
mod lifecycle;
mod verbs;
mod volumes;
mod workloads;

/// How long pods whose VMs boot under TCG may take to become Ready, four at a time.
pub(crate) const READY_DEADLINE: Duration = Duration::from_secs(300);

pub(crate) fn cluster() -> Cluster {
    Cluster::from_env().expect("the test cluster")
}

/// A namespace of its own for one test, deleted (with what is in it) at the end.
pub(crate) struct Namespace<'a> {
    cluster: &'a Cluster,
    pub(crate) name: String,
}

impl<'a> Namespace<'a> {
    pub(crate) fn new(cluster: &'a Cluster, prefix: &str) -> Self {
        let name = unique_id(prefix);
        cluster.ok(&["create", "namespace", &name]).unwrap();
        Namespace { cluster, name }
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self.cluster.run(
            &["delete", "namespace", &self.name, "--timeout=180s"],
            Duration::from_secs(200),
        );
    }
}

/// The guest kernel's release, as the stack's guest image records it.
pub(super) fn guest_kernel() -> String {
    let dir = std::env::var("VMLET_GUEST_DIR").expect("VMLET_GUEST_DIR (scripts/stack env)");
    vmlet_vm_image::Manifest::load(std::path::Path::new(&dir))
        .unwrap()
        .kernel_release
}

/// The CRI plugin's ids of the sandboxes of the pods in namespace `ns` (the names of their
/// VMs, `vmlet-<id>`, and state directories).
pub(super) fn sandboxes_in(s: &vmlet_integration::Stack, ns: &str) -> Vec<String> {
    let listed =
        vmlet_integration::bounded::output(vmlet_integration::cri::crictl(&s.containerd).args([
            "pods",
            "--namespace",
            ns,
            "-q",
        ]))
        .unwrap();
    assert!(
        listed.status.success(),
        "crictl pods: {}",
        text(&listed.stderr)
    );
    text(&listed.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The `names` (VMs, state directories) that are of one of `sandboxes`.
pub(super) fn of_sandboxes(names: Vec<String>, sandboxes: &[String]) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| sandboxes.iter().any(|id| n.ends_with(id.as_str())))
        .collect()
}

/// Waits (at most `limit`) until `kubectl wait --for=condition=Ready` says so for `pod`.
pub(crate) fn wait_ready(k: &Cluster, ns: &str, pod: &str, limit: Duration) {
    let out = k
        .run(
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "-n",
                ns,
                &format!("--timeout={}s", limit.as_secs()),
            ],
            limit + Duration::from_secs(30),
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{pod} not Ready within {limit:?}: {}\n{}",
        text(&out.stderr),
        k.ok(&["describe", "pod", pod, "-n", ns])
            .unwrap_or_default()
    );
}

/// What `sh -c script` prints in `container` of `pod` in namespace `ns` (`kubectl exec`),
/// which must succeed.
pub(super) fn sh_in(k: &Cluster, ns: &str, pod: &str, container: &str, script: &str) -> String {
    k.ok(&[
        "exec", pod, "-n", ns, "-c", container, "--", "sh", "-c", script,
    ])
    .unwrap()
}

/// Polls `probe` every second until it gives `Some`, at most `limit`.
pub(super) fn eventually<T>(
    limit: Duration,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
}
