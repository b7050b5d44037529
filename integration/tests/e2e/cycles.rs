//! End to end: many create/start/delete cycles of a pod leak nothing. Each pod has a network
//! (a namespace of the test's, wired to a tap every time). After one warm-up cycle per lane
//! (libvirt and containerd open some things once), the counts of shims, QEMUs and other
//! helpers, the open fds of the long-lived daemons, the mounts, the links (of the host, the
//! node and the pod namespaces), the pod namespaces' qdiscs and the libvirt domains are
//! taken, `VMLET_CYCLES` (default 100) cycles run in `VMLET_CYCLE_LANES` (default 2) lanes
//! side by side, as a node starts and removes pods, each lane with its own pod namespace,
//! and the counts must be the same again. The figures are printed. Run by `make test`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vmlet_integration::testnet::{tc, TestNet};
use vmlet_integration::{bounded, unique_id, Stack, RUNTIME};

use crate::support::stack;

/// A count from the environment, or `default`; a value that is not a count fails the test.
fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a count: {e}")),
        Err(_) => default,
    }
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

/// What must not grow, by name (`nets`: the pods' network namespaces).
fn figures(s: &Stack, nets: &[TestNet]) -> BTreeMap<&'static str, usize> {
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
        (
            "pod netns links",
            nets.iter().map(|n| count_links(Some(&n.pod))).sum(),
        ),
        (
            "pod netns qdiscs",
            nets.iter()
                .map(|n| tc(&n.pod, &["qdisc", "show"]).lines().count())
                .sum(),
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
    nets: &[TestNet],
    want: &BTreeMap<&'static str, usize>,
) -> BTreeMap<&'static str, usize> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = figures(s, nets);
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
    let cycles = env_count("VMLET_CYCLES", 100);
    let lanes = env_count("VMLET_CYCLE_LANES", 2).max(1);
    let nets: Vec<TestNet> = (0..lanes)
        .map(|lane| TestNet::new(&format!("cycles{lane}"), 1500))
        .collect();
    for (lane, net) in nets.iter().enumerate() {
        cycle(&s, net, &unique_id(&format!("warmup{lane}")));
    }
    let before = settle(&s, &nets, &figures(&s, &nets));
    let started = Instant::now();
    // A panic in a lane fails the test when the scope ends.
    std::thread::scope(|scope| {
        for (lane, net) in nets.iter().enumerate() {
            let s = &s;
            scope.spawn(move || {
                for i in (lane..cycles).step_by(lanes) {
                    cycle(s, net, &unique_id(&format!("cycle{i}")));
                }
            });
        }
    });
    let took = started.elapsed();
    let after = settle(&s, &nets, &before);
    println!(
        "{cycles} create/start/delete cycles in {lanes} lanes in {:.1} s ({:.2} s each)",
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
    let nets = [TestNet::new("concurrent", 1500)];
    let before = settle(&s, &nets, &figures(&s, &nets));
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
    let running = figures(&s, &nets);
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
    let after = settle(&s, &nets, &before);
    assert_eq!(before, after, "counts after the 8 pods went");
}
