//! Pods as a kubelet runs them: a Deployment's replicas, a liveness probe's restart, a
//! memory limit, the kubelet's stats.

use super::*;

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
        s.pod_vms().unwrap().len() >= 4,
        "fewer than 4 VMs for 4 pods"
    );

    // Only the deployment's VMs and state are waited for: another test's pod may run beside.
    let sandboxes = sandboxes_in(&s, &ns.name);
    assert!(
        sandboxes.len() >= 4,
        "sandboxes of the deployment: {sandboxes:?}"
    );
    scaled_to_zero_nothing_is_left(&s, &k, &ns.name, &sandboxes);
}

/// Scaled to zero, the deployment's pods go, then (the kubelet removes the sandboxes after
/// their pods) every VM and pod state of `sandboxes`.
fn scaled_to_zero_nothing_is_left(
    s: &vmlet_integration::Stack,
    k: &Cluster,
    ns: &str,
    sandboxes: &[String],
) {
    let ours = |names: Vec<String>| of_sandboxes(names, sandboxes);
    k.ok(&["scale", "deployment/web", "-n", ns, "--replicas=0"])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let left = k.ok(&["get", "pods", "-n", ns, "-o", "name"]).unwrap();
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
    while !ours(s.pod_vms().unwrap()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "vmlet domains left after scaling to 0: {:?}",
            ours(s.pod_vms().unwrap())
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
