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

pub(crate) fn vm_image() -> String {
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
fn a_vm_image_runs_its_user_data_shows_its_console_takes_stdin_and_the_operator_and_powers_off() {
    let s = stack();
    let id = unique_id("vmimg");
    let before = disk_hashes(&s);
    assert!(
        !before.is_empty(),
        "the test image's disk is not in containerd's snapshots"
    );
    // The guest reads a line from its console (nothing else does: its getty is stopped),
    // then the operator's line (`vmletctl console -i`), then powers off, 10 s later (the
    // operator leaves the console before it closes).
    let user_data = "runcmd:\n  - systemctl mask --now serial-getty@ttyS0.service\n  - echo \"vmlet-marker $(hostname) $(grep GREETING /etc/cloud/environment)\"\n  - read line < /dev/ttyS0; echo \"vmlet-got $line\"\n  - while read op < /dev/ttyS0; do [ \"$op\" = vmlet-operator ] && break; done; echo \"vmlet-operator-got $op\"\n  - sleep 10\npower_state:\n  mode: poweroff\n  condition: true\n";
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
    let started = std::time::Instant::now();
    let mut child = s
        .ctr()
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (console, reader) = read_console(child.stdout.take().unwrap());
    // Typed at the console until the guest's reader took a line (before it reads, a line
    // may be lost).
    let got = "vmlet-got vmlet-input";
    let mut stdin = child.stdin.take().unwrap();
    type_until_shown(&mut stdin, b"vmlet-input\n", &console, got, started);
    nobody_reads_the_pods_files(&s, &id);
    let operator_got = "vmlet-operator-got vmlet-operator";
    the_operator_types_at_the_console(&s, &id, &console, operator_got, started);
    // ctr's stdin ends here: the console goes on (its output, the power-off).
    drop(stdin);
    let left = BOOT_DEADLINE.saturating_sub(started.elapsed());
    let out = bounded::output_within(child, left, "ctr run (a VM image)").unwrap();
    reader.join().unwrap();
    let stdout = text(&console.lock().unwrap());
    assert!(
        out.status.success(),
        "exit {:?}: {}\n{stdout}",
        out.status,
        text(&out.stderr)
    );
    let expected = format!("vmlet-marker {id} GREETING=hello-from-the-spec");
    for (shown, what) in [
        (expected.as_str(), "the user-data's marker"),
        (got, "stdin"),
        (operator_got, "the operator's keys"),
        ("Linux version", "the boot"),
        ("reboot: Power down", "the console's end (the power-off)"),
    ] {
        assert!(
            stdout.contains(shown),
            "{what} ({shown:?}) not on the console:\n{stdout}"
        );
    }
    assert!(
        !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
        "the pod's state (overlay, seed) is left"
    );
    assert!(!s.has_pod_domain(&id), "domain left");
    assert_eq!(disk_hashes(&s), before, "the image's disk changed");
}

/// A local user who is not root reads none of a running VM image's files: its seed (the
/// pod's environment and keys), the seed's volume, its root disk's overlay, its console's
/// log and its state; the seed's directory is root's alone, each file root's or the QEMU
/// user's with mode 0600.
fn nobody_reads_the_pods_files(s: &Stack, id: &str) {
    use std::os::unix::fs::MetadataExt;
    let config = std::env::var("VMLET_CONFIG").expect("VMLET_CONFIG: the stack's config");
    let config = vmlet_config::NodeConfig::load_from(std::path::Path::new(&config)).unwrap();
    let dir = std::path::PathBuf::from(format!("{}/state/{id}", s.dir));
    let seed = dir.join("seed");
    assert_eq!(std::fs::metadata(&seed).unwrap().mode() & 0o777, 0o700);
    let files = [
        seed.join("user-data"),
        dir.join("seed.iso"),
        config.vm_images.disk_dir.join(id).join("root.qcow2"),
        dir.join("log/console.log"),
        dir.join("state.json"),
    ];
    for path in &files {
        let mode = std::fs::metadata(path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "head",
                "-c1",
            ])
            .arg(path)
            .output()
            .expect("setpriv (util-linux)");
        assert!(!out.status.success(), "nobody read {}", path.display());
    }
}

/// What the console `stdout` has shown so far, gathered by the thread returned.
type Console = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

