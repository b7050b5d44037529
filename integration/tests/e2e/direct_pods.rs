//! Pods started without libvirt (`launcher = "direct"`): the shim starts QEMU and the pod's
//! virtiofsd itself. A pod so started runs, reaches its CNI network (the gateway and a pod
//! started so beside it), has no libvirt domain, runs its QEMU as the QEMU user without
//! capabilities, as the shim's child, and both QEMU and virtiofsd in the pod's cgroup; a pod
//! loads its shape's template so; a QEMU that refuses its command line fails the create with
//! its own words at once; and each leaves nothing. Attack: another pod's QEMU's uid, and a
//! local user who is not root, connect to none of the pod's sockets (virtiofsd's, vmlet's
//! QMP monitor, the vsock backend's), even before its QEMU exists, and read none of its logs,
//! which lie on the pod's log tmpfs (what the guest makes QEMU and virtiofsd write cannot
//! fill the node); the pod's QEMU sees, in its own mount namespace, its pod's directory alone
//! in the state directory and a `/dev` of five nodes, and reaches no abstract Unix socket of
//! the node's from its own network namespace. A VM image starts so too, with libvirt out of
//! the shim's reach: OVMF and its disks handed over as descriptors, an exec through its guest
//! agent, QEMU without capabilities or new privileges, under seccomp. These change the node's
//! config, so the area runs alone.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::agent_gate::{
    nobody_reaches_the_socket, user_cannot_reach_the_socket, user_cannot_read,
};
use crate::cni::{run_pod_reaching_gateway_and_peer, Node, Pod};
use crate::support::{stack, text};
use vmlet_integration::{direct_launcher, unique_id, ConfigSwap, Stack, TemplatesOn};

/// The pod's QEMU, virtiofsd and shim, by the kind in their command lines.
pub(crate) struct PodProcesses {
    pub(crate) qemu: u32,
    virtiofsd: u32,
    shim: u32,
}

pub(crate) fn pod_processes(s: &Stack, id: &str) -> PodProcesses {
    let procs = s.pod_processes(id);
    let find = |kind: &str| {
        procs
            .iter()
            .find(|(_, cmdline)| cmdline.contains(kind))
            .map(|(pid, _)| *pid)
            .unwrap_or_else(|| panic!("no {kind} of pod {id} among {procs:?}"))
    };
    PodProcesses {
        qemu: find("qemu-system"),
        virtiofsd: find("virtiofsd"),
        shim: find("containerd-shim-vmlet"),
    }
}

/// `key`'s line of `/proc/PID/status`, without the key.
pub(crate) fn status(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .trim()
        .to_owned()
}

