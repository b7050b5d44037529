//! End to end: many create/start/delete cycles of a pod leak nothing. Each pod has a network
//! (a namespace of the test's, wired to a tap every time). After one warm-up cycle (libvirt
//! and containerd open some things once), the counts of shims, QEMUs and other helpers, the
//! open fds of the long-lived daemons, the mounts, the links (of the host, the node and the
//! pod namespace), the pod namespace's qdiscs and the libvirt domains are taken,
//! `VMLET_CYCLES` (default 100) cycles run, and the counts must be the same again. The
//! figures are printed. Run by `make test`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vmlet_integration::testnet::{tc, TestNet};
use vmlet_integration::{bounded, unique_id, Stack, RUNTIME};

fn stack() -> Stack {
    Stack::from_env().expect("the vmlet stack")
}

fn count_fds(pid_file: &str) -> usize {
    let pid = std::fs::read_to_string(pid_file)
        .unwrap_or_else(|e| panic!("{pid_file}: {e}"))
        .trim()
        .to_owned();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or_else(|e| panic!("fds of {pid}: {e}"))
}

fn count_links(netns: Option<&str>) -> usize {
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = bounded::output(cmd.args(["-o", "link", "show"])).unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// What must not grow, by name (`net`: the pods' network namespace).
fn figures(s: &Stack, net: &TestNet) -> BTreeMap<&'static str, usize> {
    let processes = s.stack_processes();
    let kind = |k: &str| processes.iter().filter(|(_, c)| c.contains(k)).count();
    let node = std::env::var("VMLET_NODE_NETNS").unwrap_or_default();
    BTreeMap::from([
        ("shims", kind("containerd-shim-vmlet")),
        ("qemu", kind("qemu-system")),
        ("virtiofsd", kind("virtiofsd")),
        ("vhost-device-vsock", kind("vhost-device-vsock")),
        ("domains", s.vmlet_domains().unwrap().len()),
        ("state mounts", s.state_mounts().len()),
        (
            "state dirs",
            std::fs::read_dir(format!("{}/state", s.dir))
                .map(|d| d.count())
                .unwrap_or(0),
        ),
        ("host links", count_links(None)),
        ("node links", count_links(Some(&node))),
        ("pod netns links", count_links(Some(&net.pod))),
        (
            "pod netns qdiscs",
            tc(&net.pod, &["qdisc", "show"]).lines().count(),
        ),
        (
            "containerd fds",
            count_fds(&format!("{}/containerd/containerd.pid", s.dir)),
        ),
        (
            "libvirtd fds",
            count_fds(&format!("{}/libvirt/libvirtd.pid", s.dir)),
        ),
    ])
}

fn cycle(s: &Stack, net: &TestNet, id: &str) {
    let with_ns = format!("network:{}", net.pod_path().display());
    let out = s.run(id, &["--with-ns", &with_ns], &["true"]).unwrap();
    assert!(
        out.status.success(),
        "{id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for the processes of finished pods to be gone (shims exit just after delete).
fn settle(
    s: &Stack,
    net: &TestNet,
    want: &BTreeMap<&'static str, usize>,
) -> BTreeMap<&'static str, usize> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = figures(s, net);
        if &now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn many_cycles_leave_every_count_as_it_was() {
    let s = stack();
    let cycles: usize = std::env::var("VMLET_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let net = TestNet::new("cycles", 1500);
    cycle(&s, &net, &unique_id("warmup"));
    let before = settle(&s, &net, &figures(&s, &net));
    let started = Instant::now();
    for i in 0..cycles {
        cycle(&s, &net, &unique_id(&format!("cycle{i}")));
    }
    let took = started.elapsed();
    let after = settle(&s, &net, &before);
    println!(
        "{cycles} create/start/delete cycles in {:.1} s ({:.2} s each)",
        took.as_secs_f64(),
        took.as_secs_f64() / cycles as f64
    );
    println!("{:<20} {:>8} {:>8}", "", "before", "after");
    for (name, b) in &before {
        println!("{name:<20} {b:>8} {:>8}", after[name]);
    }
    assert_eq!(before, after, "counts changed over {cycles} cycles");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn concurrent_pods_all_run_and_all_go() {
    // Eight pods at once, each a small VM (1 vCPU, 128 MiB) running until told to stop.
    let s = stack();
    let net = TestNet::new("concurrent", 1500);
    let before = settle(&s, &net, &figures(&s, &net));
    let ids: Vec<String> = (0..8).map(|i| unique_id(&format!("conc{i}"))).collect();
    let started: Vec<_> = ids
        .iter()
        .map(|id| {
            let s = s.clone();
            let id = id.clone();
            std::thread::spawn(move || {
                s.ctr_output(&[
                    "run",
                    "-d",
                    "--runtime",
                    RUNTIME,
                    "--annotation",
                    "vmlet.io/memory=128Mi",
                    &s.image,
                    &id,
                    "sleep",
                    "1000",
                ])
                .unwrap()
            })
        })
        .collect();
    for (id, handle) in ids.iter().zip(started) {
        let out = handle.join().unwrap();
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for id in &ids {
        s.wait_status(id, "RUNNING", Duration::from_secs(120))
            .unwrap();
    }
    let running = figures(&s, &net);
    println!(
        "8 pods running: {} QEMUs, {} shims",
        running["qemu"], running["shims"]
    );
    assert_eq!(running["qemu"], before["qemu"] + 8);
    let removed: Vec<_> = ids
        .iter()
        .map(|id| {
            let s = s.clone();
            let id = id.clone();
            std::thread::spawn(move || s.kill_and_remove(&id))
        })
        .collect();
    for (id, handle) in ids.iter().zip(removed) {
        handle
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let after = settle(&s, &net, &before);
    assert_eq!(before, after, "counts after the 8 pods went");
}
