//! End to end: `vmletctl ps` (and `-o json`), `console` (and `--follow`, which ends with
//! its pod) and `gc` against the stack. Orphans are made by
//! hand (a libvirt domain carrying vmlet's pod mark, a state directory whose shim is gone,
//! a tap carrying the mark of a pod that has neither, held open as QEMU would, a
//! `vhost-device-vsock` serving a pod whose `state.json` is lost) next to a
//! live pod with a network, two domains that are not vmlet's (one of them named like
//! vmlet's) and an unmarked `vmtap`: `gc --dry-run` removes nothing, `gc` removes exactly
//! the orphans. `vmletctl check` names what the node has, and fails without libvirt, or
//! where libvirt's state directory would keep the pods' own users out. Run
//! by `make test`.

use crate::support::{stack, text, vmletctl};
use std::process::Command;

use vmlet_integration::testnet::{ip, TestNet};
use vmlet_integration::{bounded, unique_id, Stack};

fn virsh(s: &Stack, args: &[&str]) -> std::process::Output {
    bounded::output(
        Command::new("virsh")
            .args(["-c", &s.libvirt_uri])
            .args(args),
    )
    .unwrap()
}

/// Defines (does not start) a small domain, with vmlet's pod mark when `pod` is given.
fn define_domain(s: &Stack, name: &str, pod: Option<&str>) {
    let metadata = pod.map_or(String::new(), |id| {
        format!(
            r#"<metadata><vmlet:pod xmlns:vmlet="https://vmlet.io/xmlns/domain/1" id="{id}"/></metadata>"#
        )
    });
    let xml = format!(
        r#"<domain type="qemu"><name>{name}</name>{metadata}<memory unit="MiB">64</memory><os><type arch="x86_64" machine="q35">hvm</type></os></domain>"#
    );
    let path = format!("{}/{name}.xml", s.dir);
    std::fs::write(&path, xml).unwrap();
    let out = virsh(s, &["define", &path]);
    assert!(out.status.success(), "virsh define: {}", text(&out.stderr));
    std::fs::remove_file(&path).unwrap();
}

