//! The AppArmor profile of a pod's QEMU that the shim starts itself (`launcher = "direct"`)
//! on a node where AppArmor is on: vmlet's own, one per pod, as libvirt gives each of its VMs
//! one ([`crate::vmm::pod_apparmor`]), but needing nothing of libvirt's. It holds AppArmor's
//! base abstraction, what QEMU reads of the node (its firmware and option ROMs, a few
//! figures of `/proc` and `/sys`, `/dev/kvm` where the VM has KVM) and the files of this pod
//! that QEMU opens by their path: the guest's kernel and initrd, the vsock backend's socket; a
//! VM image's console and guest agent sockets; vmlet's QMP socket ([`pod_files`]). What QEMU
//! inherits or receives over QMP (the console file, its log, the taps, the virtiofsd
//! connection, the agent key's pipe, a VM image's disks and flash, block volumes, a
//! template's state) the shim opened, unconfined: AppArmor lets such descriptors through
//! (it revalidates only what a confined process opened), so the profile names none of them.
//!
//! The shim loads the profile as `vmlet-qemu-POD` (`apparmor_parser --replace`, the text on
//! its standard input: nothing is written under `/etc`) after recording it in the pod's
//! journal, and QEMU's child asks for it at its exec ([`crate::host::qemu_process`]); the
//! teardown (or `vmletctl gc`) removes it from the kernel once QEMU has ended ([`unload`]:
//! whatever still runs under it is ended first, since the kernel would leave such a process
//! unconfined). The shim checks that QEMU runs under it, enforced, before it goes on.
//! Tested by `scripts/check-apparmor`: a pod's QEMU runs under its profile, which opens
//! its own files and not another pod's, and no profile of vmlet's is left after the pod.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::vmm::pod_apparmor::{quoted, Access, PodFile};
use crate::vmm::vm_spec::{ConsoleTarget, GuestBoot, VmSpec, VsockDevice};
use crate::Error;

/// The name of every profile of this kind starts with it; the pod's id follows.
pub const PROFILE_PREFIX: &str = "vmlet-qemu-";
/// The first line of every such profile.
const MARK: &str = "# vmlet: the profile of a pod's QEMU that the shim starts";
/// Where the kernel says whether AppArmor confines processes, and whether SELinux enforces.
const APPARMOR_ENABLED: &str = "/sys/module/apparmor/parameters/enabled";
const SELINUX_ENFORCE: &str = "/sys/fs/selinux/enforce";
/// Where a profile is removed from the kernel by its name.
const REMOVE: &str = "/sys/kernel/security/apparmor/.remove";
/// Where a process reads its own label (AppArmor's own attribute first, where the kernel has
/// it; the one the first security module answers otherwise).
const OWN_APPARMOR_LABEL: &str = "/proc/self/attr/apparmor/current";
const OWN_LABEL: &str = "/proc/self/attr/current";
/// How long a process under a pod's profile may take to end once killed.
const ENDS_WITHIN: Duration = Duration::from_secs(10);
/// How long `apparmor_parser` may take to compile and load a profile.
const LOAD_DEADLINE: Duration = Duration::from_secs(60);

/// The security module that confines processes on this node, as far as QEMU is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLsm {
    None,
    AppArmor,
    SelinuxEnforcing,
}

/// Which security module confines processes on this node.
pub fn node_lsm() -> NodeLsm {
    let reads = |path: &str, on: &str| std::fs::read_to_string(path).is_ok_and(|s| s.trim() == on);
    // Where the module's parameter cannot be read, a label the kernel gives says it is on.
    if reads(APPARMOR_ENABLED, "Y") || std::fs::read(OWN_APPARMOR_LABEL).is_ok() {
        NodeLsm::AppArmor
    } else if reads(SELINUX_ENFORCE, "1") {
        NodeLsm::SelinuxEnforcing
    } else {
        NodeLsm::None
    }
}

/// The profile name of the pod `pod_id`'s QEMU; a pod id AppArmor would read as more than a
/// name is refused.
pub fn profile_name(pod_id: &str) -> Result<String, Error> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if pod_id.is_empty() || pod_id.len() > 200 || !pod_id.chars().all(plain) {
        return Err(Error::InvalidArgument(format!(
            "pod id {pod_id:?}: not a name vmlet gives an AppArmor profile (letters, digits, \
             '.', '_' and '-', at most 200)"
        )));
    }
    Ok(format!("{PROFILE_PREFIX}{pod_id}"))
}

