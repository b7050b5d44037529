//! End to end: VM mode (`vmlet.io/image-type: vm`, docs/vm-mode.md) boots the test image
//! (`scripts/build-vm-test-image`, imported by `scripts/stack` as `$VMLET_VM_IMAGE`) with
//! `ctr run`: cloud-init takes the seed, the serial console is the container's stdout, the
//! guest's power-off is the task's exit, and the image's disk is left as it was. Run by
//! `make test`.

use crate::support::{stack, text};
use vmlet_integration::{bounded, unique_id, Stack};

/// How long a VM image may take from `ctr run` to its power-off.
const BOOT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

fn vm_image() -> String {
    std::env::var("VMLET_VM_IMAGE").expect("VMLET_VM_IMAGE (scripts/stack env)")
}

/// The SHA-256 of every copy of the test image's disk in containerd's snapshots.
fn disk_hashes(s: &Stack) -> Vec<String> {
    let out = bounded::output(std::process::Command::new("sh").args([
        "-c",
        &format!(
            "find {}/containerd -path '*/fs/disk/*.qcow2' -type f -exec sha256sum {{}} + | cut -d' ' -f1 | sort",
            s.dir
        ),
    ]))
    .unwrap();
    text(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_vm_image_runs_its_user_data_shows_its_console_and_powers_off() {
    let s = stack();
    let id = unique_id("vmimg");
    let before = disk_hashes(&s);
    assert!(
        !before.is_empty(),
        "the test image's disk is not in containerd's snapshots"
    );
    let user_data = "runcmd:\n  - echo \"vmlet-marker $(hostname) $(grep GREETING /etc/cloud/environment)\"\npower_state:\n  mode: poweroff\n  condition: true\n";
    let annotations = [
        "--annotation".to_string(),
        "vmlet.io/image-type=vm".to_string(),
        "--annotation".to_string(),
        format!("vmlet.io/cloud-init-user-data={user_data}"),
        "--annotation".to_string(),
        "vmlet.io/memory=256Mi".to_string(),
        "--env".to_string(),
        "GREETING=hello-from-the-spec".to_string(),
    ];
    let mut args: Vec<&str> = vec!["run", "--rm", "--runtime", vmlet_integration::RUNTIME];
    args.extend(annotations.iter().map(String::as_str));
    let image = vm_image();
    args.push(&image);
    args.push(&id);
    // A Debian boot under TCG with cloud-init's four stages takes about a minute alone.
    let child = s
        .ctr()
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = bounded::output_within(child, BOOT_DEADLINE, "ctr run (a VM image)").unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}: {}\n{stdout}",
        out.status,
        text(&out.stderr)
    );
    let expected = format!("vmlet-marker {id} GREETING=hello-from-the-spec");
    assert!(
        stdout.contains(&expected),
        "no {expected:?} on the console:\n{stdout}"
    );
    assert!(
        stdout.contains("Linux version"),
        "the boot is not on the console:\n{stdout}"
    );
    assert!(
        !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
        "the pod's state (overlay, seed) is left"
    );
    assert!(!s.has_pod_domain(&id), "domain left");
    assert_eq!(disk_hashes(&s), before, "the image's disk changed");
}

/// A VM-mode `ctr run` of `image` fails with `expected` in its error and leaves nothing.
fn assert_refused(s: &Stack, image: &str, expected: &str) {
    let id = unique_id("vmimg");
    let out = s
        .ctr_output(&[
            "run",
            "--rm",
            "--runtime",
            vmlet_integration::RUNTIME,
            "--annotation",
            "vmlet.io/image-type=vm",
            image,
            &id,
            "true",
        ])
        .unwrap();
    assert!(
        !out.status.success(),
        "a VM-mode run of {image} was accepted"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains(expected), "{stderr}");
    assert!(!std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists());
    assert!(!s.has_pod_domain(&id), "domain left");
    assert_eq!(s.pod_processes(&id), vec![], "processes left");
    let _ = s.ctr_output(&["container", "rm", &id]);
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn an_image_without_one_disk_is_refused_by_name_and_leaves_nothing() {
    let s = stack();
    // The busybox test image has no /disk/; the two-disks image has two.
    assert_refused(
        &s,
        &s.image,
        "vmlet.io/image-type: vm: the image has no /disk/ directory",
    );
    let two =
        std::env::var("VMLET_TWO_DISKS_IMAGE").expect("VMLET_TWO_DISKS_IMAGE (scripts/stack env)");
    assert_refused(
        &s,
        &two,
        "/disk/ in the image holds 2 files (a.qcow2, b.img)",
    );
}