fn all_domains(s: &Stack) -> String {
    text(&virsh(s, &["list", "--all", "--name"]).stdout)
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn gc_removes_orphans_only_and_ps_and_console_show_the_pods() {
    let s = stack();
    let live = unique_id("ctllive");
    let live_net = TestNet::new("ctllive", 1500);
    let with_ns = format!("network:{}", live_net.pod_path().display());
    s.run_detached_with(&live, &["--with-ns", &with_ns], &["sleep", "1000"])
        .unwrap();
    let mut o = Orphans::make(&s);
    ps_shows_the_pods(&s, &live, &o);

    let console = vmletctl(&s, &["console", &live]);
    assert!(console.contains("agent ready on vsock port"), "{console}");
    // By the names it is known by: containerd's namespace and the task's id.
    let by_name = vmletctl(&s, &["console", &format!("default/{live}")]);
    assert!(
        by_name.starts_with(&console[..console.len().min(200)]),
        "{by_name}"
    );
    let missing = crate::support::vmletctl_fails(&s, &["console", "default/no-such-pod"]);
    assert!(missing.contains("no pod default/no-such-pod"), "{missing}");
    // Following the console until the pod is gone.
    let (mut follower, followed) = follow_console(&s, &live);

    a_dry_run_removes_nothing(&s, &mut o);
    gc_removes_the_orphans_only(&s, &live, &live_net, &mut o);

    for d in [&o.foreign, &o.lookalike] {
        assert!(virsh(&s, &["undefine", d]).status.success());
    }
    assert!(
        follower.try_wait().unwrap().is_none(),
        "console --follow waits while the pod lives"
    );
    s.kill_and_remove(&live).unwrap();
    assert_eq!(live_net.vmlet_leftovers(), Vec::<String>::new());
    drop(o);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while follower.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = follower.kill();
            panic!("console --follow did not end with its pod");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let followed = followed.join().unwrap();
    assert!(followed.contains("agent ready on vsock port"), "{followed}");
}

/// What `vmletctl gc` is to remove, beside what it must leave.
struct Orphans {
    /// A marked domain without a shim.
    orphan_pod: String,
    /// A state dir whose shim is gone.
    gone: String,
    gone_dir: String,
    /// A tap whose pod left nothing else (its fd held here, as QEMU holds a live one's,
    /// and let go before its namespace goes), beside an unmarked tap named like vmlet's.
    _held: vmlet_netns::Wired,
    tap_net: TestNet,
    tap_pod: String,
    /// A vsock backend of a pod whose state file is lost: known by its socket's directory.
    helper_pod: String,
    helper_dir: String,
    helper: std::process::Child,
    /// Not vmlet's: no mark, whatever the name.
    foreign: String,
    lookalike: String,
}

impl Orphans {
    fn make(s: &Stack) -> Self {
        let orphan_pod = unique_id("ctlorphan");
        define_domain(s, &format!("vmlet-{orphan_pod}"), Some(&orphan_pod));
        let gone = unique_id("ctlgone");
        let gone_dir = format!("{}/state/{gone}", s.dir);
        std::fs::create_dir_all(&gone_dir).unwrap();
        let dead_pid = {
            let mut child = Command::new("true").spawn().unwrap();
            child.wait().unwrap();
            child.id()
        };
        std::fs::write(
            format!("{gone_dir}/state.json"),
            format!(r#"{{"dir": "{gone_dir}", "mounts": [], "shim_pid": {dead_pid}}}"#),
        )
        .unwrap();
        let tap_net = TestNet::new("ctltap", 1500);
        let tap_pod = unique_id("ctltap");
        let held = vmlet_netns::wire(&tap_net.pod_path(), &tap_pod).unwrap();
        ip(&["-n", &tap_net.pod, "tuntap", "add", "vmtap9", "mode", "tap"]);
        let helper_pod = unique_id("ctlhelper");
        let helper_dir = format!("{}/state/{helper_pod}", s.dir);
        std::fs::create_dir_all(&helper_dir).unwrap();
        let helper = Command::new("vhost-device-vsock")
            .arg("--vm")
            .arg(format!(
                "guest-cid=9,socket={helper_dir}/vhost-vsock.sock,uds-path={helper_dir}/vsock.sock"
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let foreign = unique_id("notvmlet");
        define_domain(s, &foreign, None);
        let lookalike = format!("vmlet-{}", unique_id("lookalike"));
        define_domain(s, &lookalike, None);
        Orphans {
            orphan_pod,
            gone,
            gone_dir,
            _held: held,
            tap_net,
            tap_pod,
            helper_pod,
            helper_dir,
            helper,
            foreign,
            lookalike,
        }
    }
}

/// `vmletctl ps` (as a table and as JSON) shows the live pod running with its names, kind,
/// shape and tap, the orphans orphaned, and nothing not vmlet's.
fn ps_shows_the_pods(s: &Stack, live: &str, o: &Orphans) {
    let ps = vmletctl(s, &["ps"]);
    let cells = |id: &str| -> Vec<String> {
        ps.lines()
            .find(|l| l.ends_with(id))
            .unwrap_or_else(|| panic!("{id} missing from ps:\n{ps}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let header: Vec<&str> = ps.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAMESPACE/NAME",
            "KIND",
            "VCPUS",
            "MEMORY",
            "ACCEL",
            "STATE",
            "AGE",
            "VM",
            "TAPS",
            "POD",
            "ID"
        ],
        "{ps}"
    );
    let live_row = cells(live);
    assert_eq!(live_row[0], format!("default/{live}"), "{ps}");
    assert_eq!(live_row[1..4], ["containers", "1", "256Mi"], "{ps}");
    assert!(["kvm", "tcg"].contains(&live_row[4].as_str()), "{ps}");
    assert_eq!(live_row[5], "running", "{ps}");
    assert!(
        live_row[6].ends_with('s') || live_row[6].ends_with('m'),
        "{ps}"
    );
    for orphan in [&o.orphan_pod, &o.gone, &o.tap_pod] {
        assert!(cells(orphan).contains(&"orphaned".to_owned()), "{ps}");
    }
    let taps_column = |id: &str| cells(id)[cells(id).len() - 2].clone();
    assert_eq!(taps_column(live), "1", "{ps}");
    assert_eq!(taps_column(&o.tap_pod), "1", "{ps}");
    assert!(
        !ps.contains(&o.foreign) && !ps.contains(&o.lookalike),
        "{ps}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&vmletctl(s, &["ps", "-o", "json"])).unwrap();
    let live_json = json
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == live)
        .unwrap_or_else(|| panic!("{live} missing from ps -o json: {json}"));
    assert_eq!(live_json["domain"], "running", "{live_json}");
    assert_eq!(live_json["state"], "running", "{live_json}");
    assert_eq!(live_json["namespace"], "default", "{live_json}");
    assert_eq!(live_json["name"], live, "{live_json}");
    assert_eq!(live_json["kind"], "containers", "{live_json}");
    assert_eq!(live_json["accel"], live_row_accel(&ps, live), "{live_json}");
    assert!(live_json["shim_pid"].as_u64().is_some(), "{live_json}");
    assert_eq!(
        live_json["taps"].as_array().unwrap().len(),
        1,
        "{live_json}"
    );
}

/// The ACCEL cell of `id`'s row in `ps`'s table.
fn live_row_accel(ps: &str, id: &str) -> String {
    let row = ps.lines().find(|l| l.ends_with(id)).unwrap();
    row.split_whitespace().nth(4).unwrap().to_owned()
}

/// `vmletctl console --follow` of `pod`, and what it prints until it ends (16 MiB at most).
fn follow_console(s: &Stack, pod: &str) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut follower = Command::new(format!("{}/bin/vmletctl", s.dir))
        .args(["console", "--follow", pod])
        .env("VMLET_CONFIG", format!("{}/config.toml", s.dir))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut followed = follower.stdout.take().unwrap();
    let followed = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut followed, 16 << 20),
            &mut bytes,
        )
        .unwrap();
        String::from_utf8_lossy(&bytes).into_owned()
    });
    (follower, followed)
}

