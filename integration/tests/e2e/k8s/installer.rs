//! The DaemonSet installer and the cleanup Job as deploy/ ships them.

use super::*;

/// The installer image `make dist` writes (dist/vmlet-installer-VERSION.oci.tar).
fn installer_image_archive() -> std::path::PathBuf {
    let dist = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../dist"));
    std::fs::read_dir(dist)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("vmlet-installer-") && name.ends_with(".oci.tar")
        })
        .expect("dist/vmlet-installer-VERSION.oci.tar: `make dist` writes it (make test does)")
}

/// A shipped manifest of deploy/ aimed at `root` instead of the node's `/`, without the
/// containerd restart (the scratch root has no systemd), and with the stack's state
/// directory `state` for the node's `/run/vmlet` (its `.metrics`, the metrics'): the only
/// changes.
fn aimed_at(manifest: &str, root: &std::path::Path, state: &str) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy")).join(manifest),
    )
    .unwrap();
    let host = "            path: /\n";
    assert_eq!(text.matches(host).count(), 1, "{manifest}: one host path");
    let restart = "            - --restart-containerd\n";
    assert_eq!(text.matches(restart).count(), 1, "{manifest}: one restart");
    text.replace(host, &format!("            path: {}\n", root.display()))
        .replace(restart, "")
        .replace(
            "            path: /run/vmlet/.metrics\n",
            &format!("            path: {state}/.metrics\n"),
        )
}

/// The node's label is the installer's to set and the cleanup's to remove: it goes first
/// ([`Relabel::off`]), and comes back however the test ends.
struct Relabel<'a>(&'a Cluster);

impl<'a> Relabel<'a> {
    fn off(k: &'a Cluster) -> Self {
        k.ok(&["label", "node", &k.node, "vmlet.io/runtime-"])
            .unwrap();
        Relabel(k)
    }
}

impl Drop for Relabel<'_> {
    fn drop(&mut self) {
        let _ = self.0.ok(&[
            "label",
            "node",
            &self.0.node,
            "vmlet.io/runtime=true",
            "--overwrite",
        ]);
    }
}

/// The node's `vmlet.io/runtime` label (empty: none).
fn label(k: &Cluster) -> String {
    k.jsonpath(
        &["node", &k.node],
        None,
        "{.metadata.labels.vmlet\\.io/runtime}",
    )
    .unwrap()
}

/// A scratch root standing for the node's, on disk (the release holds the guest image),
/// removed however the test ends.
struct Scratch(std::path::PathBuf);

