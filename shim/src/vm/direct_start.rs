//! The pod's VM started by the shim itself (`launcher = "direct"`), without libvirt: the
//! pod's virtiofsd ([`crate::host::virtiofsd`]), then QEMU with vmlet's own command line
//! ([`crate::vmm::qemu_command`]) as the node's QEMU user, in the pod's cgroup
//! ([`crate::host::qemu_process`]), its console file, taps and connection to virtiofsd
//! handed over as descriptors. The shim connects virtiofsd's socket itself (root's alone):
//! virtiofsd serves one connection, so no other process of the QEMU user (another pod's
//! QEMU) can take it.
//! Each is recorded in the journal as soon as it runs (`Made::Process`, `Made::Qemu`); the
//! returned handle kills QEMU if it is dropped before the pod's teardown.
//!
//! Not on a node with AppArmor or SELinux enforcing: libvirt confines each VM there (its
//! AppArmor profile, its sVirt labels), and vmlet has no confinement of its own for QEMU
//! yet, so a pod there is refused rather than run unconfined. What libvirt adds elsewhere
//! and this launcher does not: a private `/dev` for QEMU and a device cgroup filter.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use vmlet_config::NodeConfig;

use super::{BootRequest, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::qemu_process::{self, Confinement, QemuProcess};
use crate::host::undo::{Made, ProcessId};
use crate::vmm::qemu_command::{qemu_command, Launched};
use crate::vmm::vm_spec::VmSpec;
use crate::Error;

/// Where the kernel says whether AppArmor confines processes, and whether SELinux enforces.
const APPARMOR_ENABLED: &str = "/sys/module/apparmor/parameters/enabled";
const SELINUX_ENFORCE: &str = "/sys/fs/selinux/enforce";

/// Starts the pod's virtiofsd and then QEMU for `spec`, QEMU on `tap_fds` (the NICs'
/// taps in `spec`'s order).
pub(super) fn start(
    config: &NodeConfig,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    spec: &VmSpec,
    tap_fds: Vec<OwnedFd>,
) -> Result<QemuProcess, Error> {
    if let Some(lsm) = confining_lsm() {
        return Err(Error::FailedPrecondition(format!(
            "pod {}: launcher = \"direct\" on a node with {lsm}: vmlet has no {lsm} \
             confinement of its own for QEMU, and QEMU is not run unconfined; use launcher = \
             \"libvirt\" on this node",
            req.pod_id
        )));
    }
    let cgroup_procs = || match &req.cgroup {
        Some(cgroup) => cgroup.procs_files(),
        None => Ok(Vec::new()),
    };
    let share = start_virtiofsd(config, paths, rec, cgroup_procs()?)?;
    let console = append_only(&paths.console)?;
    let launched = Launched {
        uuid: random_uuid()?,
        share_fd: share.as_raw_fd(),
        console_fd: Some(console.as_raw_fd()),
        tap_fds: tap_fds.iter().map(AsRawFd::as_raw_fd).collect(),
    };
    let args = qemu_command(spec, &launched)?;
    let mut inherit = vec![OwnedFd::from(console), share];
    inherit.extend(tap_fds);
    let qemu = qemu_process::spawn(
        Path::new(&spec.qemu),
        &args,
        inherit,
        Confinement {
            uid: spec.user.uid,
            gid: spec.user.gid,
            groups: spec.user.groups.clone(),
            cgroup_procs: cgroup_procs()?,
            apparmor_profile: None,
        },
        create_log(&paths.qemu_log)?,
    )
    .map_err(|e| e.within(&format!("start QEMU ({})", log_tail(&paths.qemu_log))))?;
    let process = ProcessId::of(qemu.pid, "QEMU").ok_or_else(|| ended(&paths.qemu_log, "QEMU"))?;
    rec.record(Made::Qemu(process))?;
    Ok(qemu)
}

/// The pod's virtiofsd, recorded once it runs, on a socket of root's; returns the shim's
/// connection to it, for QEMU.
fn start_virtiofsd(
    config: &NodeConfig,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    cgroup_procs: Vec<File>,
) -> Result<OwnedFd, Error> {
    let socket = &paths.share_socket;
    let listener = std::os::unix::net::UnixListener::bind(socket)
        .map_err(|e| Error::io(format!("bind {}", socket.display()), e))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod {}", socket.display()), e))?;
    // Queued on the listening socket now, taken by virtiofsd when it runs.
    let connection = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| Error::io(format!("connect {}", socket.display()), e))?;
    let pid = crate::host::virtiofsd::spawn(
        &config.helpers.virtiofsd,
        &paths.share,
        listener,
        cgroup_procs,
        create_log(&paths.virtiofsd_log)?,
    )?;
    let process =
        ProcessId::of(pid, "virtiofsd").ok_or_else(|| ended(&paths.virtiofsd_log, "virtiofsd"))?;
    if let Err(e) = rec.record(Made::Process(process.clone())) {
        // Nothing would end it.
        let _ = process.kill();
        return Err(e);
    }
    Ok(OwnedFd::from(connection))
}

/// The security module that confines libvirt's VMs on this node, if any.
fn confining_lsm() -> Option<&'static str> {
    let reads = |path: &str, on: &str| std::fs::read_to_string(path).is_ok_and(|s| s.trim() == on);
    if reads(APPARMOR_ENABLED, "Y") {
        Some("AppArmor")
    } else if reads(SELINUX_ENFORCE, "1") {
        Some("SELinux enforcing")
    } else {
        None
    }
}

/// A new file of the pod's (the log tmpfs'), for a process's output; an existing one (or
/// a link) is refused.
fn create_log(path: &Path) -> Result<File, Error> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))
}

/// The console file, for QEMU to append to (made if need be; never through a link).
fn append_only(path: &Path) -> Result<File, Error> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// A version 4 UUID.
fn random_uuid() -> Result<String, Error> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b)
        .map_err(|e| Error::Internal(format!("random bytes for the VM's UUID: {e}")))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// `what` ended as it started: the error quotes its log.
fn ended(log: &Path, what: &str) -> Error {
    Error::FailedPrecondition(format!("{what} ended as it started: {}", log_tail(log)))
}

/// The end of a process's log, for an error: read as the console's tail is (bounded, its
/// control characters dropped: what QEMU and virtiofsd log, the guest may have caused).
pub(super) fn log_tail(log: &Path) -> String {
    match crate::guest::console::tail(log).trim() {
        "" => format!("{} is empty", log.display()),
        text => format!("{}: {text}", log.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_random_version_4() {
        let (a, b) = (random_uuid().unwrap(), random_uuid().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4", "{a}");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }

    #[test]
    fn an_error_quotes_the_end_of_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("qemu.log");
        let mut long = "x".repeat(5000);
        long.push_str("\nqemu: -device foo: not found");
        std::fs::write(&log, long).unwrap();
        let tail = log_tail(&log);
        assert!(tail.ends_with("not found"), "{tail}");
        assert!(tail.len() < crate::guest::console::CONSOLE_TAIL as usize + 100);
        std::fs::write(&log, "").unwrap();
        assert!(log_tail(&log).ends_with("is empty"));
        let exists = create_log(&log).unwrap_err();
        assert!(exists.message().contains("qemu.log"), "{exists}");
    }
}
