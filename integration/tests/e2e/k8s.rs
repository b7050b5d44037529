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
        .jsonpath(&["pods"], Some(&ns.name), "{.items[*].metadata.name}")
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

    // Only the deployment's VMs and state are waited for: another test's pod may run beside.
    let sandboxes = sandboxes_in(&s, &ns.name);
    assert!(
        sandboxes.len() >= 4,
        "sandboxes of the deployment: {sandboxes:?}"
    );
    let ours = |names: Vec<String>| of_sandboxes(names, &sandboxes);

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
    while !ours(s.vmlet_domains().unwrap()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "vmlet domains left after scaling to 0: {:?}",
            ours(s.vmlet_domains().unwrap())
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let state = std::path::Path::new(&s.dir).join("state");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = ours(
            std::fs::read_dir(&state)
                .unwrap()
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
        );
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

/// The CRI plugin's ids of the sandboxes of the pods in namespace `ns` (the names of their
/// VMs, `vmlet-<id>`, and state directories).
fn sandboxes_in(s: &vmlet_integration::Stack, ns: &str) -> Vec<String> {
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
fn of_sandboxes(names: Vec<String>, sandboxes: &[String]) -> Vec<String> {
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

/// Polls `probe` every second until it gives `Some`, at most `limit`.
fn eventually<T>(limit: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// kubectl's verbs on a vmlet pod: a readiness httpGet probe (the kubelet's own request to
/// the pod's address) passes, `logs -f` follows, `cp` both ways, `port-forward` reaches a
/// server in the VM, `attach` reads the container's output.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn kubectls_verbs_reach_a_vmlet_pod() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "verbs");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: verbs, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo served-from-the-vm >/www/index.html && httpd -p 8080 -h /www && i=0; while :; do echo tick-$i; i=$((i+1)); sleep 1; done"]
    readinessProbe:
      httpGet: {{path: /index.html, port: 8080}}
      periodSeconds: 2
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&pod).unwrap();
    wait_ready(&k, &ns.name, "verbs", READY_DEADLINE);

    // logs -f: lines the container writes after the follow started arrive.
    let follow = k
        .output_until(
            &["logs", "-f", "verbs", "-n", &ns.name, "--tail=1"],
            Duration::from_secs(60),
            |text| text.matches("tick-").count() >= 2,
        )
        .unwrap();
    assert!(
        follow.matches("tick-").count() >= 2,
        "logs -f did not follow: {follow}"
    );

    // cp both ways.
    let dir = std::path::PathBuf::from(&s.dir).join(unique_id("kcp"));
    std::fs::create_dir_all(&dir).unwrap();
    let local = dir.join("up.txt");
    std::fs::write(&local, "copied-into-the-vm\n").unwrap();
    let target = format!("{}/verbs:/tmp/up.txt", ns.name);
    k.ok(&["cp", &local.to_string_lossy(), &target]).unwrap();
    let inside = k
        .ok(&["exec", "verbs", "-n", &ns.name, "--", "cat", "/tmp/up.txt"])
        .unwrap();
    assert_eq!(inside, "copied-into-the-vm\n");
    let back = dir.join("back.html");
    let source = format!("{}/verbs:/www/index.html", ns.name);
    k.ok(&["cp", &source, &back.to_string_lossy()]).unwrap();
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "served-from-the-vm\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // port-forward: kubectl's end listens in the node namespace, where the API server is.
    let node = std::env::var("VMLET_NODE_NETNS").unwrap();
    let mut forward = k
        .kubectl()
        .args(["port-forward", "-n", &ns.name, "pod/verbs", "18090:8080"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let page = vmlet_integration::testnet::tcp_exchange_when_up(
        &node,
        "127.0.0.1",
        18090,
        "GET / HTTP/1.0\r\n\r\n",
    );
    let _ = forward.kill();
    let _ = forward.wait();
    assert!(page.contains("served-from-the-vm"), "{page}");

    // attach: the container's output, live.
    let attached = k
        .output_until(
            &["attach", "verbs", "-n", &ns.name, "-c", "web"],
            Duration::from_secs(60),
            |text| text.contains("tick-"),
        )
        .unwrap();
    assert!(
        attached.contains("tick-"),
        "attach showed nothing: {attached}"
    );
}

/// A failing liveness exec probe (kubelet's ExecSync, with its timeout) restarts the
/// container inside the same VM: the restart count goes to 1 and the guest's boot id stays.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn a_failing_liveness_probe_restarts_the_container_in_the_same_vm() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "probe");
    // Healthy while /tmp/healthy exists, which the test removes.
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: probed, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "touch /tmp/healthy; trap 'exit 0' TERM; while :; do sleep 1; done"]
    livenessProbe:
      exec: {{command: ["test", "-e", "/tmp/healthy"]}}
      periodSeconds: 2
      failureThreshold: 2
      timeoutSeconds: 5
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&pod).unwrap();
    wait_ready(&k, &ns.name, "probed", READY_DEADLINE);
    let boot_id = |k: &Cluster| {
        k.ok(&[
            "exec",
            "probed",
            "-n",
            &ns.name,
            "--",
            "cat",
            "/proc/sys/kernel/random/boot_id",
        ])
        .unwrap()
    };
    let before = boot_id(&k);
    k.ok(&["exec", "probed", "-n", &ns.name, "--", "rm", "/tmp/healthy"])
        .unwrap();
    let restarts = |k: &Cluster| {
        k.jsonpath(
            &["pod", "probed"],
            Some(&ns.name),
            "{.status.containerStatuses[0].restartCount}",
        )
        .unwrap()
    };
    eventually(Duration::from_secs(90), "a restart", || {
        (restarts(&k).trim() == "1").then_some(())
    });
    wait_ready(&k, &ns.name, "probed", Duration::from_secs(60));
    assert_eq!(boot_id(&k), before, "the VM was booted again");
}

/// Kubernetes' volumes reach the container in the VM: a configMap (and an edit of it, within
/// the kubelet's sync), a secret, the Downward API, emptyDir on disk and in memory (a tmpfs
/// of the guest's, its size the volume's, shared by the pod's containers, subPaths of it
/// included), and the projected service-account token.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn kubernetes_volumes_reach_the_vm_and_a_configmap_edit_follows() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "volumes");
    let manifest = format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: {ns}}}