/// What of the pod's own QEMU opens by path (vmlet's guest: its kernel and initrd; a VM
/// image: the sockets of its serial console and guest agent port; vmlet's QMP socket).
/// Everything else (the console file, the taps, the virtiofsd and vsock backend
/// connections, a VM image's disks and flash) it inherits from the shim; the agent's key is
/// a pipe it inherits and reopens through `/proc/self/fd`, which AppArmor does not mediate
/// (pipes are not files of a path).
pub fn pod_files(spec: &VmSpec) -> Vec<PodFile> {
    let file = |path: &str, access| PodFile {
        path: path.to_owned(),
        access,
    };
    let mut files = Vec::new();
    match &spec.guest {
        GuestBoot::Agent(agent) => {
            files.push(file(&agent.kernel, Access::Read));
            files.push(file(&agent.initrd, Access::Read));
            // The shim connects vhost-device-vsock itself (QEMU inherits the connection).
            if let VsockDevice::VhostUser {
                socket,
                connection: None,
            } = &agent.vsock
            {
                files.push(file(socket, Access::ReadWrite));
            }
        }
        GuestBoot::Image(image) => {
            files.push(file(&image.guest_agent_socket, Access::ReadWrite));
        }
    }
    if let ConsoleTarget::Socket(path) = &spec.console {
        files.push(file(path, Access::ReadWrite));
    }
    files.push(file(&spec.qmp_socket, Access::ReadWrite));
    files
}

/// The profile `name` of a pod's QEMU: the program `qemu`, `/dev/kvm` if `kvm`, signals
/// from `shim_label` (the shim's own label, where it is confined) and `files`.
pub fn profile(
    name: &str,
    qemu: &Path,
    kvm: bool,
    shim_label: Option<&str>,
    files: &[PodFile],
) -> Result<String, Error> {
    let mut node = vec![format!("{} rm,", quoted(qemu)?)];
    node.extend(
        [
            "/usr/share/qemu/** r,",
            "/usr/share/seabios/** r,",
            "/usr/lib/ipxe/qemu/** r,",
            "@{PROC}/sys/vm/max_map_count r,",
            "owner @{PROC}/@{pid}/task/@{tid}/comm rw,",
            "/sys/devices/system/node/ r,",
            "/sys/devices/system/node/node[0-9]*/meminfo r,",
            "/sys/kernel/mm/transparent_hugepage/** r,",
            // The base abstraction's journald sockets: nothing of vmlet's logs there.
            "deny @{run}/systemd/journal/** rw,",
        ]
        .map(str::to_owned),
    );
    if kvm {
        node.push("/dev/kvm rw,".into());
    }
    if let Some(label) = shim_label {
        node.push(format!("signal (receive) peer={},", checked_label(label)?));
    }
    let mut own = Vec::new();
    for file in files {
        own.push(format!(
            "{} {},",
            quoted(Path::new(&file.path))?,
            file.access.as_str()
        ));
    }
    let lines = |rules: &[String]| rules.iter().map(|r| format!("  {r}\n")).collect::<String>();
    Ok(format!(
        "{MARK} (launcher direct), loaded by the shim\n\
         # before QEMU starts and removed from the kernel with the pod.\n\
         \n\
         #include <tunables/global>\n\
         \n\
         profile {name} flags=(attach_disconnected) {{\n  \
         #include <abstractions/base>\n\
         \n  \
         # QEMU, and what it reads of the node.\n\
         {}\n  \
         # This pod's files that QEMU opens by path.\n\
         {}}}\n",
        lines(&node),
        lines(&own)
    ))
}

/// A label AppArmor reads as that one profile's name in a peer condition.
fn checked_label(label: &str) -> Result<&str, Error> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/');
    if !label.is_empty() && label.chars().all(plain) {
        Ok(label)
    } else {
        Err(Error::FailedPrecondition(format!(
            "the shim's AppArmor label {label:?}: not one vmlet can name as the peer that \
             signals QEMU"
        )))
    }
}

/// The shim's own AppArmor label where it is confined (none: unconfined, which the base
/// abstraction lets signal QEMU).
pub fn shim_label() -> Result<Option<String>, Error> {
    let current = std::fs::read_to_string(OWN_APPARMOR_LABEL)
        .or_else(|_| std::fs::read_to_string(OWN_LABEL))
        .map_err(|e| Error::io(format!("read {OWN_LABEL}"), e))?;
    Ok(label_of(&current))
}

/// The AppArmor label of the process `pid` (`NAME (MODE)`), if it can be read.
fn label_of_process(pid: u32) -> Option<String> {
    let read = |attr: &str| std::fs::read_to_string(format!("/proc/{pid}/attr/{attr}"));
    let label = read("apparmor/current").or_else(|_| read("current")).ok()?;
    Some(label.trim_end_matches(['\n', '\0']).to_owned())
}

