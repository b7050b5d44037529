//! Kubernetes pods through containerd's CRI plugin with runtime handler `vmlet`: the CNI
//! (bridge + host-local) network the plugin set up reaches the VM. containerd runs in the
//! stack's node network namespace, so the CNI bridge lives there. Run by `make test`.

use std::time::{Duration, Instant};

use crate::support::PodUnderTest;
use vmlet_integration::cri::Cri;
use vmlet_integration::{unique_id, Stack};

/// The gateway of the stack's CNI network (scripts/stack).
const GATEWAY: &str = "10.215.0.1";

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_pod_gets_its_cni_address_inside_the_vm() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut cri = Cri::connect(&s.containerd).await.unwrap();
    let logs = std::env::temp_dir().join(unique_id("vmlet-cri-logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let name = unique_id("cri");
    let config = Cri::pod_config(&name, &unique_id("uid"), &logs.to_string_lossy());
    let pod = cri.run_pod(&config, "vmlet").await.unwrap();
    let ip = cri.pod_ip(&pod).await.unwrap();

    let script = format!(
        "ip addr; ping -c 1 -W 5 {GATEWAY} >/dev/null && echo GATEWAY-OK; echo DONE; sleep 1000"
    );
    let container = cri
        .create_and_start(&pod, &config, "c1", &s.image, &["sh", "-c", &script])
        .await
        .unwrap();
    let log = logs.join("c1.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("DONE") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    cri.remove_container(&container, 2).await.unwrap();
    cri.remove_pod(&pod).await.unwrap();
    std::fs::remove_dir_all(&logs).unwrap();
    assert!(
        text.contains(&format!("{ip}/")),
        "the CNI address {ip} is not in the guest:\n{text}"
    );
    assert!(
        text.contains("GATEWAY-OK"),
        "the bridge gateway is not reachable:\n{text}"
    );
    assert!(!s.has_pod_domain(&pod), "the pod's VM is left");
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_exec_sync_returns_output_and_exit_code() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    let c = p.container("c1", &s.image, &["sleep", "1000"], 0).await;
    let r = p
        .cri
        .exec_sync(&c, &["sh", "-c", "echo out; echo err >&2; exit 3"], 30)
        .await
        .unwrap();
    p.finish(&[&c]).await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&r.stderr), "err\n");
    assert_eq!(r.exit_code, 3);
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_stats_of_a_busy_container_are_not_zero() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    let c = p
        .container(
            "busy",
            &s.image,
            &[
                "sh",
                "-c",
                "x=$(head -c 4000000 /dev/zero | tr '\\0' a); while :; do :; done",
            ],
            0,
        )
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = p.cri.cpu_and_working_set(&c).await;
    p.finish(&[&c]).await;
    let (cpu, memory) = stats.unwrap();
    assert!(
        cpu > 100_000_000,
        "CPU used in 3 s of a busy loop: {cpu} ns"
    );
    assert!(
        memory > 1 << 20,
        "working set of a shell holding 4 MB: {memory} bytes"
    );
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_container_over_its_memory_limit_is_oom_killed() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    // dd's 200 MiB buffer is filled from /dev/zero: far over the 64 MiB limit.
    let c = p
        .container(
            "hog",
            &s.image,
            &["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
            64 << 20,
        )
        .await;
    let status = p.wait_exited(&c).await;
    p.finish(&[&c]).await;
    assert_eq!(status.state, 2, "the container did not exit: {status:?}");
    assert_eq!(status.reason, "OOMKilled", "{status:?}");
    assert_eq!(status.exit_code, 137, "{status:?}");
}

/// The guest's MemTotal in MiB, as a container of it reads /proc/meminfo.
async fn guest_mem_total_mib(p: &mut PodUnderTest, c: &str) -> u64 {
    let r = p
        .cri
        .exec_sync(c, &["sh", "-c", "grep MemTotal /proc/meminfo"], 30)
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    let kib: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MemTotal in {out:?}"));
    kib / 1024
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_update_sets_the_limit_and_grows_the_vm_for_a_larger_one() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    let c = p.container("c1", &s.image, &["sleep", "1000"], 0).await;
    let updated = p.cri.update_memory(&c, 100 << 20).await;
    let read = p
        .cri
        .exec_sync(
            &c,
            &[
                "sh",
                "-c",
                // Its own cgroup, at the top of its cgroup namespace.
                "cat /sys/fs/cgroup/memory.max",
            ],
            30,
        )
        .await;
    let before = guest_mem_total_mib(&mut p, &c).await;
    // The pod's VM booted with the node's default (256 MiB): 1 GiB and the node's overhead
    // (128 MiB) need 896 MiB more.
    let grown = p.cri.update_memory(&c, 1024 << 20).await;
    let after = guest_mem_total_mib(&mut p, &c).await;
    p.finish(&[&c]).await;
    updated.unwrap();
    let read = read.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        (100u64 << 20).to_string(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    grown.unwrap();
    assert!(
        after >= before + 850,
        "MemTotal {before} MiB before raising the limit to 1 GiB, {after} MiB after"
    );
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_a_containers_memory_limit_fits_in_the_pods_vm() {
    // The pod's config gives no pod-level resources, as containerd 1.6 never passes them:
    // the VM boots with the node's default, and grows when the container asks for 1 GiB.
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    let c = p
        .container("big", &s.image, &["sleep", "1000"], 1024 << 20)
        .await;
    let total = guest_mem_total_mib(&mut p, &c).await;
    // 700 MiB touched at once: far more than a 256 MiB VM holds, within the limit.
    let filled = p
        .cri
        .exec_sync(
            &c,
            &["dd", "if=/dev/zero", "of=/dev/null", "bs=700M", "count=1"],
            120,
        )
        .await;
    p.finish(&[&c]).await;
    assert!(total >= 1000, "the guest has {total} MiB for a 1 GiB limit");
    let filled = filled.unwrap();
    assert_eq!(
        filled.exit_code,
        0,
        "dd of 700 MiB: {}",
        String::from_utf8_lossy(&filled.stderr)
    );
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_pod_containers_share_vm_ipc_uts_and_localhost() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    let server = p
        .container(
            "server",
            &s.image,
            &[
                "sh",
                "-c",
                "touch /only-server; while :; do echo from-server | nc -l -p 7000; done",
            ],
            0,
        )
        .await;
    let client = p.container("client", &s.image, &["sleep", "1000"], 0).await;
    let facts = "cat /proc/sys/kernel/random/boot_id; readlink /proc/self/ns/ipc; \
                 readlink /proc/self/ns/uts; readlink /proc/self/ns/pid; hostname; \
                 ls /only-server 2>/dev/null || echo no-server-file";
    let mut seen = Vec::new();
    for c in [&server, &client] {
        let r = p.cri.exec_sync(c, &["sh", "-c", facts], 30).await.unwrap();
        seen.push(String::from_utf8_lossy(&r.stdout).into_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let r = p
            .cri
            .exec_sync(
                &client,
                &["sh", "-c", "nc -w 3 127.0.0.1 7000 </dev/null"],
                30,
            )
            .await
            .unwrap();
        let out = String::from_utf8_lossy(&r.stdout).into_owned();
        if out.contains("from-server") || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    p.finish(&[&client, &server]).await;
    let lines: Vec<Vec<&str>> = seen.iter().map(|s| s.lines().collect()).collect();
    let (a, b) = (&lines[0], &lines[1]);
    assert_eq!(a.len(), 6, "{seen:?}");
    assert_eq!(b.len(), 6, "{seen:?}");
    assert_eq!(a[0], b[0], "one VM (boot id): {seen:?}");
    assert_eq!(a[1], b[1], "one IPC namespace: {seen:?}");
    assert_eq!(a[2], b[2], "one UTS namespace: {seen:?}");
    assert_ne!(a[3], b[3], "a PID namespace each: {seen:?}");
    assert_eq!(a[4], b[4], "the pod's hostname: {seen:?}");
    assert_eq!(a[5], "/only-server", "{seen:?}");
    assert_eq!(b[5], "no-server-file", "each its own rootfs: {seen:?}");
    assert!(
        reply.contains("from-server"),
        "localhost between containers: {reply:?}"
    );
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_share_process_namespace_gives_the_pod_one_pid_namespace() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start_with(&s, Cri::share_process_namespace).await;
    let first = p.container("first", &s.image, &["sleep", "1001"], 0).await;
    let second = p.container("second", &s.image, &["sleep", "1002"], 0).await;
    let facts = "readlink /proc/self/ns/pid; ps -o pid,args";
    let mut seen = Vec::new();
    for c in [&first, &second] {
        let r = p.cri.exec_sync(c, &["sh", "-c", facts], 30).await.unwrap();
        assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
        seen.push(String::from_utf8_lossy(&r.stdout).into_owned());
    }
    // A signal from one container reaches the other's process, as under runc.
    let killed = p
        .cri
        .exec_sync(
            &second,
            &[
                "sh",
                "-c",
                "kill $(ps -o pid,args | awk '$2 == \"sleep\" && $3 == \"1001\" {print $1}') && echo sent",
            ],
            30,
        )
        .await
        .unwrap();
    let status = p.wait_exited(&first).await;
    p.finish(&[&first, &second]).await;
    let ns: Vec<&str> = seen
        .iter()
        .map(|s| s.lines().next().unwrap_or(""))
        .collect();
    assert_eq!(ns[0], ns[1], "one PID namespace: {seen:?}");
    for view in &seen {
        assert!(
            view.contains("sleep 1001") && view.contains("sleep 1002"),
            "{view}"
        );
        // The pause process (the sandbox's init) is PID 1 of the pod's namespace.
        let pid1 = view
            .lines()
            .find(|l| l.split_whitespace().next() == Some("1"));
        assert!(pid1.is_some_and(|l| l.contains("trap")), "{view}");
    }
    assert!(
        String::from_utf8_lossy(&killed.stdout).contains("sent"),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    assert_eq!(
        status.state,
        k8s_cri::v1::ContainerState::ContainerExited as i32,
        "{status:?}"
    );
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_log_has_every_line_up_to_the_exit() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut p = PodUnderTest::start(&s).await;
    let script = "i=1; while [ $i -le 300 ]; do echo line-$i; i=$((i+1)); done; \
                  echo to-stderr >&2; printf last-words";
    let c = p
        .container("talker", &s.image, &["sh", "-c", script], 0)
        .await;
    let status = p.wait_exited(&c).await;
    let log = std::fs::read_to_string(p.logs.join("talker.log")).unwrap_or_default();
    p.finish(&[&c]).await;
    assert_eq!(status.state, 2, "the container did not exit: {status:?}");
    let lines: Vec<&str> = log.lines().collect();
    for i in [1, 150, 300] {
        let want = format!(" stdout F line-{i}");
        assert!(
            lines.iter().any(|l| l.ends_with(&want)),
            "line-{i} missing from the CRI log:\n{log}"
        );
    }
    assert!(
        lines.iter().any(|l| l.ends_with(" stderr F to-stderr")),
        "{log}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with(" stdout P last-words")),
        "the last, unterminated output before exit:\n{log}"
    );
}

/// `crictl port-forward` (containerd dials localhost:PORT in the pod's network namespace)
/// reaches a web server in the VM, connection after connection; a port nothing in the guest
/// listens on gives the client a closed connection, not a hang (crictl, like kubectl, then
/// ends the session).
#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_port_forward_reaches_a_server_in_the_vm() {
    use vmlet_integration::testnet::{tcp_exchange, CrictlForward};

    let s = Stack::from_env().expect("the vmlet stack");
    let node = std::env::var("VMLET_NODE_NETNS").expect("VMLET_NODE_NETNS (the stack's)");
    let mut p = PodUnderTest::start(&s).await;
    let script = "mkdir -p /www && echo served-from-the-vm >/www/index.html && \
                  exec httpd -f -p 8080 -h /www";
    let c = p.container("web", &s.image, &["sh", "-c", script], 0).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let listening = ["sh", "-c", "netstat -ltn | grep -q ':8080 '"];
    while p.cri.exec_sync(&c, &listening, 10).await.unwrap().exit_code != 0 {
        assert!(
            Instant::now() < deadline,
            "httpd does not listen in the guest"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let crictl = CrictlForward::start(&node, &s.containerd, &p.pod, &["18080:8080", "18081:8081"]);
    let request = "GET / HTTP/1.0\r\n\r\n";
    let pages: Vec<_> = (0..3)
        .map(|_| tcp_exchange(&node, "127.0.0.1", 18080, request))
        .collect();
    let nothing = tcp_exchange(&node, "127.0.0.1", 18081, request);
    let first = crictl.first_line.clone();
    drop(crictl);
    p.finish(&[&c]).await;
    assert!(first.contains("Forwarding from"), "crictl said {first:?}");
    for page in pages {
        assert!(
            page.as_deref()
                .is_some_and(|p| p.contains("served-from-the-vm")),
            "through the forward: {page:?}"
        );
    }
    assert_eq!(nothing, None, "a port nothing listens on answered");
}