data: {{greeting: first}}
---
apiVersion: v1
kind: Secret
metadata: {{name: secret, namespace: {ns}}}
stringData: {{password: s3cret}}
---
apiVersion: v1
kind: Pod
metadata: {{name: volumes, namespace: {ns}, labels: {{tier: test}}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  securityContext: {{fsGroup: 2000}}
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
    volumeMounts:
    - {{name: settings, mountPath: /etc/settings}}
    - {{name: secret, mountPath: /etc/secret}}
    - {{name: info, mountPath: /etc/info}}
    - {{name: scratch, mountPath: /scratch}}
    - {{name: memory, mountPath: /memory}}
  - name: peer
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
    securityContext: {{runAsUser: 1000}}
    volumeMounts:
    - {{name: memory, mountPath: /memory}}
    - {{name: memory, mountPath: /etc/app.yaml, subPath: conf/app.yaml}}
    - {{name: memory, mountPath: /fresh, subPath: fresh}}
  initContainers:
  - name: init
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /memory/conf && echo from-init >/memory/conf/app.yaml"]
    volumeMounts:
    - {{name: memory, mountPath: /memory}}
  volumes:
  - {{name: settings, configMap: {{name: settings}}}}
  - {{name: secret, secret: {{secretName: secret}}}}
  - name: info
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: memory, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&manifest).unwrap();
    wait_ready(&k, &ns.name, "volumes", READY_DEADLINE);
    let sh_in = |container: &str, script: &str| {
        k.ok(&[
            "exec", "volumes", "-n", &ns.name, "-c", container, "--", "sh", "-c", script,
        ])
        .unwrap()
    };
    let sh = |script: &str| sh_in("app", script);
    assert_eq!(sh("cat /etc/settings/greeting"), "first");
    assert_eq!(sh("cat /etc/secret/password"), "s3cret");
    assert_eq!(sh("cat /etc/info/name"), "volumes");
    assert!(sh("cat /etc/info/labels").contains("tier=\"test\""));
    assert_eq!(
        sh("echo on-disk >/scratch/f && echo in-memory >/memory/f && cat /scratch/f /memory/f"),
        "on-disk\nin-memory\n"
    );
    // The emptyDir in memory is a tmpfs of the guest's, of the volume's size, that the pod's
    // containers share; nothing of it reaches the node's tmpfs, and it holds no more than
    // its size.
    assert_eq!(sh("stat -f -c %T /memory"), "tmpfs\n");
    assert_eq!(sh("stat -f -c '%b*%S' /memory"), "4096*4096\n");
    assert_eq!(sh_in("peer", "cat /memory/f"), "in-memory\n");
    // subPaths of it are the same volume's: a file the init container wrote, and a
    // directory made for the subPath that the whole volume shows.
    assert_eq!(sh_in("peer", "cat /etc/app.yaml"), "from-init\n");
    sh("echo late >/memory/fresh/x");
    assert_eq!(sh_in("peer", "cat /fresh/x"), "late\n");
    // The subPath's directory was made as the kubelet makes one, with the volume root's
    // permission bits: the peer, not root, writes in it.
    assert_eq!(
        sh_in("peer", "id -u && echo mine >/fresh/own && cat /fresh/own"),
        "1000\nmine\n"
    );
    let uid = k
        .jsonpath(&["pod", "volumes"], Some(&ns.name), "{.metadata.uid}")
        .unwrap();
    let on_node = std::path::Path::new(&s.dir)
        .join("k8s/kubelet/pods")
        .join(uid.trim())
        .join("volumes/kubernetes.io~empty-dir/memory");
    // Nothing but the empty directories the kubelet makes there for the subPaths
    // (`conf/app.yaml` among them, as it did not find the file).
    fn files_below(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        entries
            .flatten()
            .flat_map(|e| {
                let path = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    files_below(&path)
                } else {
                    vec![path]
                }
            })
            .collect()
    }
    let left = files_below(&on_node);
    assert!(left.is_empty(), "the node's tmpfs has {left:?}");
    // The pod's fsGroup owns the guest's tmpfs as the kubelet made it own the node's (group
    // 2000 and the setgid bit): a file made in it is the group's.
    let node_dir = std::fs::metadata(&on_node).unwrap();
    use std::os::unix::fs::MetadataExt;
    let node_mode = node_dir.mode() & 0o7777;
    assert_eq!(
        (node_dir.gid(), node_mode & 0o2000),
        (2000, 0o2000),
        "the kubelet's emptyDir on the node: group 2000, setgid"
    );
    assert_eq!(
        sh("stat -c '%g %a' /memory /memory/f"),
        format!("2000 {node_mode:o}\n2000 644\n")
    );
    let overfill = k
        .run(
            &[
                "exec",
                "volumes",
                "-n",
                &ns.name,
                "-c",
                "app",
                "--",
                "sh",
                "-c",
                "dd if=/dev/zero of=/memory/big bs=1M count=17",
            ],
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(
        !overfill.status.success() && text(&overfill.stderr).contains("No space left"),
        "17 MiB into a 16Mi emptyDir: {}",
        text(&overfill.stderr)
    );

    let token = sh("cat /var/run/secrets/kubernetes.io/serviceaccount/token");
    assert_eq!(token.split('.').count(), 3, "not a JWT: {token}");

    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "-n",
        &ns.name,
        "-p",
        r#"{"data":{"greeting":"second"}}"#,
    ])
    .unwrap();
    let started = Instant::now();
    eventually(
        Duration::from_secs(120),
        "the configMap's edit in the VM",
        || (sh("cat /etc/settings/greeting") == "second").then_some(()),
    );
    println!(
        "the configMap's edit reached the VM in {} s",
        started.elapsed().as_secs()
    );
}

