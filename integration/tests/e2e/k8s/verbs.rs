//! kubectl's verbs on a vmlet pod (exec, logs, attach, cp, port-forward) and `kubectl
//! debug`'s ephemeral container.

use super::*;

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
