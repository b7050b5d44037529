//! The guest filling what it can make the host write: a root container floods the serial
//! console (what QEMU writes into the pod's state). The pod's `log/` tmpfs takes the node's
//! `pod_log_mib` and no more; the state directory's file system does not grow; the pod runs
//! on and is removed without a trace. And a VM image's guest that writes its whole root
//! disk: the disk is capped by the node, lives on the node's disk directory (never the
//! state directory), and the guest's own file system is what fills. Run by `make test`.

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

/// How long a VM image's boot, its fill of the disk and its power-off may take under TCG.
const VM_FILL_DEADLINE: Duration = Duration::from_secs(420);

/// The test image's disk size (MiB), from its copy in containerd's snapshots.
fn vm_image_disk_mib(s: &Stack) -> u64 {
    let find = format!(
        "find {}/containerd -path '*/fs/disk/*.qcow2' -type f | head -1",
        s.dir
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &find])
        .output()
        .unwrap();
    let disk = text(&out.stdout).trim().to_owned();
    assert!(
        !disk.is_empty(),
        "the test image's disk is not in containerd's snapshots"
    );
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", "-U", &disk])
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    info["virtual-size"].as_u64().unwrap().div_ceil(1 << 20)
}

/// `ctr run --rm` of VM image `image` as `id` with a root volume of `size_mib` and
/// `user_data`, to its end (at most [`VM_FILL_DEADLINE`]).
fn run_vm_image(
    s: &Stack,
    image: &str,
    id: &str,
    size_mib: u64,
    user_data: &str,
) -> std::process::Output {
    let size = format!("vmlet.io/root-volume-size={size_mib}Mi");
    let user_data = format!("vmlet.io/cloud-init-user-data={user_data}");
    let args = [
        "run",
        "--rm",
        "--runtime",
        vmlet_integration::RUNTIME,
        "--annotation",
        "vmlet.io/image-type=vm",
        "--annotation",
        &size,
        "--annotation",
        &user_data,
        "--annotation",
        "vmlet.io/memory=256Mi",
        image,
        id,
    ];
    vmlet_integration::bounded::output_within(
        s.ctr()
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        VM_FILL_DEADLINE,
        "ctr run of a VM image",
    )
    .unwrap()
}

/// Watches the overlay at `disk` on the node's disk while the guest writes, until it goes
/// with its pod (or grows past `cap_mib` and 16 MiB); the most blocks it held, in bytes.
fn watch_overlay(disk: std::path::PathBuf, cap_mib: u64) -> std::thread::JoinHandle<u64> {
    let cap_bytes = (cap_mib + 16) << 20;
    std::thread::spawn(move || {
        let mut largest = 0u64;
        let started = Instant::now();
        let mut seen = false;
        while started.elapsed() < VM_FILL_DEADLINE {
            match std::fs::metadata(&disk) {
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt;
                    largest = largest.max(m.blocks() * 512);
                    seen = true;
                }
                // Removed with the pod.
                Err(_) if seen => break,
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(500));
            if largest > cap_bytes {
                break;
            }
        }
        largest
    })
}

/// A VM image's root disk is capped by the node (`vm_images.max_root_disk_mib`): a larger
/// `vmlet.io/root-volume-size` is refused by name; a guest given the cap that writes until
/// its file system is full gets ENOSPC inside, its overlay stays within the cap on the
/// node's disk directory, the state directory's file system keeps its free space, and the
/// pod ends and goes leaving no directory behind.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_vm_images_guest_fills_its_own_disk_and_nothing_of_the_node() {
    let s = Stack::from_env().expect("the vmlet stack");
    let image = std::env::var("VMLET_VM_IMAGE").expect("VMLET_VM_IMAGE (scripts/stack env)");
    let disks = std::env::var("VMLET_DISK_DIR").expect("VMLET_DISK_DIR (scripts/stack env)");
    let cap = vm_image_disk_mib(&s) + 160;
    let _capped = ConfigSwap::edited(|original| {
        assert!(original.contains("[vm_images]\n"), "{original}");
        original.replacen(
            "[vm_images]\n",
            &format!("[vm_images]\nmax_root_disk_mib = {cap}\n"),
            1,
        )
    });
    let run = |id: &str, size_mib: u64, user_data: &str| {
        run_vm_image(&s, &image, id, size_mib, user_data)
    };

    let over = unique_id("vmcap");
    let out = run(&over, cap + 1, "{}");
    assert!(
        !out.status.success(),
        "a root volume above the cap was accepted"
    );
    let said = text(&out.stderr);
    assert!(
        said.contains(&format!(
            "vmlet.io/root-volume-size: {} MiB is more than this node allows a root disk (vm_images.max_root_disk_mib = {cap})",
            cap + 1
        )),
        "{said}"
    );
    let _ = s.ctr_output(&["container", "rm", &over]);

    let state = Path::new(&s.dir).join("state");
    let (_, free_before) = space(&state);
    let pod = unique_id("vmfill");
    // Writes until its root file system is full, says how that ended (dd's report goes to
    // /run: / is full), gives the space back (cloud-init itself needs some to power off)
    // and powers off.
    let fill = "runcmd:\n  - dd if=/dev/zero of=/fill bs=1M conv=fsync 2>/run/dd; echo \"vmlet-filled $(grep -m1 -o 'No space left on device' /run/dd)\"; rm -f /fill; sync\npower_state:\n  mode: poweroff\n  condition: true\n";
    let watcher = watch_overlay(Path::new(&disks).join(&pod).join("root.qcow2"), cap);
    let out = run(&pod, cap, fill);
    let (_, free_after) = space(&state);
    let console = text(&out.stdout);
    let kept = format!("{}/{pod}.console", s.dir);
    std::fs::write(&kept, &console).unwrap();
    println!("the guest's console: {kept}");
    let largest = watcher.join().unwrap();
    println!(
        "the overlay held at most {} MiB (cap {cap} MiB)",
        largest >> 20
    );
    assert!(
        console.contains("vmlet-filled No space left on device"),
        "the guest did not fill its own file system:\n{}\n{}",
        console
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n"),
        text(&out.stderr)
    );
    assert!(
        largest > 64 << 20,
        "the overlay never grew: {largest} bytes (not on the disk directory?)"
    );
    assert!(
        largest <= (cap + 16) << 20,
        "the overlay took {largest} bytes, past the cap"
    );
    let lost = free_before.saturating_sub(free_after);
    assert!(
        lost <= SLACK_BYTES,
        "the state directory's file system lost {lost} bytes"
    );
    assert!(!state.join(&pod).exists(), "the pod's state is left");
    assert!(
        !Path::new(&disks).join(&pod).exists(),
        "the pod's disk directory is left"
    );
    assert_eq!(s.pod_processes(&pod), Vec::new(), "processes left");
}