/// The kubelet's summary API reports a vmlet pod's CPU and memory (its VM's, from the pod's
/// cgroup on the node).
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn the_kubelet_reports_a_vmlet_pods_cpu_and_memory() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "stats");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: busy, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 1; done"]
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&pod).unwrap();
    wait_ready(&k, &ns.name, "busy", READY_DEADLINE);
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", k.node);
    let (cpu, memory) = eventually(Duration::from_secs(90), "the pod's figures", || {
        let summary: serde_json::Value =
            serde_json::from_str(&k.ok(&["get", "--raw", &path]).ok()?).ok()?;
        let pod = summary["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == "busy")?
            .clone();
        let cpu = pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0);
        let memory = pod["memory"]["workingSetBytes"].as_u64().unwrap_or(0);
        (cpu > 0 && memory > 0).then_some((cpu, memory))
    });
    println!(
        "the kubelet's summary of a vmlet pod: {} ms of CPU, {} MiB working set",
        cpu / 1_000_000,
        memory >> 20
    );
}

/// The end of a pod as a kubelet runs it: the preStop hook runs in the VM before the
/// container is told to stop (its effect is seen first), and a container that ignores
/// SIGTERM is killed when terminationGracePeriodSeconds has passed.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn prestop_runs_first_and_a_container_that_ignores_sigterm_is_killed_at_the_grace_period() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "ending");
    let host = std::path::PathBuf::from(&s.dir).join(unique_id("ending"));
    std::fs::create_dir_all(&host).unwrap();
    let pods = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: hooked, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 20
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'echo term >>/out/order; exit 0' TERM; while :; do sleep 1; done"]
    lifecycle:
      preStop:
        exec: {{command: ["sh", "-c", "echo prestop >>/out/order"]}}
    volumeMounts: [{{name: out, mountPath: /out}}]
  volumes: [{{name: out, hostPath: {{path: {host}, type: Directory}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: stubborn, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
"#,
        ns = ns.name,
        image = s.image,
        host = host.display()
    );
    k.apply(&pods).unwrap();
    wait_ready(&k, &ns.name, "hooked", READY_DEADLINE);
    wait_ready(&k, &ns.name, "stubborn", READY_DEADLINE);

    k.ok(&["delete", "pod", "hooked", "-n", &ns.name, "--timeout=60s"])
        .unwrap();
    let order = std::fs::read_to_string(host.join("order")).unwrap_or_default();
    std::fs::remove_dir_all(&host).unwrap();
    assert_eq!(order, "prestop\nterm\n", "what the pod's end did, in order");

    let started = Instant::now();
    k.ok(&["delete", "pod", "stubborn", "-n", &ns.name, "--timeout=60s"])
        .unwrap();
    let took = started.elapsed();
    println!(
        "a container ignoring SIGTERM ended {} ms after its delete",
        took.as_millis()
    );
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(30),
        "ended after {took:?} with a grace period of 5 s"
    );
}

/// A container with a 1 GiB memory limit sees it in the VM and can use most of it.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn a_container_with_a_gib_memory_limit_sees_it_and_uses_it() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "memory");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: big, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
    resources:
      requests: {{memory: 1Gi}}
      limits: {{memory: 1Gi}}
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&pod).unwrap();
    wait_ready(&k, &ns.name, "big", READY_DEADLINE);
    let sh = |script: &str| {
        k.ok(&["exec", "big", "-n", &ns.name, "--", "sh", "-c", script])
            .unwrap()
    };
    // Its own cgroup at the top of its cgroup namespace, as runc shows it on a cgroup v2
    // node: for the container's init and for an exec.
    assert_eq!(sh("cat /proc/1/cgroup /proc/self/cgroup"), "0::/\n0::/\n");
    let limit = sh("cat /sys/fs/cgroup/memory.max");
    assert_eq!(limit.trim(), "1073741824");
    // 768 MiB in one string, held by awk.
    let used = sh("awk 'BEGIN { s = sprintf(\"%805306368s\", \"\"); print length(s) }'");
    assert_eq!(used.trim(), "805306368");
}

