//! The guest filling what it can make the host write: a root container floods the serial
//! console (what QEMU writes into the pod's state). The pod's `log/` tmpfs takes the node's
//! `pod_log_mib` and no more; the state directory's file system does not grow; the pod runs
//! on and is removed without a trace. Run by `make test`.

use crate::support::text;
use std::path::Path;
use std::time::{Duration, Instant};

use vmlet_integration::{unique_id, ConfigSwap, Stack};

/// The bound the test sets (MiB): small, so that the flood reaches it in seconds.
const BOUND_MIB: u64 = 1;
/// How long the flood may take to fill it.
const FILL_DEADLINE: Duration = Duration::from_secs(120);
/// What the state directory's file system may lose meanwhile to writers other than the
/// guest (containerd's and libvirt's own files).
const SLACK_BYTES: u64 = 2 << 20;

/// (total bytes, free bytes) of the file system holding `path`.
fn space(path: &Path) -> (u64, u64) {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    let block = st.fragment_size() as u64;
    (
        st.blocks() as u64 * block,
        st.blocks_available() as u64 * block,
    )
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_guest_flooding_its_console_fills_only_the_pods_log_tmpfs() {
    let s = Stack::from_env().expect("the vmlet stack");
    let _bounded = ConfigSwap::edited(|original| format!("pod_log_mib = {BOUND_MIB}\n{original}"));

    let state = Path::new(&s.dir).join("state");
    let (_, free_before) = space(&state);
    let pod = unique_id("flood");
    // Guest root writes to the serial port (ttyS0, 4:64) as fast as it can.
    s.run_detached_with(
        &pod,
        &["--privileged"],
        &[
            "sh",
            "-c",
            "mknod /dev/flood c 4 64 && while :; do yes vmlet-flooding-the-console >/dev/flood; done",
        ],
    )
    .unwrap();
    let log = state.join(&pod).join("log");
    let started = Instant::now();
    let (total, _) = space(&log);
    assert_eq!(
        total,
        BOUND_MIB << 20,
        "{} is a tmpfs of the bound",
        log.display()
    );
    loop {
        let (_, free) = space(&log);
        if free < 64 << 10 {
            break;
        }
        assert!(
            started.elapsed() < FILL_DEADLINE,
            "the flood did not fill {} within {FILL_DEADLINE:?} ({free} bytes free)",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = started.elapsed();
    println!(
        "console flood filled the {BOUND_MIB} MiB log tmpfs in {} ms ({:.0} KiB/s)",
        took.as_millis(),
        (BOUND_MIB << 10) as f64 / took.as_secs_f64()
    );
    // Flooding on against a full log (unbounded, the flood would write about twice the
    // slack meanwhile): nothing else grows.
    std::thread::sleep(Duration::from_secs(15));
    let (_, free_after) = space(&state);
    let lost = free_before.saturating_sub(free_after);
    println!("state file system lost {lost} bytes during the flood");
    assert!(
        lost <= SLACK_BYTES,
        "the state directory's file system lost {lost} bytes during the flood"
    );

    // The pod runs on: the agent answers and output still comes through.
    let out = s
        .ctr_output(&["task", "exec", "--exec-id", "alive", &pod, "echo", "alive"])
        .unwrap();
    assert!(out.status.success(), "exec: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "alive");

    s.kill_and_remove(&pod).unwrap();
    assert!(!state.join(&pod).exists(), "the pod's state is left");
    let mounts: Vec<String> = s
        .state_mounts()
        .into_iter()
        .filter(|m| m.contains(&pod))
        .collect();
    assert_eq!(mounts, Vec::<String>::new(), "mounts left");
    assert_eq!(s.pod_processes(&pod), Vec::new(), "processes left");
}
