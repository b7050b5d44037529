//! A projected service-account token in a vmlet pod: readable in the VM, valid for the API
//! server, and renewed in place when the kubelet rotates it. The kubelet renews a token at
//! 80% of its lifetime, and the shortest a pod may ask for is 600 s: the test waits about
//! eight minutes, so `make test` runs it beside the other cluster phases
//! (`scripts/e2e cluster-slow`) rather than after them.

use std::time::{Duration, Instant};

use crate::k8s::{cluster, wait_ready, Namespace, READY_DEADLINE};
use crate::support::stack;

/// The token's lifetime the pod asks for: the shortest the API server accepts.
const TOKEN_SECONDS: u64 = 600;
/// How long after the VM first read the token the renewed one must be there: the kubelet
/// renews at 80% of the lifetime (less up to 10 s of jitter) and writes the volume at its
/// next sync of the pod (within a minute); the old token is still valid until then.
const RENEWED_WITHIN: Duration = Duration::from_secs(TOKEN_SECONDS * 8 / 10 + 60);

/// Whether the API server takes `token` as the service account `default` of `ns` in `pod`
/// (a TokenReview, as a server the pod calls would make).
fn authenticates(k: &vmlet_integration::cluster::Cluster, ns: &str, pod: &str, token: &str) {
    let review = format!(
        r#"{{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {{"token": "{token}"}}}}"#
    );
    let out = k
        .with_input(
            &[
                "create",
                "-f",
                "-",
                "-o",
                "jsonpath={.status.authenticated} {.status.user.username} {.status.user.extra.authentication\\.kubernetes\\.io/pod-name}",
            ],
            &review,
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("true system:serviceaccount:{ns}:default [\"{pod}\"]"),
        "the TokenReview of the token read in the VM: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs the vmlet stack and its cluster: make test"]
fn a_projected_token_is_readable_in_the_vm_and_renewed_in_place() {
    let s = stack();
    let k = cluster();
    let ns = Namespace::new(&k, "token");
    let manifest = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: token, namespace: {ns}}}
spec:
  runtimeClassName: vmlet
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
    volumeMounts:
    - {{name: token, mountPath: /var/run/secrets/tokens}}
  volumes:
  - name: token
    projected:
      sources:
      - serviceAccountToken: {{path: api, expirationSeconds: {TOKEN_SECONDS}}}
"#,
        ns = ns.name,
        image = s.image
    );
    let started = Instant::now();
    k.apply(&manifest).unwrap();
    wait_ready(&k, &ns.name, "token", READY_DEADLINE);
    let read = || {
        k.ok(&[
            "exec",
            "token",
            "-n",
            &ns.name,
            "--",
            "cat",
            "/var/run/secrets/tokens/api",
        ])
    };
    let first = read().unwrap();
    let first_read = Instant::now();
    assert_eq!(first.split('.').count(), 3, "not a JWT: {first:?}");
    authenticates(&k, &ns.name, "token", &first);
    println!(
        "the VM read a valid token {} s after the pod's creation",
        started.elapsed().as_secs()
    );
    let deadline = first_read + RENEWED_WITHIN;
    // make test restarts containerd meanwhile (the conformance specs' handler switch): an
    // exec that fails then, or whose output is cut off with it (kubectl may then end
    // without an error and without the token), is tried again.
    let renewed = loop {
        let now = read();
        match &now {
            Ok(token) if *token != first && token.split('.').count() == 3 => break token.clone(),
            Ok(token) if *token != first => println!("an exec read {token:?}: tried again"),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the token in the VM was not renewed within {RENEWED_WITHIN:?} of its first read (last read: {now:?})"
        );
        std::thread::sleep(Duration::from_secs(5));
    };
    println!(
        "the kubelet's renewed token reached the VM {} s after its first read",
        first_read.elapsed().as_secs()
    );
    authenticates(&k, &ns.name, "token", &renewed);
}