fn read_console(
    mut stdout: impl std::io::Read + Send + 'static,
) -> (Console, std::thread::JoinHandle<()>) {
    let console = Console::default();
    let reader = {
        let console = console.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                console.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    (console, reader)
}

/// Writes `line` to `keys` every 2 s until `console` shows `shown` (or the boot's deadline
/// from `started` passes, or `keys` closes).
fn type_until_shown(
    keys: &mut impl std::io::Write,
    line: &[u8],
    console: &Console,
    shown: &str,
    started: std::time::Instant,
) {
    while !text(&console.lock().unwrap()).contains(shown) && started.elapsed() < BOOT_DEADLINE {
        if keys.write_all(line).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

/// The node's operator types into the same console (`vmletctl console -i`) until the guest
/// took the line (`console` shows `operator_got`), then leaves with Ctrl-]; the session
/// ends well and showed the guest's answer.
fn the_operator_types_at_the_console(
    s: &Stack,
    id: &str,
    console: &Console,
    operator_got: &str,
    started: std::time::Instant,
) {
    use std::io::Write;
    let mut operator = std::process::Command::new(format!("{}/bin/vmletctl", s.dir))
        .args(["console", "--interactive", id])
        .env("VMLET_CONFIG", format!("{}/config.toml", s.dir))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut keys = operator.stdin.take().unwrap();
    type_until_shown(
        &mut keys,
        b"vmlet-operator\n",
        console,
        operator_got,
        started,
    );
    keys.write_all(&[vmletctl::operator_console::ESCAPE])
        .unwrap();
    let session = bounded::output_within(
        operator,
        std::time::Duration::from_secs(30),
        "vmletctl console -i",
    )
    .unwrap();
    let shown = text(&session.stdout);
    assert!(
        session.status.success(),
        "vmletctl console -i: {:?} {}\n{shown}",
        session.status,
        text(&session.stderr)
    );
    assert!(
        shown.contains(operator_got),
        "the operator's session does not show the guest's answer:\n{shown}"
    );
}

/// A VM-mode `ctr run` of `image` fails with `expected` in its error and leaves nothing.
fn assert_refused(s: &Stack, image: &str, expected: &str) {
    assert_refused_with(s, image, &[], expected)
}

/// [`assert_refused`] with `extra` options of `ctr run`.
fn assert_refused_with(s: &Stack, image: &str, extra: &[&str], expected: &str) {
    let id = unique_id("vmimg");
    let mut args = vec![
        "run",
        "--rm",
        "--runtime",
        vmlet_integration::RUNTIME,
        "--annotation",
        "vmlet.io/image-type=vm",
    ];
    args.extend_from_slice(extra);
    args.extend([image, &id, "true"]);
    let out = s.ctr_output(&args).unwrap();
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

/// A pod's volume bound at `/etc/resolv.conf` (where the CRI plugin binds the pod's DNS,
/// which vmlet reads as root into the seed) that is a FIFO or a device node is refused by
/// name at once: never opened (a FIFO's reader would wait for ever; a device such as the
/// watchdog acts when opened), and nothing is left.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_fifo_or_a_device_at_resolv_conf_is_refused_by_name_without_blocking() {
    let s = stack();
    let dir = std::path::PathBuf::from(&s.dir).join(unique_id("resolv"));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    // A character device as the watchdog is one, but one that does nothing when opened.
    let device = dir.join("device");
    nix::sys::stat::mknod(
        &device,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    for (source, named) in [(&fifo, "is a FIFO"), (&device, "is a device node")] {
        let mount = format!(
            "type=bind,src={},dst=/etc/resolv.conf,options=rbind:ro",
            source.display()
        );
        let started = std::time::Instant::now();
        assert_refused_with(&s, &vm_image(), &["--mount", &mount], named);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "refused only after {:?}",
            started.elapsed()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A VM-mode CRI pod's user-data: it serves its host name over HTTP on port 8080 and
/// prints a marker with its host name, eth0's address and how it got it (a DHCP lease, or
/// the static address of the seed's network-config).
const SERVING_USER_DATA: &str = r#"runcmd:
  - mkdir -p /srv/www
  - hostname > /srv/www/name
  - systemd-run --unit vmlet-www python3 -m http.server 8080 --directory /srv/www
  - echo "vmlet-marker $(hostname) $(ip -4 -o addr show eth0 | awk '{print $4}') $(test -s /var/lib/dhcp/dhclient.eth0.leases && echo by-dhcp || echo by-seed) $(findmnt -no SOURCE /)"
"#;

/// How long a VM-mode pod may take from its container's start to the marker.
const MARKER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// How a VM-mode CRI pod of the test boots.
#[derive(Debug, Clone, Copy)]
struct Boot {
    /// Its `vmlet.io/cloud-init-network-config`.
    network_config: &'static str,
    /// The UEFI test image with `vmlet.io/firmware: uefi`; else the BIOS image.
    uefi: bool,
    /// Its `vmlet.io/disk-driver`, the root disk's bus.
    disk_driver: &'static str,
}

/// One VM-mode CRI pod booted as `boot` says, from its start to its removal: the marker in
/// the CRI log, the host name served on the pod IP, nothing left. Returns the marker line
/// and the console.
async fn serve_from_a_cri_vm_pod(s: &Stack, boot: Boot) -> (String, String) {
    let network_config = boot.network_config;
    let node = std::env::var("VMLET_NODE_NETNS").expect("VMLET_NODE_NETNS (the stack's)");
    let image = if boot.uefi {
        std::env::var("VMLET_VM_UEFI_IMAGE").expect("VMLET_VM_UEFI_IMAGE (scripts/stack env)")
    } else {
        vm_image()
    };
    let mut p = start_vm_pod(s, boot).await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let namespace = p.config.metadata.as_ref().unwrap().namespace.clone();
    let ip = p.cri.pod_ip(&p.pod).await.unwrap();
    // The command is the image's (`sh`), which a VM image does not run.
    let c = p.container("vm", &image, &[], 0).await;
    let log = p.logs.join("vm.log");
    let marker = marker_in(&log, &name, network_config).await;
    // The container's VM is served by the pod's shim: vmlet sees both alive.
    let gc = vmletctl(s, &["gc", "--dry-run"]);
    let ps = vmletctl(s, &["ps"]);
    // The operator knows the pod by its Kubernetes names: its VM's row, and its console.
    let by_name = vmletctl(s, &["console", &format!("{namespace}/{name}")]);
    let page = {
        let (node, ip) = (node.clone(), ip.clone());
        tokio::task::spawn_blocking(move || page_on(&node, &ip))
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
    let vm_row = ps.lines().find(|l| l.ends_with(c.as_str())).unwrap_or("");
    assert!(
        vm_row.starts_with(&format!("{namespace}/{name} ")) && vm_row.contains(" vm-image "),
        "the VM's row in ps names the pod and its kind:\n{ps}"
    );
    assert!(
        by_name.contains(&format!("vmlet-marker {name} ")),
        "vmletctl console {namespace}/{name} printed {by_name:?}"
    );
    // The pod's sandbox and its container's VM each had a state directory.
    for id in [&pod_id, &c] {
        assert!(
            !gc.contains(id.as_str()),
            "gc would remove {id}, which lives:\n{gc}"
        );
        let line = ps.lines().find(|l| l.ends_with(id.as_str()));
        assert!(
            line.is_some_and(|l| !l.contains("orphaned")),
            "{id} is not a live pod in ps:\n{ps}"
        );
        assert!(
            !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
            "state of {id} is left"
        );
        assert!(!s.has_pod_domain(id), "domain of {id} left");
    }
    (marker, console)
}

/// A VM-mode CRI pod with `boot`'s firmware, disk driver and network-config, and the
/// serving user-data.
async fn start_vm_pod(s: &Stack, boot: Boot) -> PodUnderTest {
    PodUnderTest::start_with(s, |c| {
        if boot.uefi {
            c.annotations
                .insert("vmlet.io/firmware".into(), "uefi".into());
        }
        c.annotations
            .insert("vmlet.io/disk-driver".into(), boot.disk_driver.into());
        c.annotations
            .insert("vmlet.io/image-type".into(), "vm".into());
        c.annotations.insert(
            "vmlet.io/cloud-init-user-data".into(),
            SERVING_USER_DATA.into(),
        );
        c.annotations.insert(
            "vmlet.io/cloud-init-network-config".into(),
            boot.network_config.into(),
        );
        c.annotations
            .insert("vmlet.io/memory".into(), "256Mi".into());
    })
    .await
}

/// A VM-mode CRI pod of 256 MiB whose cloud-init runs `user_data`; `more` annotations
/// besides.
pub(crate) async fn vm_pod(s: &Stack, user_data: &str, more: &[(&str, &str)]) -> PodUnderTest {
    PodUnderTest::start_with(s, |c| {
        for (key, value) in [
            ("vmlet.io/image-type", "vm"),
            ("vmlet.io/memory", "256Mi"),
            ("vmlet.io/cloud-init-user-data", user_data),
        ]
        .iter()
        .chain(more)
        {
            c.annotations.insert((*key).into(), (*value).into());
        }
    })
    .await
}

/// The marker line in the CRI log at `log` of pod `name`, within [`MARKER_DEADLINE`].
pub(crate) async fn marker_in(log: &std::path::Path, name: &str, network_config: &str) -> String {
    let deadline = std::time::Instant::now() + MARKER_DEADLINE;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // The echo's own line on the console is the command, quoted; the marker follows
        // a space.
        if let Some(line) = text
            .lines()
            .find(|l| l.contains(" vmlet-marker ") && !l.contains("$(hostname)"))
        {
            return line.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no marker in the CRI log of pod {name} ({network_config}) within {MARKER_DEADLINE:?}:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The answer to `GET /name` on `ip`:8080 from the node's namespace `node`, tried for 60 s.
fn page_on(node: &str, ip: &str) -> Option<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let page =
            vmlet_integration::testnet::tcp_exchange(node, ip, 8080, "GET /name HTTP/1.0\r\n\r\n");
        if page.is_some() || std::time::Instant::now() > deadline {
            return page;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_vm_pods_boot_with_their_names_and_serve_on_their_ips_by_seed_uefi_scsi_or_dhcp_bios_nvme(
) {
    let s = stack();
    let before = disk_hashes(&s);
    // Two pods at once: the seed's network-config, booted by OVMF from a SCSI disk; and no
    // network-config (the image asks DHCP, which vmlet's responder answers with the CNI
    // address), booted by SeaBIOS from NVMe.
    let ((by_seed, uefi_console), (by_dhcp, _)) = tokio::join!(
        serve_from_a_cri_vm_pod(
            &s,
            Boot {
                network_config: "v2",
                uefi: true,
                disk_driver: "scsi",
            }
        ),
        serve_from_a_cri_vm_pod(
            &s,
            Boot {
                network_config: "none",
                uefi: false,
                disk_driver: "nvme",
            }
        )
    );
    assert!(
        by_seed.trim_end().ends_with("by-seed /dev/sda2"),
        "{by_seed}"
    );
    assert!(
        uefi_console.contains("BdsDxe: starting"),
        "OVMF did not boot it:\n{uefi_console}"
    );
    assert!(
        by_dhcp.trim_end().ends_with("by-dhcp /dev/nvme0n1"),
        "{by_dhcp}"
    );
    assert_eq!(disk_hashes(&s), before, "the image's disk changed");
}

/// The state directories whose VM the shim of pod `pod` serves (a VM-mode pod's
/// containers': their `state.json` names the pod's shim).
fn vms_served_by(s: &Stack, pod: &str) -> Vec<String> {
    let Ok(dirs) = std::fs::read_dir(format!("{}/state", s.dir)) else {
        return Vec::new();
    };
    dirs.flatten()
        .filter(|d| {
            std::fs::read_to_string(d.path().join("state.json"))
                .is_ok_and(|state| state.contains(&format!("\"shim_id\": \"{pod}\"")))
        })
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_cri_vm_pod_refuses_an_image_without_one_disk_by_name_and_leaves_nothing() {
    use vmlet_integration::cri::Cri;
    let s = stack();
    let two =
        std::env::var("VMLET_TWO_DISKS_IMAGE").expect("VMLET_TWO_DISKS_IMAGE (scripts/stack env)");
    let mut p = PodUnderTest::start_with(&s, |c| {
        c.annotations
            .insert("vmlet.io/image-type".into(), "vm".into());
    })
    .await;
    // The busybox test image has no /disk/; the two-disks image has two. The CRI plugin
    // makes the task (the VM) at the container's start.
    let mut refused = Vec::new();
    for (name, image, expected) in [
        (
            "no-disk",
            &s.image,
            "vmlet.io/image-type: vm: the image has no /disk/ directory",
        ),
        (
            "two-disks",
            &two,
            "/disk/ in the image holds 2 files (a.qcow2, b.img)",
        ),
    ] {
        let config = Cri::container_config(&p.config, name, image, &[], 0);
        let (pod, pod_config) = (p.pod.clone(), p.config.clone());
        let id = p
            .cri
            .create_container(&pod, &pod_config, config)
            .await
            .unwrap();
        let err = p
            .cri
            .start_container(&id)
            .await
            .expect_err("a VM-mode container without one disk was started");
        assert!(format!("{err:#}").contains(expected), "{err:#}");
        assert_eq!(vms_served_by(&s, &pod), Vec::<String>::new(), "left");
        assert!(!s.has_pod_domain(&id), "domain of {id} left");
        refused.push(id);
    }
    let pod = p.pod.clone();
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    p.finish(&refused).await;
    assert!(!std::path::Path::new(&format!("{}/state/{pod}", s.dir)).exists());
    assert_eq!(s.pod_processes(&pod), vec![], "processes left");
}