/// The parent of `pid` (`/proc/PID/stat`'s 4th field, after the command's parentheses).
fn parent(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

pub(crate) fn node_config() -> vmlet_config::NodeConfig {
    let config = std::env::var("VMLET_CONFIG").expect("VMLET_CONFIG: the stack's config");
    vmlet_config::NodeConfig::load_from(Path::new(&config)).expect("the stack's config")
}

/// The uid QEMU `pid` runs as (real, effective, saved and file system uids all that), which
/// must be one of the node's `pod_users` and not the node's QEMU user's.
pub(crate) fn pod_uid(pid: u32) -> u32 {
    let uids = status(pid, "Uid");
    let uid: u32 = uids.split('\t').next().unwrap().parse().unwrap();
    assert_eq!(uids, format!("{uid}\t{uid}\t{uid}\t{uid}"));
    let config = node_config();
    assert!(config.pod_users.holds(uid), "QEMU's uid {uid} is no pod's");
    let shared = nix::unistd::User::from_name(&config.qemu_user)
        .unwrap()
        .expect("the QEMU user");
    assert_ne!(
        uid,
        shared.uid.as_raw(),
        "QEMU runs as the node's QEMU user"
    );
    uid
}

pub(crate) fn pod_dir(s: &Stack, id: &str) -> PathBuf {
    PathBuf::from(format!("{}/state/{id}", s.dir))
}

/// Pod `id`'s QEMU, as its own mount namespace has the node's files: in the state
/// directory its pod's directory alone (with its mounts: the log tmpfs), not `other`'s nor
/// the node's claims and counters; in `/dev` the few nodes a VM opens, as the node has them,
/// and no disk, terminal or `/dev/shm`. The node's own view is unchanged.
fn qemu_sees_its_pod_and_a_few_devices(s: &Stack, id: &str, other: &str) {
    let qemu = pod_processes(s, id).qemu;
    let root = PathBuf::from(format!("/proc/{qemu}/root"));
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let state = format!("{}/state", s.dir);
    let in_view = root.join(state.trim_start_matches('/'));
    assert_eq!(names(&in_view), [id.to_owned()], "QEMU's state directory");
    let own = in_view.join(id);
    assert!(own.join("qmp.sock").exists());
    assert_eq!(
        std::fs::metadata(own.join("log")).unwrap().dev(),
        std::fs::metadata(pod_dir(s, id).join("log")).unwrap().dev(),
        "the pod's log tmpfs in QEMU's view"
    );
    assert!(names(Path::new(&state)).contains(&other.to_owned()));
    let devices = names(&root.join("dev"));
    assert_eq!(
        devices.iter().filter(|d| *d != "kvm").collect::<Vec<_>>(),
        ["full", "null", "random", "urandom", "zero"],
        "QEMU's /dev"
    );
    for device in &devices {
        let (seen, node) = (
            std::fs::metadata(root.join("dev").join(device)).unwrap(),
            std::fs::metadata(Path::new("/dev").join(device)).unwrap(),
        );
        assert_eq!(
            (seen.rdev(), seen.uid(), seen.gid(), seen.mode()),
            (node.rdev(), node.uid(), node.gid(), node.mode()),
            "/dev/{device}"
        );
    }
    assert!(std::fs::read_dir("/dev").unwrap().count() > devices.len());
    qemu_reaches_no_abstract_socket_of_the_node(qemu);
}

/// The agent's key never was a file: QEMU read it (`-fw_cfg`) from a pipe it inherited,
/// the pod's uid's alone (0400), through `/proc/self/fd`; the pod's directory holds no key.
fn qemu_read_its_key_from_a_pipe(qemu: u32, pod_dir: &Path) {
    let cmdline = std::fs::read(format!("/proc/{qemu}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let key = args
        .iter()
        .find(|a| a.starts_with("name=opt/") && a.contains(",file="))
        .unwrap_or_else(|| panic!("no fw_cfg file in {args:?}"));
    let fd = key
        .split_once(",file=/proc/self/fd/")
        .unwrap_or_else(|| panic!("the key is not read from a descriptor: {key}"))
        .1;
    let pipe = std::fs::metadata(format!("/proc/{qemu}/fd/{fd}")).unwrap();
    assert!(pipe.file_type().is_fifo(), "{key}: not a pipe");
    assert_eq!(
        (pipe.uid(), pipe.mode() & 0o777),
        (pod_uid(qemu), 0o400),
        "the key's pipe"
    );
    assert!(!pod_dir.join("agent.key").exists());
    assert!(!args.iter().any(|a| a.contains("agent.key")), "{args:?}");
}

/// QEMU was handed the shim's connection to the vsock backend (a socket it inherited) and
/// names no socket of the backend's to connect.
fn qemu_was_handed_its_vsock_connection(qemu: u32) {
    let cmdline = std::fs::read(format!("/proc/{qemu}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let chardev = args
        .iter()
        .find(|a| a.starts_with("socket,id=vmlet-vsock,"))
        .unwrap_or_else(|| panic!("no vsock chardev in {args:?}"));
    let fd = chardev
        .strip_prefix("socket,id=vmlet-vsock,fd=")
        .unwrap_or_else(|| panic!("the vsock backend is not a descriptor: {chardev}"));
    let socket = std::fs::metadata(format!("/proc/{qemu}/fd/{fd}")).unwrap();
    assert!(socket.file_type().is_socket(), "{chardev}: not a socket");
    assert!(
        !args.iter().any(|a| a.contains("vhost-vsock.sock")),
        "{args:?}"
    );
}

/// Attack: a pod's QEMU (its uid and gid, in its mount namespace) leaves a file nowhere,
/// not in the node's world-writable `/tmp` or `/var/tmp` (where a file, set-user-ID too,
/// would outlive the pod and be the next pod's of that uid), nor in its pod's directory or
/// its `/dev`: every mount of its view is read-only. The same write as the same user from
/// the node's view takes.
fn qemu_writes_nowhere(qemu: u32, pod_dir: &Path) {
    let (uid, gid) = (pod_uid(qemu).to_string(), status(qemu, "Gid"));
    let gid = gid.split('\t').next().unwrap().to_owned();
    let name = format!("vmlet-e2e-qemu-file-{}", std::process::id());
    let write = |view: Option<u32>, dir: &Path| {
        let mut command = match view {
            Some(pid) => {
                let mut nsenter = std::process::Command::new("nsenter");
                nsenter
                    .arg(format!("--target={pid}"))
                    .args(["--mount", "--"]);
                nsenter.arg("setpriv");
                nsenter
            }
            None => std::process::Command::new("setpriv"),
        };
        command
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .args(["--clear-groups", "sh", "-c", "echo x > \"$1\"", "sh"])
            .arg(dir.join(&name))
            .output()
            .expect("nsenter and setpriv (util-linux)")
    };
    for dir in [
        Path::new("/tmp"),
        Path::new("/var/tmp"),
        pod_dir,
        Path::new("/dev"),
    ] {
        let out = write(Some(qemu), dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("Read-only file system"),
            "pod's QEMU wrote in {}: {err}",
            dir.display()
        );
        assert!(!dir.join(&name).exists(), "{}", dir.display());
    }
    let node_tmp = Path::new("/tmp").join(&name);
    assert!(write(None, Path::new("/tmp")).status.success());
    std::fs::remove_file(&node_tmp).unwrap();
}

/// Attack: an abstract Unix socket of the node's (a daemon's, which only its network
/// namespace scopes) is out of the reach of a pod's QEMU: QEMU has a network namespace of its
/// own. The same connect from the node's namespace gets through.
fn qemu_reaches_no_abstract_socket_of_the_node(qemu: u32) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
    let own = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(
        own(&qemu.to_string()),
        own("self"),
        "QEMU's network namespace"
    );
    let name = format!("vmlet-e2e-abstract-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = UnixListener::bind_addr(&addr).unwrap();
    UnixStream::connect_addr(&addr).expect("the node's own connect");
    let netns = std::fs::File::open(format!("/proc/{qemu}/ns/net")).unwrap();
    let from_qemu = std::thread::spawn(move || {
        // This thread alone enters QEMU's network namespace.
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        UnixStream::connect_addr(&addr).map(|_| ())
    })
    .join()
    .unwrap();
    let err =
        from_qemu.expect_err("an abstract socket of the node's reached from QEMU's namespace");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

pub(crate) fn assert_left_nothing(s: &Stack, id: &str) {
    assert_eq!(s.pod_processes(id), Vec::new(), "pod {id}'s processes");
    assert!(!pod_dir(s, id).exists(), "pod {id}'s state directory");
    assert!(!s.has_pod_domain(id), "pod {id}'s domain");
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn pods_started_without_libvirt_reach_their_network_from_their_cgroup_and_leave_nothing() {
    let s = stack();
    let _direct = direct_launcher();
    let log_before = s.containerd_log().len();
    let node = Node::new();
    let (a, b) = (Pod::new(&node, "direct-a"), Pod::new(&node, "direct-b"));
    let a_id = unique_id("direct-a");
    let with_ns = format!("network:{}", a.path().display());
    s.run_detached_with(&a_id, &["--with-ns", &with_ns], &["sleep", "1000"])
        .unwrap();
    let vm = format!("vmlet-{a_id}");
    assert!(
        !s.vmlet_domains().unwrap().contains(&vm),
        "a domain for a pod without libvirt"
    );
    assert!(s.pod_vms().unwrap().contains(&vm), "the pod's QEMU");
    let p = pod_processes(&s, &a_id);
    assert_eq!(parent(p.qemu), p.shim, "QEMU is the shim's child");
    pod_uid(p.qemu);
    assert_eq!(status(p.qemu, "CapEff"), "0000000000000000");
    // ctr's cgroupsPath is /NAMESPACE/ID.
    let pod_cgroup = format!("/default/{a_id}\n");
    for (pid, what) in [(p.qemu, "QEMU"), (p.virtiofsd, "virtiofsd")] {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(
            cgroups.contains(&pod_cgroup),
            "{what} is not in the pod's cgroup:\n{cgroups}"
        );
    }

    // A second pod so started reaches the gateway and the first.
    let b_id = unique_id("direct-b");
    run_pod_reaching_gateway_and_peer(&s, &node, &b, &b_id, &a.ip);
    s.kill_and_remove(&a_id).unwrap();

    let log = &s.containerd_log()[log_before..];
    for id in [&a_id, &b_id] {
        assert!(
            log.contains(&format!("pod {id}: QEMU started in")),
            "pod {id} did not start without libvirt:\n{log}"
        );
        assert_left_nothing(&s, id);
    }
    assert_eq!(a.vmlet_leftovers(), "");
    assert_eq!(b.vmlet_leftovers(), "");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_pod_loads_its_shapes_template_without_libvirt() {
    let s = stack();
    let _direct = direct_launcher();
    let _templates = TemplatesOn::new("vmlet-templates-direct").unwrap();
    let log_before = s.containerd_log().len();
    let (saver, loader) = (unique_id("direct-save"), unique_id("direct-load"));
    for id in [&saver, &loader] {
        let out = s
            .run(id, &[], &["cat", "/proc/sys/kernel/random/boot_id"])
            .unwrap();
        assert!(out.status.success(), "{id}: {}", text(&out.stderr));
    }
    let log = &s.containerd_log()[log_before..];
    crate::templates::assert_saved_and_loaded(log, &saver, &loader);
    for id in [&saver, &loader] {
        assert!(log.contains(&format!("pod {id}: QEMU started in")), "{log}");
    }
    assert_left_nothing(&s, &saver);
    assert_left_nothing(&s, &loader);
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_qemu_that_refuses_its_command_line_fails_the_create_with_its_reason() {
    let s = stack();
    let _direct = direct_launcher();
    let id = unique_id("direct-bad");
    let started = std::time::Instant::now();
    let out = s
        .run(
            &id,
            &["--annotation", "vmlet.io/cpu-model=no-such-cpu"],
            &["true"],
        )
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "a CPU QEMU does not know ran");
    assert!(
        stderr.contains("QEMU ended") && stderr.contains("no-such-cpu"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the failure took {:?}",
        started.elapsed()
    );
    assert_left_nothing(&s, &id);
}

/// Each pod's QEMU has a uid of its own, and neither another pod's QEMU's uid nor `nobody`
/// reaches a pod's sockets or reads its logs.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn only_the_pods_own_qemu_reaches_its_sockets_or_logs_without_libvirt() {
    let s = stack();
    let _direct = direct_launcher();
    let (id, other) = (unique_id("direct-gate"), unique_id("direct-other"));
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    s.run_detached(&other, &["sleep", "1000"]).unwrap();
    let uid = pod_uid(pod_processes(&s, &id).qemu);
    let other_uid = pod_uid(pod_processes(&s, &other).qemu);
    assert_ne!(uid, other_uid, "two pods' QEMUs share a uid");
    let other_gid = status(pod_processes(&s, &other).qemu, "Gid");
    let other_gid = other_gid.split('\t').next().unwrap().to_owned();
    let dir = pod_dir(&s, &id);
    // virtiofsd's and the vsock backend's, both sides, are root's (the shim connects them
    // and hands QEMU its side), vmlet's QMP monitor the pod's user's; none is anybody
    // else's.
    for (socket, owner) in [
        ("virtiofsd.sock", 0),
        ("vsock.sock", 0),
        ("qmp.sock", uid),
        ("vhost-vsock.sock", 0),
    ] {
        let path = dir.join(socket);
        let meta = match std::fs::metadata(&path) {
            // vhost-device-vsock serves the one QEMU that connected and removes its socket.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && socket == "vhost-vsock.sock" => {
                continue
            }
            other => other.unwrap(),
        };
        assert_eq!(
            (meta.uid(), meta.mode() & 0o777),
            (owner, 0o600),
            "{socket}"
        );
        nobody_reaches_the_socket(&path);
        user_cannot_reach_the_socket(&other_uid.to_string(), &other_gid, &path);
    }
    let log_dir = dir.join("log");
    let tmpfs = std::fs::metadata(&log_dir).unwrap().dev();
    assert_ne!(
        tmpfs,
        std::fs::metadata(&dir).unwrap().dev(),
        "log/ is a mount"
    );
    for log in ["qemu.log", "virtiofsd.log", "console.log"] {
        let path = log_dir.join(log);
        assert_eq!(std::fs::metadata(&path).unwrap().dev(), tmpfs, "{log}");
        for (user, group) in [
            ("nobody".to_owned(), "nogroup".to_owned()),
            (other_uid.to_string(), other_gid.clone()),
        ] {
            user_cannot_read(&user, &group, &path);
        }
    }
    qemu_sees_its_pod_and_a_few_devices(&s, &id, &other);
    qemu_writes_nowhere(pod_processes(&s, &id).qemu, &dir);
    qemu_read_its_key_from_a_pipe(pod_processes(&s, &id).qemu, &dir);
    qemu_was_handed_its_vsock_connection(pod_processes(&s, &id).qemu);
    s.kill_and_remove(&id).unwrap();
    s.kill_and_remove(&other).unwrap();
    assert_left_nothing(&s, &id);
    assert_left_nothing(&s, &other);
    // Both uids given back.
    let claims = PathBuf::from(format!("{}/state/.pod-users", s.dir));
    for uid in [uid, other_uid] {
        assert!(
            !claims.join(uid.to_string()).exists(),
            "uid {uid} still claimed"
        );
    }
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn another_pods_qemu_cannot_take_a_pods_monitor_before_its_qemu_exists_without_libvirt() {
    let s = stack();
    let _direct = direct_launcher();
    crate::qemu_user::fake_qemus_never_get_through(&s);
}

/// A shim that dies leaves its QEMU and virtiofsd running (each has a session of its
/// own): containerd's cleanup (`shim delete`) and `vmletctl gc` end them from the pod's
/// `state.json`, and nothing of the pod is left.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_dead_shims_qemu_is_ended_from_its_state() {
    let s = stack();
    let _direct = direct_launcher();
    let id = unique_id("direct-orphan");
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    let p = pod_processes(&s, &id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.shim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !s.pod_processes(&id).is_empty() {
        if std::time::Instant::now() > deadline {
            // What containerd did not end, gc must.
            crate::support::vmletctl(&s, &["gc"]);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(s.pod_processes(&id), Vec::new(), "the dead shim's VM");
    let _ = s.ctr_output(&["task", "delete", "-f", &id]);
    let _ = s.ctr_output(&["container", "rm", &id]);
    assert_left_nothing(&s, &id);
}

/// The UEFI test image's cloud-init: a marker once its guest agent runs.
const IMAGE_USER_DATA: &str = r#"runcmd:
  - echo "vmlet-marker $(hostname) $(systemctl is-active qemu-guest-agent)"
"#;

/// A VM image under the default config, with libvirt out of the shim's reach (its URI names
/// no socket): the shim starts QEMU itself, which boots OVMF from the node's firmware
/// descriptors and the image's root disk on virtio-scsi, all opened by the shim and handed
/// over as descriptors (which stay root's files); the guest agent's port runs an exec; QEMU
/// runs as the pod's own uid, without capabilities or new privileges, under seccomp; nothing
/// is left.
#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_vm_image_boots_with_uefi_on_its_disks_by_descriptor_and_libvirt_out_of_reach() {
    let s = stack();
    let unreachable = "qemu:///system?socket=/nonexistent/libvirt-sock";
    let _no_libvirt = ConfigSwap::edited(|c| {
        let rest: Vec<&str> = c
            .lines()
            .filter(|l| !l.starts_with("launcher") && !l.starts_with("libvirt_uri"))
            .collect();
        format!("libvirt_uri = \"{unreachable}\"\n{}\n", rest.join("\n"))
    });
    let log_before = s.containerd_log().len();
    let mut p = crate::vm_mode::vm_pod(
        &s,
        IMAGE_USER_DATA,
        &[
            ("vmlet.io/firmware", "uefi"),
            ("vmlet.io/disk-driver", "scsi"),
        ],
    )
    .await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let image =
        std::env::var("VMLET_VM_UEFI_IMAGE").expect("VMLET_VM_UEFI_IMAGE (scripts/stack env)");
    let c = p.container("vm", &image, &[], 0).await;
    let marker = crate::vm_mode::marker_in(&p.logs.join("vm.log"), &name, "v2").await;
    let ran = p
        .cri
        .exec_sync(&c, &["cat", "/sys/class/dmi/id/bios_vendor"], 60)
        .await;
    let procs = s.pod_processes(&c);
    let (qemu, cmdline) = procs
        .iter()
        .find(|(_, cmdline)| cmdline.contains("qemu-system"))
        .cloned()
        .unwrap_or_else(|| panic!("no QEMU of {c} among {procs:?}"));
    let shim = procs
        .iter()
        .find(|(_, cmdline)| cmdline.contains("containerd-shim-vmlet"))
        .map(|(pid, _)| *pid);
    let confinement: Vec<String> = ["NoNewPrivs", "Seccomp", "CapEff"]
        .iter()
        .map(|key| status(qemu, key))
        .collect();
    let qemu_parent = parent(qemu);
    let uid = pod_uid(qemu);
    // QEMU has its disks as descriptors: they stay root's alone, not even its own uid's.
    let dir = pod_dir(&s, &c);
    let disks = node_config().vm_images.disk_dir.join(&c);
    let owners: Vec<(PathBuf, u32, u32)> = [
        dir.join("uefi-vars.fd"),
        dir.join("seed.iso"),
        disks.join("root.qcow2"),
    ]
    .into_iter()
    .map(|path| {
        let meta = std::fs::metadata(&path).unwrap();
        (path, meta.uid(), meta.mode() & 0o777)
    })
    .collect();
    let pod_id = p.pod.clone();
    p.finish(&[&c]).await;
    let log = &s.containerd_log()[log_before..];
    assert!(
        marker.trim_end().ends_with(" active"),
        "the image's agent: {marker}"
    );
    let ran = ran.expect("an exec through the guest agent");
    assert_eq!(ran.exit_code, 0, "{ran:?}");
    assert!(
        String::from_utf8_lossy(&ran.stdout).contains("EFI Development Kit II"),
        "OVMF did not boot it: {ran:?}"
    );
    assert!(
        log.contains(&format!("pod {c}: QEMU started in")),
        "the VM image did not start without libvirt:\n{log}"
    );
    assert_eq!(
        confinement,
        ["1", "2", "0000000000000000"],
        "QEMU's NoNewPrivs, Seccomp, CapEff"
    );
    assert!(
        shim.is_none_or(|shim| qemu_parent == shim),
        "QEMU is the shim's child"
    );
    assert!(uid > 0);
    for (path, owner, mode) in owners {
        assert_eq!((owner, mode), (0, 0o600), "{}", path.display());
    }
    for path in ["root.qcow2", "image-disk", "seed.iso", "OVMF", "uefi-vars"] {
        assert!(
            !cmdline.contains(path),
            "QEMU opens {path} by path: {cmdline}"
        );
    }
    for id in [&c, &pod_id] {
        assert_left_nothing(&s, id);
    }
}