/// `vmletctl gc --dry-run` names every orphan and removes or stops nothing.
fn a_dry_run_removes_nothing(s: &Stack, o: &mut Orphans) {
    let dry = vmletctl(s, &["gc", "--dry-run"]);
    assert!(
        dry.contains(&o.orphan_pod) && dry.contains(&o.gone),
        "{dry}"
    );
    assert!(
        dry.contains(&format!("pod {}: tap vmtap0", o.tap_pod)),
        "{dry}"
    );
    let helper_line = format!("pod {}: vhost-device-vsock {}", o.helper_pod, o.helper.id());
    assert!(dry.contains(&helper_line), "{dry}");
    assert!(
        all_domains(s).contains(&o.orphan_pod),
        "a dry run removes nothing"
    );
    assert!(std::path::Path::new(&o.gone_dir).exists());
    assert!(
        links(&o.tap_net).contains("vmtap0"),
        "a dry run removes nothing"
    );
    assert!(
        o.helper.try_wait().unwrap().is_none(),
        "a dry run stops nothing"
    );
}

/// `vmletctl gc` removes the orphans, and leaves the live pod (its domain, its tap, its
/// task) and what is not vmlet's.
fn gc_removes_the_orphans_only(s: &Stack, live: &str, live_net: &TestNet, o: &mut Orphans) {
    let live_domain = format!("vmlet-{live}");
    let had_domain = all_domains(s).contains(&live_domain);
    let removed = vmletctl(s, &["gc"]);
    assert!(!removed.contains(live), "{removed}");
    let domains = all_domains(s);
    assert!(!domains.contains(&o.orphan_pod), "{domains}");
    assert!(!std::path::Path::new(&o.gone_dir).exists());
    assert!(
        domains.contains(&o.foreign) && domains.contains(&o.lookalike),
        "{domains}"
    );
    // Its VM (a domain, or QEMU started without libvirt) runs on.
    assert!(!had_domain || domains.contains(&live_domain), "{domains}");
    assert!(
        s.pod_processes(live)
            .iter()
            .any(|(_, cmdline)| cmdline.contains("qemu-system")),
        "the live pod's QEMU is gone"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while o.helper.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the orphaned vhost-device-vsock still runs"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!std::path::Path::new(&o.helper_dir).exists());
    let orphan_links = links(&o.tap_net);
    assert!(!orphan_links.contains("vmtap0"), "{orphan_links}");
    assert!(orphan_links.contains("vmtap9"), "{orphan_links}");
    let live_tap = ip(&["-n", &live_net.pod, "-j", "link", "show", "vmtap0"]);
    assert!(
        live_tap.contains(&format!("vmlet:{live}:eth0")),
        "the live pod's tap is kept: {live_tap}"
    );
    assert_eq!(s.task_status(live).unwrap().as_deref(), Some("RUNNING"));
}

fn links(net: &TestNet) -> String {
    ip(&["-n", &net.pod, "-brief", "link", "show"])
}

/// `vmletctl check` against the stack, with its PATH as containerd has it.
fn check(s: &Stack, config: &str) -> std::process::Output {
    let path = format!(
        "{}/bin:{}",
        s.dir,
        std::env::var("PATH").unwrap_or_default()
    );
    bounded::output(
        Command::new(format!("{}/bin/vmletctl", s.dir))
            .args(["--config", config, "check", "--containerd-config"])
            .arg(format!("{}/containerd/config.toml", s.dir))
            .env("PATH", path),
    )
    .unwrap()
}

/// The line of `check`'s output about `subject`.
fn check_line<'a>(out: &'a str, subject: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(subject))
        .unwrap_or_else(|| panic!("no {subject} line in:\n{out}"))
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn check_names_what_the_node_has_and_fails_without_libvirt_where_it_is_needed() {
    let s = stack();
    let config = format!("{}/config.toml", s.dir);
    let out = check(&s, &config);
    let report = text(&out.stdout);
    assert!(
        out.status.success(),
        "vmletctl check: {report}{}",
        text(&out.stderr)
    );
    assert!(!report.contains("FAIL"), "{report}");
    // KVM runs no guest on these machines (the stack's libvirtd does not see /dev/kvm; the
    // default launcher's probe guest hangs on it): TCG, and the reason.
    let accel = check_line(&report, "accel");
    assert!(
        accel.contains("TCG fallback: KVM is not usable: ")
            || accel.contains("TCG fallback: /dev/kvm offers KVM, but "),
        "{accel}"
    );
    // The kernel's only where libvirt starts the pod's QEMU and the node has it.
    let vsock = check_line(&report, "vsock");
    let direct = check_line(&report, "launcher").contains("direct: ");
    if std::path::Path::new("/dev/vhost-vsock").exists() && !direct {
        assert!(vsock.contains("the kernel's vhost-vsock"), "{vsock}");
    } else {
        assert!(
            vsock.contains("user-space backend: vhost-device-vsock"),
            "{vsock}"
        );
    }
    let vhost_net = check_line(&report, "vhost-net");
    if !std::path::Path::new("/dev/vhost-net").exists() {
        assert!(
            vhost_net.starts_with("warn") && vhost_net.contains("missing"),
            "{vhost_net}"
        );
    }
    // The default launcher (auto) on a node without AppArmor or SELinux: the shim's own.
    let launcher = check_line(&report, "launcher");
    assert!(
        launcher.starts_with("ok") && launcher.contains("direct: ") && launcher.contains("auto"),
        "{launcher}"
    );
    for (subject, needle) in [
        ("libvirt", "security driver none"),
        ("guest", "manifest.json: kernel"),
        ("containerd", "containerd"),
        ("runtime", "runtimes.vmlet in"),
    ] {
        let line = check_line(&report, subject);
        assert!(line.starts_with("ok") && line.contains(needle), "{line}");
    }

    // The same node with libvirt gone: a socket nobody listens on.
    let dead = format!("{}/check-no-libvirt.toml", s.dir);
    let text_of_config = std::fs::read_to_string(&config).unwrap();
    let without = text_of_config
        .lines()
        .map(|l| {
            if l.starts_with("libvirt_uri") {
                format!(
                    "libvirt_uri = \"qemu:///system?socket={}/no-libvirt-sock\"",
                    s.dir
                )
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    // Under the default launcher, only a CPU model libvirt expands needs it.
    std::fs::write(&dead, &without).unwrap();
    let out = check(&s, &dead);
    let report = text(&out.stdout);
    assert!(out.status.success(), "{report}{}", text(&out.stderr));
    let libvirt = check_line(&report, "libvirt");
    assert!(
        libvirt.starts_with("warn")
            && libvirt.contains("unreachable")
            && libvirt.contains("VM image"),
        "{libvirt}"
    );
    // Under launcher = "libvirt", no pod starts.
    std::fs::write(&dead, format!("launcher = \"libvirt\"\n{without}")).unwrap();
    let out = check(&s, &dead);
    std::fs::remove_file(&dead).unwrap();
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let libvirt = check_line(&report, "libvirt");
    assert!(
        libvirt.starts_with("FAIL") && libvirt.contains("unreachable"),
        "{libvirt}"
    );
    assert!(
        check_line(&report, "launcher").contains("libvirt: "),
        "{report}"
    );
    assert!(text(&out.stderr).contains("a pod cannot start"));
}

/// `accel = "auto"` boots the guest kernel to its panic to learn whether KVM runs guests
/// (`vmlet_shim::vmm::kvm_probe`): under TCG that boot ends, with the kernel's panic on its
/// console, well within the probe's deadline; a kernel that is none is named. (Whether KVM
/// itself passes is this host's: `scripts/check-clean-root` checks the fallback where
/// libvirt offers a KVM that cannot run guests.)
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn the_kvm_probes_guest_boots_to_its_end() {
    let s = stack();
    let qemu = std::path::Path::new("/usr/bin/qemu-system-x86_64");
    let kernel = std::path::PathBuf::from(&s.guest_dir).join("vmlinux");
    let dir = std::path::PathBuf::from(&s.dir).join(unique_id("kvmprobe"));
    std::fs::create_dir_all(&dir).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let boot = |kernel: &std::path::Path| {
        runtime.block_on(vmlet_shim::vmm::kvm_probe::boot_to_panic(
            qemu, kernel, "q35", "tcg", &dir,
        ))
    };
    let (answer, keep) = boot(&kernel);
    let took = answer.expect("the probe guest boots to its panic under TCG");
    assert!(keep);
    assert!(took < vmlet_shim::vmm::kvm_probe::DEADLINE, "{took:?}");
    eprintln!("probe guest under TCG: {} ms", took.as_millis());

    let not_a_kernel = dir.join("not-a-kernel");
    std::fs::write(&not_a_kernel, "text").unwrap();
    let (answer, _) = boot(&not_a_kernel);
    let why = answer.unwrap_err();
    assert!(why.contains("QEMU exited with status"), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `vmletctl check` on a node without a state directory probes KVM in a scratch directory:
/// a local user who planted `/tmp/vmlet-kvm-probe-<pid>` with a link where the probe's
/// console used to go (a file root would then have truncated) gets nothing: the directory
/// is made new, with a random name, and the planted one and the link's target are as they
/// were. (The probe itself fails on this host's KVM or passes; either is beside the point.)
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_planted_kvm_probe_directory_is_not_used() {
    let s = stack();
    let qemu = std::path::Path::new("/usr/bin/qemu-system-x86_64");
    let kernel = std::path::PathBuf::from(&s.guest_dir).join("vmlinux");
    let pid = std::process::id();
    // What the old name would have been for this process (the probe runs in it).
    let planted = std::env::temp_dir().join(format!("vmlet-kvm-probe-{pid}"));
    let victim = std::path::PathBuf::from("/var/tmp").join(unique_id("kvm-probe-victim"));
    std::fs::write(&victim, "root must not truncate this\n").unwrap();
    let _ = std::fs::remove_dir_all(&planted);
    std::fs::create_dir(&planted).unwrap();
    let link = planted.join(format!("kvm-probe-{pid}.console"));
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answer = runtime.block_on(vmlet_shim::vmm::kvm_probe::guest_boots_on_kvm(
        qemu, &kernel, "q35", None,
    ));
    eprintln!("the probe on this host's KVM: {answer:?}");
    let victim_after = std::fs::read_to_string(&victim).unwrap();
    let planted_after: Vec<_> = std::fs::read_dir(&planted)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let link_after = std::fs::read_link(&link).unwrap();
    std::fs::remove_dir_all(&planted).unwrap();
    std::fs::remove_file(&victim).unwrap();
    assert_eq!(victim_after, "root must not truncate this\n");
    assert_eq!(planted_after.len(), 1, "{planted_after:?}");
    assert_eq!(link_after, victim);
}

/// The stack's libvirt state directory (libvirtd's `/var/lib/libvirt/qemu`) at Debian's mode
/// (0750) while it lives; its own (0755) again when dropped.
struct DebiansLibvirtDir(std::path::PathBuf);

impl DebiansLibvirtDir {
    fn new(s: &Stack) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::path::PathBuf::from(format!("{}/libvirt/lib/qemu", s.dir));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        DebiansLibvirtDir(dir)
    }
}

impl Drop for DebiansLibvirtDir {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
    }
}

/// Each pod's QEMU runs as a user of its own, which must pass through libvirt's state
/// directory: where it cannot (Debian ships it 0750, until `vmletctl install`), check fails
/// by name, and a pod's create says what to do and leaves nothing.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_libvirt_directory_closed_to_the_pods_users_fails_check_and_the_create_by_name() {
    let s = stack();
    // What libvirt starts: under the direct launcher only a CPU model libvirt expands is.
    let _libvirt = vmlet_integration::libvirt_launcher();
    let config = format!("{}/config.toml", s.dir);
    let report = text(&check(&s, &config).stdout);
    assert!(
        check_line(&report, "pod-users").starts_with("ok"),
        "{report}"
    );
    let closed = DebiansLibvirtDir::new(&s);
    let out = check(&s, &config);
    let report = text(&out.stdout);
    assert!(!out.status.success(), "{report}");
    let users = check_line(&report, "pod-users");
    assert!(
        users.starts_with("FAIL") && users.contains("`vmletctl install`"),
        "{users}"
    );
    let id = unique_id("closed-dir");
    let out = s.run(&id, &[], &["true"]).unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("`vmletctl install` gives others search permission"),
        "{}",
        text(&out.stderr)
    );
    drop(closed);
    let _ = s.ctr_output(&["container", "rm", &id]);
    assert!(s.pod_processes(&id).is_empty(), "pod {id} left processes");
    assert!(!s.has_pod_domain(&id), "pod {id} left its domain");
    assert!(
        !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
        "pod {id} left its state"
    );
}