/// `kubectl debug` adds an ephemeral container into the running pod's VM: it runs on the
/// guest's kernel beside the pod's container (the pod's loopback reaches its server). With
/// `--target` in a pod whose containers have PID namespaces of their own, the ephemeral
/// container is refused with the reason in its status (the target cannot be told).
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn kubectl_debug_adds_an_ephemeral_container_into_the_pods_vm() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "debug");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: debugged, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo answered-by-app >/www/index.html && httpd -p 8080 -h /www && trap 'exit 0' TERM; while :; do sleep 1; done"]
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&pod).unwrap();
    wait_ready(&k, &ns.name, "debugged", READY_DEADLINE);
    let debug = |name: &str, extra: &[&str]| {
        let mut args = vec![
            "debug",
            "debugged",
            "-n",
            &ns.name,
            "--profile=general",
            "--image-pull-policy=Never",
            "-c",
            name,
        ];
        let image = format!("--image={}", s.image);
        args.push(&image);
        args.extend_from_slice(extra);
        args.extend_from_slice(&[
            "--",
            "sh",
            "-c",
            "uname -r; wget -qO- http://127.0.0.1:8080/index.html",
        ]);
        k.ok(&args).unwrap();
    };
    // The status of ephemeral container `name`, once it has the state `state`.
    let status = |name: &str, state: &str| {
        let path =
            format!("{{.status.ephemeralContainerStatuses[?(@.name==\"{name}\")].state.{state}}}");
        eventually(Duration::from_secs(120), &format!("{name} {state}"), || {
            let found = k
                .jsonpath(&["pod", "debugged"], Some(&ns.name), &path)
                .ok()?;
            (!found.trim().is_empty()).then_some(found)
        })
    };

    debug("look", &[]);
    status("look", "terminated");
    let logs = k
        .ok(&["logs", "debugged", "-n", &ns.name, "-c", "look"])
        .unwrap();
    assert_eq!(
        logs,
        format!("{}\nanswered-by-app\n", guest_kernel()),
        "the ephemeral container's output"
    );

    debug("targeted", &["--target=app"]);
    let waiting = eventually(Duration::from_secs(120), "the refusal", || {
        let found = status("targeted", "waiting");
        found.contains("kubectl debug --target").then_some(found)
    });
    println!("kubectl debug --target on a vmlet pod: {waiting}");
}