impl Scratch {
    /// A directory made new in /var/tmp (a name planted there, a link among them, is
    /// refused), root's alone.
    fn new(name: &str) -> Self {
        let scratch = Scratch(std::path::Path::new("/var/tmp").join(unique_id(name)));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&scratch.0)
            .unwrap();
        scratch
    }

    /// A node's root, with containerd's `config`.
    fn with_containerd_config(config: &str) -> Self {
        let scratch = Scratch::new("vmlet-node-root");
        std::fs::create_dir_all(scratch.0.join("etc/containerd")).unwrap();
        std::fs::write(scratch.0.join("etc/containerd/config.toml"), config).unwrap();
        scratch
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The DaemonSet installer and the cleanup Job as deploy/ ships them (aimed at a scratch root
/// standing for the node's): the installer's pod installs vmlet there and labels the node
/// through the API server (its Service address, by kube-proxy); the cleanup Job removes the
/// label and gives the root back as it was.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn the_daemonset_installer_and_the_cleanup_job_run_as_shipped() {
    let s = stack();
    let k = cluster();
    let archive = installer_image_archive();
    let import = vmlet_integration::bounded::output(
        std::process::Command::new("ctr")
            .args(["-a", &s.containerd, "-n", "k8s.io", "images", "import"])
            .arg(&archive),
    )
    .unwrap();
    assert!(import.status.success(), "{}", text(&import.stderr));
    let _relabel = Relabel::off(&k);
    let config =
        "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n";
    let scratch = Scratch::with_containerd_config(config);
    let root = scratch.0.clone();

    let state = format!("{}/state", s.dir);
    let deploy = aimed_at("vmlet-deploy.yaml", &root, &state);
    k.apply(&deploy).unwrap();
    the_installer_installs_and_labels(&k, &root);
    its_token_labels_only_its_own_node(&k);
    its_metrics_are_served(&k, &s);

    // Off again: the DaemonSet first (its pods would install again), then the Job.
    let deleted = k
        .with_input(&["delete", "-f", "-", "--timeout=120s"], &deploy)
        .unwrap();
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    let cleanup = aimed_at("vmlet-cleanup.yaml", &root, &state);
    k.apply(&cleanup).unwrap();
    the_cleanup_gives_the_root_back(&k, &root, config);
    let deleted = k
        .with_input(&["delete", "-f", "-", "--timeout=120s"], &cleanup)
        .unwrap();
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    drop(scratch);
}

/// The applied DaemonSet's pod installs vmlet into `root`, merges containerd's config, labels
/// the node, and says so in its log.
fn the_installer_installs_and_labels(k: &Cluster, root: &std::path::Path) {
    let started = Instant::now();
    eventually(Duration::from_secs(180), "the installer's label", || {
        (label(k) == "true").then_some(())
    });
    // The scratch root is no node's (no libraries, no libvirt): the installed vmletctl
    // cannot run there to tell the accelerator, and the node is left without that label
    // (scripts/check-clean-root sees it set on a whole root).
    let accel = k
        .jsonpath(
            &["node", &k.node],
            None,
            "{.metadata.labels.vmlet\\.io/accel}",
        )
        .unwrap();
    assert_eq!(accel, "", "vmlet.io/accel from a scratch root");
    println!(
        "the DaemonSet installed vmlet and labelled the node in {} s",
        started.elapsed().as_secs()
    );
    assert!(root
        .join("usr/local/bin/containerd-shim-vmlet-v2")
        .is_file());
    let merged = std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap();
    assert!(merged.contains("vmlet"), "{merged}");
    // The label comes from the running container; the kubelet may not have seen it start
    // yet (its relist), and until it has, `kubectl logs` answers "waiting to start".
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs = k.ok(&[
            "logs",
            "-n",
            "kube-system",
            "daemonset/vmlet-installer",
            "-c",
            "install",
        ]);
        match logs {
            Ok(logs) if logs.contains("installed; waiting for SIGTERM") => {
                assert!(
                    logs.contains("node left without vmlet.io/accel"),
                    "the installer says why the node has no accelerator label: {logs}"
                );
                break;
            }
            other => assert!(Instant::now() < deadline, "the installer's log: {other:?}"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What the installer's service account may do, as a pod of the DaemonSet holds it (a token
/// bound to that pod, and so to its node; RBAC lets the account patch every node): set and
/// remove its node's `vmlet.io/` labels, and nothing else. Another label of its node, its
/// node's taints, annotations and finalizers, and another node's labels are refused by the
/// shipped ValidatingAdmissionPolicy, which the refusal names.
fn its_token_labels_only_its_own_node(k: &Cluster) {
    let ns = Some("kube-system");
    let pod = k
        .jsonpath(
            &["pod", "-l", "app.kubernetes.io/name=vmlet-installer"],
            ns,
            "{.items[0].metadata.name}",
        )
        .unwrap();
    let uid = k.jsonpath(&["pod", &pod], ns, "{.metadata.uid}").unwrap();
    let token = k
        .ok(&[
            "create",
            "token",
            "vmlet-installer",
            "-n",
            "kube-system",
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod}"),
            &format!("--bound-object-uid={uid}"),
            "--duration=10m",
        ])
        .unwrap();
    let dir = Scratch::new("vmlet-installer-token");
    let installer = k
        .as_token(token.trim(), &dir.0.join("installer.kubeconfig"))
        .unwrap();
    let other = unique_id("vmlet-other-node");
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {other}\n  labels:\n    vmlet.io/runtime: \"false\"\n"
    );
    k.with_input(&["create", "-f", "-"], &node).unwrap();
    let refused = |args: &[&str], what: &str| {
        let out = installer.run(args, Duration::from_secs(30)).unwrap();
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("vmlet-installer-own-node"),
            "the installer's token {what}: {stderr}"
        );
    };
    let own = k.node.as_str();
    installer
        .ok(&["label", "node", own, "vmlet.io/probe=yes"])
        .expect("the installer's token labels its own node");
    installer
        .ok(&["label", "node", own, "vmlet.io/probe-"])
        .expect("the installer's token unlabels its own node");
    refused(
        &[
            "label",
            "node",
            &other,
            "vmlet.io/runtime=true",
            "--overwrite",
        ],
        "labelled another node",
    );
    refused(
        &[
            "label",
            "node",
            own,
            "node-role.kubernetes.io/control-plane=",
        ],
        "set a label outside vmlet.io/",
    );
    refused(
        &["taint", "node", own, "vmlet.io/probe=yes:NoSchedule"],
        "tainted its node",
    );
    refused(
        &["annotate", "node", own, "vmlet.io/probe=yes"],
        "annotated its node",
    );
    refused(
        &[
            "patch",
            "node",
            own,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["vmlet.io/probe"]}}"#,
        ],
        "gave its node a finalizer",
    );
    k.ok(&["delete", "node", &other]).unwrap();
    let probe = k
        .jsonpath(&["node", own], None, "{.metadata.labels.vmlet\\.io/probe}")
        .unwrap();
    assert_eq!(probe, "");
}

