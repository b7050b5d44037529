//! vmlet under a real kubelet and API server: the single-node cluster `scripts/k8s up` runs
//! on the stack (its containerd, its CNI), pods with `runtimeClassName: vmlet` (the
//! RuntimeClass as deploy/runtimeclass.yaml ships it) driven through kubectl. Run by
//! `make test` in its own phase, after the other areas (a kubelet owns every CRI pod of
//! the node: it would remove the other areas' and critest's).

use std::time::{Duration, Instant};

use crate::support::{stack, text};
use vmlet_integration::cluster::Cluster;
use vmlet_integration::unique_id;

/// How long pods whose VMs boot under TCG may take to become Ready, four at a time.
const READY_DEADLINE: Duration = Duration::from_secs(300);

fn cluster() -> Cluster {
    Cluster::from_env().expect("the test cluster")
}

/// A namespace of its own for one test, deleted (with what is in it) at the end.
struct Namespace<'a> {
    cluster: &'a Cluster,
    name: String,
}

impl<'a> Namespace<'a> {
    fn new(cluster: &'a Cluster, prefix: &str) -> Self {
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
fn guest_kernel() -> String {
    let dir = std::env::var("VMLET_GUEST_DIR").expect("VMLET_GUEST_DIR (scripts/stack env)");
    vmlet_vm_image::Manifest::load(std::path::Path::new(&dir))
        .unwrap()
        .kernel_release
}

#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn a_deployment_of_vmlet_pods_becomes_ready_execs_logs_and_scales_to_zero() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "deploy");
    let deployment = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 4
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      runtimeClassName: vmlet
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: {image}
        imagePullPolicy: Never
        command: ["sh", "-c", "echo started-in-$(uname -r); trap 'exit 0' TERM; while :; do sleep 1; done"]
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&deployment).unwrap();
    let started = Instant::now();
    let rollout = k
        .run(
            &[
                "rollout",
                "status",
                "deployment/web",
                "-n",
                &ns.name,
                "--timeout=300s",
            ],
            READY_DEADLINE + Duration::from_secs(30),
        )
        .unwrap();
    assert!(
        rollout.status.success(),
        "4 vmlet pods not Ready within {READY_DEADLINE:?}: {}{}\n{}",
        text(&rollout.stdout),
        text(&rollout.stderr),
        k.ok(&["describe", "pods", "-n", &ns.name])
            .unwrap_or_default()
    );
    println!("4 vmlet pods Ready in {} s", started.elapsed().as_secs());

    let pods = k
        .ok(&[
            "get",
            "pods",
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .unwrap();
    let pods: Vec<&str> = pods.split_whitespace().collect();
    assert_eq!(pods.len(), 4, "{pods:?}");
    let guest = guest_kernel();
    for pod in &pods {
        // Each pod is a VM of its own: the guest's kernel answers.
        let release = k
            .ok(&["exec", "-n", &ns.name, pod, "--", "uname", "-r"])
            .unwrap();
        assert_eq!(release.trim(), guest, "{pod}");
        let logs = k.ok(&["logs", "-n", &ns.name, pod]).unwrap();
        assert!(
            logs.contains(&format!("started-in-{guest}")),
            "{pod}: {logs}"
        );
    }
    assert!(
        s.vmlet_domains().unwrap().len() >= 4,
        "fewer than 4 vmlet domains for 4 pods"
    );

    k.ok(&["scale", "deployment/web", "-n", &ns.name, "--replicas=0"])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let left = k
            .ok(&["get", "pods", "-n", &ns.name, "-o", "name"])
            .unwrap();
        if left.trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods left after scaling to 0: {left}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // The kubelet removes the sandboxes after their pods: every VM and pod state goes.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !s.vmlet_domains().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "vmlet domains left after scaling to 0: {:?}",
            s.vmlet_domains().unwrap()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let state = std::path::Path::new(&s.dir).join("state");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<_> = std::fs::read_dir(&state)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods' state directories left: {left:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}
