//! The end and the change of a pod as a kubelet drives them: preStop and the grace period,
//! a drain, an in-place resize.

use super::*;

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
    let ours = || of_sandboxes(s.pod_vms().unwrap(), &sandboxes);
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
    let before = mem_total_kib(&k, &ns.name, "resized");
    // A resize to 192Mi, then one of 6 MiB more, as Kubernetes' own resize specs step (less
    // than the guest driver's plug step, 4 MiB on Linux 6.1: the VM grows a whole one).
    let mut after = before;
    for (cpu, limit) in [("1", "192Mi"), ("1", "198Mi")] {
        resize(&k, &ns.name, cpu, limit);
        let now = mem_total_kib(&k, &ns.name, "resized");
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

/// The guest's MemTotal (KiB) as `pod` in namespace `ns` reads it.
fn mem_total_kib(k: &Cluster, ns: &str, pod: &str) -> u64 {
    let meminfo = k
        .ok(&["exec", pod, "-n", ns, "--", "cat", "/proc/meminfo"])
        .unwrap();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal")
}

/// Resizes the `app` container of pod `resized` in namespace `ns` in place to `cpu` and a
/// memory `limit`, and waits (90 s at most) until the kubelet reports the limit applied.
fn resize(k: &Cluster, ns: &str, cpu: &str, limit: &str) {
    let patch = format!(
        r#"{{"spec":{{"containers":[{{"name":"app","resources":{{"requests":{{"cpu":"200m","memory":"96Mi"}},"limits":{{"cpu":"{cpu}","memory":"{limit}"}}}}}}]}}}}"#
    );
    k.ok(&[
        "patch",
        "pod",
        "resized",
        "-n",
        ns,
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
                    Some(ns),
                    "{.status.containerStatuses[0].resources.limits.memory}",
                )
                .ok()?;
            (limits.trim() == limit).then_some(())
        },
    );
}