/// The installer's pod serves the node's figures through the Service `vmlet-metrics` (asked
/// through the API server's service proxy), as Prometheus text that a real parser reads,
/// with a running vmlet pod's series labelled by its Kubernetes names, the node's boot
/// histogram and `vmlet_build_info`.
fn its_metrics_are_served(k: &Cluster, s: &vmlet_integration::Stack) {
    let ns = Namespace::new(k, "metrics");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: measured, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sleep", "1000"]
"#,
        ns = ns.name,
        image = s.image,
    );
    k.apply(&pod).unwrap();
    wait_ready(k, &ns.name, "measured", READY_DEADLINE);
    let path = "/api/v1/namespaces/kube-system/services/vmlet-metrics:metrics/proxy/metrics";
    let body = eventually(Duration::from_secs(60), "the metrics Service", || {
        k.ok(&["get", "--raw", path])
            .ok()
            .filter(|b| b.contains("cri_name=\"measured\""))
    });
    const PARSE: &str = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in family.samples:
        print(s.name, s.labels.get("cri_namespace", "-"), s.labels.get("cri_name", "-"), s.value)
"#;
    let samples = crate::support::parsed_prometheus(s, &body, PARSE);
    let memory = format!("vmlet_pod_vm_memory_bytes {} measured ", ns.name);
    for wanted in [
        &memory,
        "vmlet_pod_boot_duration_seconds_count - - ",
        "vmlet_build_info - - 1.0",
    ] {
        assert!(
            samples.lines().any(|l| l.starts_with(wanted)),
            "{wanted:?} in the served figures:\n{body}"
        );
    }
    println!(
        "the DaemonSet's metrics Service served {} samples",
        samples.lines().count()
    );
    the_metrics_run_with_least_privilege(k);
}

/// The process serving them, as the node sees it: the node config's metrics uid, in its
/// group, without capabilities or a way to gain them, in a PID namespace of its own (its
/// `/proc` shows its own processes, none of the node's), without a service account token.
fn the_metrics_run_with_least_privilege(k: &Cluster) {
    let pod = k
        .jsonpath(
            &["pod", "-l", "app.kubernetes.io/name=vmlet-metrics"],
            Some("kube-system"),
            "{.items[0].metadata.name}",
        )
        .unwrap();
    let served: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"--listen=0.0.0.0:9464"))
        })
        .collect();
    let [pid] = served[..] else {
        panic!("pod {pod}: one `vmletctl metrics` process on the node, found {served:?}");
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let gid = crate::direct_pods::node_config().metrics_gid.to_string();
    assert!(field("Uid:").iter().all(|u| *u == gid.as_str()), "{status}");
    assert!(field("Groups:").contains(&gid.as_str()), "{status}");
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{status}");
    assert_eq!(field("CapPrm:"), ["0000000000000000"], "{status}");
    assert_eq!(field("NoNewPrivs:"), ["1"], "{status}");
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).unwrap();
    assert_ne!(
        ns(&pid.to_string()),
        ns("self"),
        "the metrics share the node's PIDs"
    );
    let root = format!("/proc/{pid}/root");
    let seen = std::fs::read_dir(format!("{root}/proc"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    assert!(seen <= 2, "the metrics see {seen} processes");
    assert!(
        !std::path::Path::new(&format!(
            "{root}/var/run/secrets/kubernetes.io/serviceaccount"
        ))
        .exists(),
        "the metrics have a service account token"
    );
}

/// The applied cleanup Job completes, removes the node's label and leaves `root` as it
/// was: containerd's `config` and no shim.
fn the_cleanup_gives_the_root_back(k: &Cluster, root: &std::path::Path, config: &str) {
    let done = k
        .run(
            &[
                "wait",
                "-n",
                "kube-system",
                "--for=condition=complete",
                "job/vmlet-cleanup",
                "--timeout=180s",
            ],
            Duration::from_secs(200),
        )
        .unwrap();
    let job_logs = k
        .ok(&["logs", "-n", "kube-system", "job/vmlet-cleanup"])
        .unwrap_or_default();
    assert!(done.status.success(), "the cleanup Job: {job_logs}");
    assert_eq!(label(k), "", "the label after the cleanup");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap(),
        config,
        "containerd's config after the cleanup"
    );
    assert!(!root.join("usr/local/bin/containerd-shim-vmlet-v2").exists());
}
