//! End to end: VM mode (`vmlet.io/image-type: vm`, docs/vm-mode.md) boots the test image
//! (`scripts/build-vm-test-image`, imported by `scripts/stack` as `$VMLET_VM_IMAGE`) with
//! `ctr run` and as a CRI pod: cloud-init takes the seed, the serial console is the
//! container's stdout (and CRI log), the guest's power-off is the task's exit, the guest has
//! the pod's address (by the seed's network-config or by vmlet's DHCP responder) and serves
//! on it, and the image's disk is left as it was. Run by `make test`.

use crate::support::{stack, text, vmletctl, PodUnderTest};
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

/// A VM-mode CRI pod's user-data: it serves its host name over HTTP on port 8080 and
/// prints a marker with its host name, eth0's address and how it got it (a DHCP lease, or
/// the static address of the seed's network-config).
const SERVING_USER_DATA: &str = r#"runcmd:
  - mkdir -p /srv/www
  - hostname > /srv/www/name
  - systemd-run --unit vmlet-www python3 -m http.server 8080 --directory /srv/www
  - echo "vmlet-marker $(hostname) $(ip -4 -o addr show eth0 | awk '{print $4}') $(test -s /var/lib/dhcp/dhclient.eth0.leases && echo by-dhcp || echo by-seed)"
"#;

/// How long a VM-mode pod may take from its container's start to the marker.
const MARKER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// One VM-mode CRI pod (`network_config`: its `vmlet.io/cloud-init-network-config`) from
/// its start to its removal: the marker in the CRI log, the host name served on the pod
/// IP, nothing left. Returns the marker line.
async fn serve_from_a_cri_vm_pod(s: &Stack, network_config: &str) -> String {
    use std::time::Instant;
    let node = std::env::var("VMLET_NODE_NETNS").expect("VMLET_NODE_NETNS (the stack's)");
    let mut p = PodUnderTest::start_with(s, |c| {
        c.annotations
            .insert("vmlet.io/image-type".into(), "vm".into());
        c.annotations.insert(
            "vmlet.io/cloud-init-user-data".into(),
            SERVING_USER_DATA.into(),
        );
        c.annotations.insert(
            "vmlet.io/cloud-init-network-config".into(),
            network_config.into(),
        );
        c.annotations
            .insert("vmlet.io/memory".into(), "256Mi".into());
    })
    .await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let ip = p.cri.pod_ip(&p.pod).await.unwrap();
    // The command is the image's (`sh`), which a VM image does not run.
    let c = p.container("vm", &vm_image(), &[], 0).await;
    let log = p.logs.join("vm.log");
    let deadline = Instant::now() + MARKER_DEADLINE;
    let marker = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // The echo's own line on the console is the command, quoted; the marker follows
        // a space.
        if let Some(line) = text
            .lines()
            .find(|l| l.contains(" vmlet-marker ") && !l.contains("$(hostname)"))
        {
            break line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no marker in the CRI log of pod {name} ({network_config}) within {MARKER_DEADLINE:?}:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    // The container's VM is served by the pod's shim: vmlet sees both alive.
    let gc = vmletctl(s, &["gc", "--dry-run"]);
    let ps = vmletctl(s, &["ps"]);
    let page = {
        let (node, ip) = (node.clone(), ip.clone());
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            loop {
                let page = vmlet_integration::testnet::tcp_exchange(
                    &node,
                    &ip,
                    8080,
                    "GET /name HTTP/1.0\r\n\r\n",
                );
                if page.is_some() || Instant::now() > deadline {
                    return page;
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        })
        .await
        .unwrap()
    };
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let pod_id = p.pod.clone();
    p.finish(&[&c]).await;
    assert!(
        marker.contains(&format!("vmlet-marker {name} {ip}/")),
        "the marker names the pod's host name and address {ip}: {marker}"
    );
    let page = page.unwrap_or_else(|| {
        panic!("nothing answered on {ip}:8080 ({network_config}); the console:\n{console}")
    });
    assert!(
        page.contains("200 OK") && page.trim_end().ends_with(&name),
        "the guest's server on {ip}:8080 answered {page:?}"
    );
    for id in [&pod_id, &c] {
        assert!(
            !gc.contains(id.as_str()),
            "gc would remove {id}, which lives:\n{gc}"
        );
        let line = ps.lines().find(|l| l.starts_with(id.as_str()));
        assert!(
            line.is_some_and(|l| !l.contains("gone")),
            "{id} is not a live pod in ps:\n{ps}"
        );
    }
    // The pod's sandbox and its container's VM each had a state directory.
    for id in [&pod_id, &c] {
        assert!(
            !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
            "state of {id} is left"
        );
        assert!(!s.has_pod_domain(id), "domain of {id} left");
    }
    marker
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_cri_vm_pod_boots_with_its_name_and_serves_on_its_ip_by_seed_or_by_dhcp() {
    let s = stack();
    let before = disk_hashes(&s);
    // Two pods at once: the seed's network-config, and none (the image asks DHCP, which
    // vmlet's responder answers with the CNI address).
    let (by_seed, by_dhcp) = tokio::join!(
        serve_from_a_cri_vm_pod(&s, "v2"),
        serve_from_a_cri_vm_pod(&s, "none")
    );
    assert!(by_seed.trim_end().ends_with("by-seed"), "{by_seed}");
    assert!(by_dhcp.trim_end().ends_with("by-dhcp"), "{by_dhcp}");
    assert_eq!(disk_hashes(&s), before, "the image's disk changed");
}