/// Checks that the process `pid` (QEMU, just started) runs under the profile `name`,
/// enforced: the exec request was only asked for, and a profile in complain mode, or one
/// that did not attach, would leave QEMU unconfined while the shim believed otherwise.
pub fn check_enforced(pid: u32, name: &str) -> Result<(), Error> {
    let expected = format!("{name} (enforce)");
    match label_of_process(pid) {
        Some(label) if label == expected => Ok(()),
        label => Err(Error::FailedPrecondition(format!(
            "QEMU {pid} runs as {label:?}, not under {expected:?}: not run so"
        ))),
    }
}

/// Ends every process running under the profile `name`: only the pod's QEMU can (it is
/// asked for at QEMU's exec, QEMU spawns nothing, and no other process can take another's
/// label), even one the journal does not list (the shim was killed before it recorded
/// it). Each is held by a pidfd, its label read again, then killed and awaited.
fn end_confined(name: &str) -> Result<(), Error> {
    let entries = std::fs::read_dir("/proc").map_err(|e| Error::io("list /proc", e))?;
    let under =
        |pid: u32| label_of_process(pid).and_then(|l| label_of(&l)).as_deref() == Some(name);
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        if !under(pid) {
            continue;
        }
        let Some(pidfd) = crate::host::pidfd::open_if_running(pid)? else {
            continue;
        };
        if !under(pid) {
            continue; // another process has the PID now
        }
        crate::host::pidfd::signal(&pidfd, libc::SIGKILL, "QEMU")?;
        if !crate::host::pidfd::wait_ended(&pidfd, ENDS_WITHIN)? {
            return Err(Error::Timeout(format!(
                "QEMU {pid} under {name} did not end within {} s of SIGKILL: its profile \
                 stays loaded",
                ENDS_WITHIN.as_secs()
            )));
        }
        crate::host::pidfd::reap(&pidfd);
    }
    Ok(())
}

/// The profile of a `/proc/PID/attr/current` line (`NAME (MODE)`), none if unconfined.
fn label_of(current: &str) -> Option<String> {
    let current = current.trim_end_matches(['\n', '\0']);
    let name = match current.rsplit_once(" (") {
        Some((name, _mode)) => name,
        None => current,
    };
    (name != "unconfined").then(|| name.to_owned())
}

/// What a pod's shim may have left in the kernel when its state file is lost: the profile
/// of its QEMU, where AppArmor is on (removing one that is not loaded is no error).
pub fn left_by(pod_id: &str) -> Option<crate::host::undo::Made> {
    (node_lsm() == NodeLsm::AppArmor)
        .then(|| profile_name(pod_id).ok())
        .flatten()
        .map(crate::host::undo::Made::AppArmorProfile)
}

/// Where the kernel lists the loaded profiles (`NAME (MODE)`, one a line).
const PROFILES: &str = "/sys/kernel/security/apparmor/profiles";
/// The most of that list read.
const PROFILES_READ_LIMIT: u64 = 16 << 20;

/// The pods whose QEMU profile is loaded (none where AppArmor is off): what `vmletctl gc`
/// removes when their state directory is gone.
pub fn loaded_pods() -> Result<Vec<String>, Error> {
    use std::io::Read;
    if node_lsm() != NodeLsm::AppArmor {
        return Ok(Vec::new());
    }
    let mut listed = String::new();
    std::fs::File::open(PROFILES)
        .and_then(|f| f.take(PROFILES_READ_LIMIT).read_to_string(&mut listed))
        .map_err(|e| Error::io(format!("read {PROFILES}"), e))?;
    Ok(pods_in(&listed))
}

/// The pod ids of the QEMU profiles in a list of loaded profiles.
fn pods_in(listed: &str) -> Vec<String> {
    listed
        .lines()
        .filter_map(|line| {
            label_of(line)?
                .strip_prefix(PROFILE_PREFIX)
                .map(str::to_owned)
        })
        .filter(|pod| profile_name(pod).is_ok())
        .collect()
}

/// Compiles and loads (or replaces) `text` with the node's `apparmor_parser`, no cache.
pub async fn load(parser: &Path, text: &str) -> Result<(), Error> {
    if !parser.is_file() {
        return Err(Error::FailedPrecondition(format!(
            "AppArmor is on, and helpers.apparmor_parser ({}) is missing: the shim loads each \
             pod's QEMU profile with it (Debian's apparmor package), or use launcher = \
             \"libvirt\"",
            parser.display()
        )));
    }
    let args = ["--replace", "--skip-cache", "--quiet"].map(std::ffi::OsStr::new);
    crate::host::host_command::run_tool_fed(
        &parser.to_string_lossy(),
        &args,
        text.as_bytes().to_vec(),
        LOAD_DEADLINE,
        "(loading the AppArmor profile of the pod's QEMU)",
    )
    .await
}

