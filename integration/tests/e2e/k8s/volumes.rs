//! Kubernetes' volumes in the VM: configMap (and its edit), secret, Downward API, emptyDir
//! on disk and in memory, the projected token.

use super::*;

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
    k.apply(&manifest(&ns.name, &s.image)).unwrap();
    wait_ready(&k, &ns.name, "volumes", READY_DEADLINE);
    let sh_in = |container: &str, script: &str| sh_in(&k, &ns.name, "volumes", container, script);
    let sh = |script: &str| sh_in("app", script);
    assert_eq!(sh("cat /etc/settings/greeting"), "first");
    assert_eq!(sh("cat /etc/secret/password"), "s3cret");
    assert_eq!(sh("cat /etc/info/name"), "volumes");
    assert!(sh("cat /etc/info/labels").contains("tier=\"test\""));
    assert_eq!(
        sh("echo on-disk >/scratch/f && echo in-memory >/memory/f && cat /scratch/f /memory/f"),
        "on-disk\nin-memory\n"
    );
    the_memory_volume_is_the_guests(&s, &k, &ns.name, &sh_in);
    let token = sh("cat /var/run/secrets/kubernetes.io/serviceaccount/token");
    assert_eq!(token.split('.').count(), 3, "not a JWT: {token}");
    a_configmap_edit_follows(&k, &ns.name, &sh);
}

/// The test's pod (in namespace `ns`, with `image`), its configMap and its secret.
fn manifest(ns: &str, image: &str) -> String {
    format!(
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
"#
    )
}

/// The emptyDir in memory is a tmpfs of the guest's, of the volume's size, that the pod's
/// containers share (subPaths of it included); nothing of it reaches the node's tmpfs, it
/// is the pod's fsGroup's as the node's is, and it holds no more than its size.
fn the_memory_volume_is_the_guests(
    s: &vmlet_integration::Stack,
    k: &Cluster,
    ns: &str,
    sh_in: &dyn Fn(&str, &str) -> String,
) {
    let sh = |script: &str| sh_in("app", script);
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
        .jsonpath(&["pod", "volumes"], Some(ns), "{.metadata.uid}")
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
                ns,
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
}

/// An edit of the configMap reaches the file in the VM within the kubelet's sync.
fn a_configmap_edit_follows(k: &Cluster, ns: &str, sh: &dyn Fn(&str) -> String) {
    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "-n",
        ns,
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