/// `kubectl drain` evicts vmlet pods (the node cordoned; their VMs go) and the
/// Deployment's replacements stay pending until the node is uncordoned.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn kubectl_drain_evicts_vmlet_pods_and_leaves_nothing() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "drain");
    let deployment = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: drained, namespace: {ns}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: drained}}}}
  template:
    metadata: {{labels: {{app: drained}}}}
    spec:
      runtimeClassName: vmlet
      terminationGracePeriodSeconds: 2
      containers:
      - name: app
        image: {image}
        imagePullPolicy: Never
        command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&deployment).unwrap();
    let rollout = k
        .run(
            &[
                "rollout",
                "status",
                "deployment/drained",
                "-n",
                &ns.name,
                "--timeout=300s",
            ],
            READY_DEADLINE + Duration::from_secs(30),
        )
        .unwrap();
    assert!(rollout.status.success(), "{}", text(&rollout.stderr));
    // Its pods' VMs (another test's pod may run beside).
    let sandboxes = sandboxes_in(&s, &ns.name);
    let ours = || of_sandboxes(s.vmlet_domains().unwrap(), &sandboxes);
    assert_eq!(ours().len(), 2, "the VMs of the deployment's 2 pods");

    struct Uncordon<'a>(&'a Cluster);
    impl Drop for Uncordon<'_> {
        fn drop(&mut self) {
            let _ = self.0.ok(&["uncordon", &self.0.node]);
        }
    }
    let _uncordon = Uncordon(&k);
    let selector = "--pod-selector=app=drained";
    let drained = k
        .run(
            &["drain", &k.node, selector, "--timeout=180s"],
            Duration::from_secs(200),
        )
        .unwrap();
    assert!(
        drained.status.success(),
        "drain: {}{}",
        text(&drained.stdout),
        text(&drained.stderr)
    );
    // Evicted: the pods that run are gone, their replacements wait for a node.
    let phases = k
        .jsonpath(&["pods"], Some(&ns.name), "{.items[*].status.phase}")
        .unwrap();
    assert!(
        phases.split_whitespace().all(|p| p == "Pending"),
        "pods after the drain: {phases}"
    );
    eventually(
        Duration::from_secs(120),
        "the evicted pods' VMs gone",
        || ours().is_empty().then_some(()),
    );
}

/// An in-place resize (`kubectl patch --subresource resize`) reaches the VM: the kubelet
/// reports the new resources and the guest has the memory the new limit asks for.
#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn an_in_place_resize_reaches_the_vm() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "resize");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: resized, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
    resources:
      requests: {{cpu: 100m, memory: 64Mi}}
      limits: {{cpu: 500m, memory: 128Mi}}