/// Removes the profile `name` from the kernel, once no process runs under it (the kernel
/// would leave such a process unconfined): every one is ended first ([`end_confined`]). A
/// profile that is not loaded is not an error; a kernel whose policy cannot be reached is.
pub fn unload(name: &str) -> Result<(), Error> {
    if !name.starts_with(PROFILE_PREFIX) {
        return Err(Error::Internal(format!(
            "{name:?}: not a profile of a pod's QEMU, not removing it"
        )));
    }
    end_confined(name)?;
    let mut remove = std::fs::OpenOptions::new()
        .write(true)
        .open(REMOVE)
        .map_err(|e| {
            Error::io(
                format!("remove the AppArmor profile {name}: open {REMOVE}"),
                e,
            )
        })?;
    match remove.write_all(name.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(
            format!("remove the AppArmor profile {name} ({REMOVE})"),
            e,
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Vec<PodFile> {
        let spec = crate::vmm::vm_spec::tests::spec(VsockDevice::VhostUser {
            socket: "/run/vmlet/t1/vhost-vsock.sock".into(),
            connection: Some(9),
        });
        pod_files(&spec)
    }

    #[test]
    fn the_profile_names_qemu_and_the_pods_own_files_only() {
        let paths: Vec<_> = files().into_iter().map(|f| f.path).collect();
        assert_eq!(
            paths,
            ["/img/vmlinuz", "/img/initrd.img", "/run/vmlet/t1/qmp.sock"]
        );
        let name = profile_name("t1").unwrap();
        let text = profile(
            &name,
            Path::new("/usr/bin/qemu-system-x86_64"),
            false,
            None,
            &files(),
        )
        .unwrap();
        assert!(text.starts_with(MARK), "{text}");
        for line in [
            "#include <tunables/global>\n",
            "profile vmlet-qemu-t1 flags=(attach_disconnected) {\n",
            "  #include <abstractions/base>\n",
            "  \"/usr/bin/qemu-system-x86_64\" rm,\n",
            "  \"/img/initrd.img\" r,\n",
            "  \"/run/vmlet/t1/qmp.sock\" rw,\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        assert!(!text.contains("/dev/kvm"), "{text}");
        assert!(!text.contains("signal"), "{text}");
        assert!(text.ends_with("rw,\n}\n"), "{text}");
        let kvm = profile(&name, Path::new("/q"), true, Some("containerd"), &files()).unwrap();
        assert!(kvm.contains("  /dev/kvm rw,\n"), "{kvm}");
        assert!(
            kvm.contains("  signal (receive) peer=containerd,\n"),
            "{kvm}"
        );
    }

    #[test]
    fn what_would_widen_the_profile_is_refused() {
        for id in ["", "a b", "a,b", "a/b", "x{y}", "a\nb", &"x".repeat(201)] {
            assert!(profile_name(id).is_err(), "{id:?}");
        }
        let odd = [PodFile {
            path: "/run/vmlet/*/qmp.sock".into(),
            access: Access::ReadWrite,
        }];
        assert!(profile("vmlet-qemu-t1", Path::new("/q"), false, None, &odd).is_err());
        assert!(profile("vmlet-qemu-t1", Path::new("q"), false, None, &[]).is_err());
        let err = profile("vmlet-qemu-t1", Path::new("/q"), false, Some("a b,"), &[]);
        assert!(err.is_err());
        assert!(
            unload("libvirt-0d5c0e2a").is_err(),
            "only vmlet's are removed"
        );
    }

    #[test]
    fn the_pods_of_loaded_profiles_are_read_from_the_kernels_list() {
        let listed = "vmlet-qemu-p1 (enforce)\nlibvirt-0d5c (enforce)\nvmlet-qemu-a b (complain)\n\
                      /usr/sbin/libvirtd (enforce)\nvmlet-qemu-p2 (complain)\n";
        assert_eq!(pods_in(listed), ["p1", "p2"]);
    }

    #[test]
    fn the_shims_label_is_read_from_its_attribute() {
        assert_eq!(label_of("unconfined\n"), None);
        assert_eq!(
            label_of("containerd (enforce)\n"),
            Some("containerd".into())
        );
        assert_eq!(
            label_of("/usr/bin/x (complain)\0"),
            Some("/usr/bin/x".into())
        );
    }
}
