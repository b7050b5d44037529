//! Each pod's QEMU is a principal of its own under the libvirt launcher (by the domain's
//! static DAC label; `scripts/e2e libvirt` runs this area with `launcher = "libvirt"`, and
//! `direct_pods` attacks the default's, the shim's own launcher, on these machines): two pods' QEMUs run as two uids of the node's
//! `pod_users`, given back with their pods. QEMU runs an attacker's code at worst (a guest
//! that broke out of it). Attacks, as another pod's QEMU's user: connecting to a pod's
//! sockets (vmlet's and those libvirt keeps in the domain's directory) or reading its console
//! log while it runs, and taking vmlet's QMP monitor, the vsock backend's socket or the pod's
//! virtiofsd before the pod's QEMU exists (a fake QEMU that would be handed the pod's
//! descriptors, or served its share); and opening the node's guest kernel and initrd, which every later
//! pod boots, for writing (libvirt gives what a domain names to its QEMU's user: the kernel
//! is QEMU's argument instead). Run by `make test`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agent_gate::{
    as_user, nobody_reaches_the_socket, user_cannot_reach_the_socket, user_cannot_read,
};
use crate::direct_pods::{
    assert_left_nothing, node_config, pod_dir, pod_processes, pod_uid, status,
};
use crate::support::{stack, text};
use vmlet_integration::{unique_id, Stack};

/// Pod `id`'s QEMU.
fn qemu_of(s: &Stack, id: &str) -> u32 {
    pod_processes(s, id).qemu
}

/// The uid and gid QEMU `pid` runs as (its real ones).
fn ids(pid: u32) -> (u32, u32) {
    let first = |key: &str| -> u32 {
        let ids = status(pid, key);
        ids.split_whitespace().next().unwrap().parse().unwrap()
    };
    (first("Uid"), first("Gid"))
}

/// The guest kernel and initrd the stack's config names.
fn guest_files() -> [PathBuf; 2] {
    let config = node_config();
    [config.guest.kernel, config.guest.initrd]
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_pods_qemu_cannot_rewrite_the_guest_kernel_every_pod_boots() {
    let s = stack();
    let id = unique_id("kernel");
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    let (uid, gid) = ids(qemu_of(&s, &id));
    assert_ne!(uid, 0, "QEMU runs as root");
    for file in guest_files() {
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o022),
            (0, 0, 0),
            "{} while pod {id} runs",
            file.display()
        );
        // As QEMU's user would: open it to append.
        let out = as_user(&uid.to_string(), &gid.to_string())
            .args(["sh", "-c", "exec 3>>\"$0\"", "--"])
            .arg(&file)
            .output()
            .expect("setpriv (util-linux)");
        assert!(
            !out.status.success() && text(&out.stderr).contains("Permission denied"),
            "QEMU's user {uid} opened {} for writing: {}",
            file.display(),
            text(&out.stderr)
        );
    }
    s.kill_and_remove(&id).unwrap();
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn two_pods_qemus_are_two_users_that_reach_nothing_of_each_other() {
    let s = stack();
    let (id, other) = (unique_id("user-a"), unique_id("user-b"));
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    s.run_detached(&other, &["sleep", "1000"]).unwrap();
    let uid = pod_uid(qemu_of(&s, &id));
    let (other_uid, other_gid) = ids(qemu_of(&s, &other));
    pod_uid(qemu_of(&s, &other));
    assert_ne!(uid, other_uid, "two pods' QEMUs share a uid");
    let dir = pod_dir(&s, &id);
    // vmlet's QMP monitor and the pod's virtiofsd's socket are the pod's QEMU's; the shim's
    // end of the vsock backend root's.
    for (socket, owner) in [
        ("qmp.sock", uid),
        ("virtiofsd.sock", uid),
        ("vsock.sock", 0),
    ] {
        let path = dir.join(socket);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (meta.uid(), meta.mode() & 0o777),
            (owner, 0o600),
            "{socket}"
        );
        nobody_reaches_the_socket(&path);
        user_cannot_reach_the_socket(&other_uid.to_string(), &other_gid.to_string(), &path);
    }
    // Nor, from its own mount namespace, any socket libvirt keeps for the pod in the domain's
    // directory (where libvirt's own virtiofsd would serve the share, to the group every
    // pod's QEMU has).
    let qemu = qemu_of(&s, &id);
    let domain_dir = libvirt_domain_dir(qemu);
    let in_namespace = domain_dir.strip_prefix("/").unwrap();
    let sockets = sockets_in(&Path::new(&format!("/proc/{qemu}/root")).join(in_namespace));
    assert!(!sockets.is_empty(), "no socket in {}", domain_dir.display());
    for name in sockets {
        let socket = domain_dir.join(&name);
        let out = std::process::Command::new("nsenter")
            .arg(format!("--target={}", qemu_of(&s, &other)))
            .arg("--mount")
            .arg("--")
            .args(setpriv_argv(&other_uid, &other_gid))
            .args(["socat", "-u", "OPEN:/dev/null"])
            .arg(format!("UNIX-CONNECT:{}", socket.display()))
            .output()
            .expect("nsenter, setpriv and socat");
        assert!(
            !out.status.success() && text(&out.stderr).contains("Permission denied"),
            "pod {other}'s QEMU's user connected to {}: {}",
            socket.display(),
            text(&out.stderr)
        );
    }
    let console = dir.join("log/console.log");
    user_cannot_read(&other_uid.to_string(), &other_gid.to_string(), &console);
    s.kill_and_remove(&id).unwrap();
    s.kill_and_remove(&other).unwrap();
    let claims = PathBuf::from(format!("{}/state/.pod-users", s.dir));
    for (pod, uid) in [(&id, uid), (&other, other_uid)] {
        assert_left_nothing(&s, pod);
        assert!(
            !claims.join(uid.to_string()).exists(),
            "uid {uid} still claimed"
        );
    }
}