"#,
        ns = ns.name,
        image = s.image
    );
    k.apply(&pod).unwrap();
    wait_ready(&k, &ns.name, "resized", READY_DEADLINE);
    let mem_total_kib = |k: &Cluster| -> u64 {
        let meminfo = k
            .ok(&[
                "exec",
                "resized",
                "-n",
                &ns.name,
                "--",
                "cat",
                "/proc/meminfo",
            ])
            .unwrap();
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("MemTotal")
    };
    let before = mem_total_kib(&k);
    // A resize to 192Mi, then one of 6 MiB more, as Kubernetes' own resize specs step (less
    // than the guest driver's plug step, 4 MiB on Linux 6.1: the VM grows a whole one).
    let mut after = before;
    for (cpu, limit) in [("1", "192Mi"), ("1", "198Mi")] {
        let patch = format!(
            r#"{{"spec":{{"containers":[{{"name":"app","resources":{{"requests":{{"cpu":"200m","memory":"96Mi"}},"limits":{{"cpu":"{cpu}","memory":"{limit}"}}}}}}]}}}}"#
        );
        k.ok(&[
            "patch",
            "pod",
            "resized",
            "-n",
            &ns.name,
            "--subresource",
            "resize",
            "-p",
            &patch,
        ])
        .unwrap();
        eventually(
            Duration::from_secs(90),
            &format!("the resize to {limit} applied"),
            || {
                let limits = k
                    .jsonpath(
                        &["pod", "resized"],
                        Some(&ns.name),
                        "{.status.containerStatuses[0].resources.limits.memory}",
                    )
                    .ok()?;
                (limits.trim() == limit).then_some(())
            },
        );
        let now = mem_total_kib(&k);
        println!(
            "resize to a {limit} limit: the guest's MemTotal went from {} to {} MiB",
            after >> 10,
            now >> 10
        );
        after = now;
    }
    assert!(
        after >= before + 54 * 1024,
        "the guest's memory did not follow the limit: {before} kB, then {after} kB"
    );
    let conditions = k
        .jsonpath(
            &["pod", "resized"],
            Some(&ns.name),
            "{.status.conditions[*].type}",
        )
        .unwrap();
    assert!(
        !conditions.contains("PodResize"),
        "a resize still pending or in progress: {conditions}"
    );
}

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

/// A shipped manifest of deploy/ aimed at `root` instead of the node's `/`, and without the
/// containerd restart (the scratch root has no systemd): the only changes.
fn aimed_at(manifest: &str, root: &std::path::Path) -> String {
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

    // The node's label is the installer's to set and the cleanup's to remove: it goes
    // first, and comes back however the test ends.
    struct Relabel<'a>(&'a Cluster);
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
    let _relabel = Relabel(&k);
    k.ok(&["label", "node", &k.node, "vmlet.io/runtime-"])
        .unwrap();
    let label = |k: &Cluster| {
        k.jsonpath(
            &["node", &k.node],
            None,
            "{.metadata.labels.vmlet\\.io/runtime}",
        )
        .unwrap()
    };

    // On disk (the release holds the guest image), removed however the test ends.
    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let scratch = Scratch(std::path::Path::new("/var/tmp").join(unique_id("vmlet-node-root")));
    let root = scratch.0.clone();
    // Made new (a name planted in /var/tmp, a link among them, is refused), root's alone.
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&root)
        .unwrap();
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    let config =
        "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n";
    std::fs::write(root.join("etc/containerd/config.toml"), config).unwrap();

    let deploy = aimed_at("vmlet-deploy.yaml", &root);
    k.apply(&deploy).unwrap();
    let started = Instant::now();
    eventually(Duration::from_secs(180), "the installer's label", || {
        (label(&k) == "true").then_some(())
    });
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
        let logs = k.ok(&["logs", "-n", "kube-system", "daemonset/vmlet-installer"]);
        match logs {
            Ok(logs) if logs.contains("installed; waiting for SIGTERM") => break,
            other => assert!(Instant::now() < deadline, "the installer's log: {other:?}"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    // Off again: the DaemonSet first (its pods would install again), then the Job.
    let deleted = k
        .with_input(&["delete", "-f", "-", "--timeout=120s"], &deploy)
        .unwrap();
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    let cleanup = aimed_at("vmlet-cleanup.yaml", &root);
    k.apply(&cleanup).unwrap();
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
    assert_eq!(label(&k), "", "the label after the cleanup");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap(),
        config,
        "containerd's config after the cleanup"
    );
    assert!(!root.join("usr/local/bin/containerd-shim-vmlet-v2").exists());
    let deleted = k
        .with_input(&["delete", "-f", "-", "--timeout=120s"], &cleanup)
        .unwrap();
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    drop(scratch);
}