/// libvirt's directory of the domain whose QEMU is `qemu` (where its master key is, which
/// QEMU's command line names), as QEMU's mount namespace names it.
fn libvirt_domain_dir(qemu: u32) -> PathBuf {
    let cmdline = std::fs::read(format!("/proc/{qemu}/cmdline")).unwrap();
    let key = String::from_utf8_lossy(&cmdline)
        .split(['"', ',', '\0'])
        .find(|a| a.ends_with("/master-key.aes"))
        .map(PathBuf::from)
        .expect("QEMU's command line names libvirt's master key");
    key.parent().unwrap().to_owned()
}

/// `setpriv` and its arguments, as [`as_user`] runs it for `uid` and `gid`.
fn setpriv_argv(uid: &u32, gid: &u32) -> Vec<std::ffi::OsString> {
    let setpriv = as_user(&uid.to_string(), &gid.to_string());
    std::iter::once(setpriv.get_program().to_owned())
        .chain(setpriv.get_args().map(ToOwned::to_owned))
        .collect()
}

/// The names of the sockets in `dir`.
fn sockets_in(dir: &Path) -> Vec<std::ffi::OsString> {
    use std::os::unix::fs::FileTypeExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_socket())
        .map(|e| e.file_name())
        .collect()
}

/// As `uid`:`gid`, tries to connect to `socket` every 20 ms until it is ended; what it
/// prints says whether it ever did.
fn keep_connecting(uid: u32, gid: u32, socket: &Path) -> std::process::Child {
    let address = format!(
        "UNIX-CONNECT:{},retry=100000,interval=0.02",
        socket.display()
    );
    as_user(&uid.to_string(), &gid.to_string())
        .args(["timeout", "120", "socat", "-u", "OPEN:/dev/null"])
        .arg(address)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("setpriv, timeout and socat")
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn another_pods_qemu_cannot_take_a_pods_monitor_before_its_qemu_exists() {
    fake_qemus_never_get_through(&stack());
}

/// A pod's QEMU's user keeps connecting to a new pod's `qmp.sock`, `vhost-vsock.sock` and
/// `virtiofsd.sock` from before the pod's directory exists until the pod has started and answered an exec:
/// it never gets through (under the launcher the node config names).
pub(crate) fn fake_qemus_never_get_through(s: &Stack) {
    let other = unique_id("fake-qemu");
    s.run_detached(&other, &["sleep", "1000"]).unwrap();
    let (uid, gid) = ids(qemu_of(s, &other));
    let id = unique_id("monitored");
    let dir = pod_dir(s, &id);
    // Waiting for the sockets before the pod's directory exists.
    let fakes: Vec<_> = ["qmp.sock", "vhost-vsock.sock", "virtiofsd.sock"]
        .into_iter()
        .map(|socket| (socket, keep_connecting(uid, gid, &dir.join(socket))))
        .collect();
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    let out = s
        .ctr_output(&["task", "exec", "--exec-id", "probe", &id, "echo", "alive"])
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "alive", "{}", text(&out.stderr));
    std::thread::sleep(Duration::from_secs(1));
    for (socket, mut fake) in fakes {
        let still_trying = fake.try_wait().unwrap().is_none();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(fake.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let out = fake.wait_with_output().unwrap();
        assert!(
            still_trying,
            "pod {other}'s QEMU's user connected to {socket} of pod {id}: {}",
            text(&out.stderr)
        );
    }
    s.kill_and_remove(&id).unwrap();
    s.kill_and_remove(&other).unwrap();
    assert_left_nothing(s, &id);
}
