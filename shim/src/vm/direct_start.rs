//! The pod's VM started by the shim itself (`launcher = "direct"`), without libvirt: the
//! pod's virtiofsd ([`super::pod_virtiofsd`]; a VM image has one for its volumes only), then
//! QEMU with vmlet's own command line ([`crate::vmm::qemu_command`]) as the pod's own user,
//! in the pod's cgroup ([`crate::host::qemu_process`]), its console file, taps, connection
//! to virtiofsd (which the shim made), the agent key's pipe and a VM image's disks and flash
//! ([`super::direct_image`]) handed over as descriptors.
//! Each is recorded in the journal as soon as it runs (`Made::Process`, `Made::Qemu`); the
//! returned handle kills QEMU if it is dropped before the pod's teardown.
//!
//! On a node where AppArmor is on, QEMU runs under a profile of the pod's own, which the shim
//! loads first ([`crate::host::qemu_apparmor`]), as libvirt gives each VM one. Not on a node
//! with SELinux enforcing: libvirt labels each VM there (sVirt), and vmlet has no labels of
//! its own for QEMU, so a pod there is refused rather than run unconfined. What libvirt adds
//! elsewhere and this launcher does not: a device cgroup filter. QEMU has a view of its own
//! ([`crate::host::qemu_view`]): a `/dev` of the nodes it opens, and the state directory
//! holding its pod's directory alone.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use vmlet_config::NodeConfig;

use super::{helper_log, BootRequest, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::qemu_apparmor::{self, NodeLsm};
use crate::host::qemu_process::{self, Confinement, QemuProcess};
use crate::host::qemu_view::MountView;
use crate::host::undo::Made;
use crate::vmm::qemu_command::{qemu_command, Launched};
use crate::vmm::vm_spec::{ConsoleTarget, GuestBoot, VmSpec};
use crate::Error;

/// Starts the pod's virtiofsd and then QEMU for `spec`, QEMU on `tap_fds` (the NICs'
/// taps in `spec`'s order) and `made` (what else of the shim's `spec` names by descriptor:
/// the pipe vmlet's guest's key is read from, `spec`'s `key_file`, and the vsock backend's
/// connection).
pub(super) async fn start(
    config: &NodeConfig,
    req: &BootRequest,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    spec: &VmSpec,
    tap_fds: Vec<OwnedFd>,
    made: Vec<OwnedFd>,
) -> Result<QemuProcess, Error> {
    let apparmor_profile = match qemu_apparmor::node_lsm() {
        NodeLsm::SelinuxEnforcing => {
            return Err(Error::FailedPrecondition(format!(
                "pod {}: launcher = \"direct\" on a node with SELinux enforcing: vmlet has \
                 no SELinux labels of its own for QEMU, and QEMU is not run unconfined; use \
                 launcher = \"libvirt\" on this node",
                req.pod_id
            )))
        }
        NodeLsm::AppArmor => Some(load_profile(config, rec, spec).await?),
        NodeLsm::None => None,
    };
    let cgroup_procs = || crate::host::pod_cgroup::procs_files_of(req.cgroup.as_ref());
    let mut inherit: Vec<OwnedFd> = Vec::new();
    let share = match spec.guest.share() {
        Some(share) => Some(
            super::pod_virtiofsd::start(
                config,
                paths,
                rec,
                share,
                cgroup_procs()?,
                super::pod_virtiofsd::Client::Shim,
            )?
            .ok_or_else(|| Error::Internal("virtiofsd: no connection for QEMU".into()))?,
        ),
        None => None,
    };
    // A VM image's console is a socket QEMU connects; vmlet's guest's a file.
    let console = match &spec.console {
        ConsoleTarget::File(_) => Some(append_only(&paths.console)?),
        ConsoleTarget::Socket(_) => None,
    };
    let image = match &spec.guest {
        GuestBoot::Image(image) => {
            let (fds, files) = super::direct_image::open(image, &spec.machine, paths)?;
            inherit.extend(files);
            Some(fds)
        }
        GuestBoot::Agent(_) => None,
    };
    let launched = Launched {
        uuid: random_uuid()?,
        share_fd: share.as_ref().map(AsRawFd::as_raw_fd),
        console_fd: console.as_ref().map(AsRawFd::as_raw_fd),
        tap_fds: tap_fds.iter().map(AsRawFd::as_raw_fd).collect(),
        image,
    };
    let args = qemu_command(spec, &launched)?;
    inherit.extend(console.map(OwnedFd::from));
    inherit.extend(share);
    inherit.extend(tap_fds);
    inherit.extend(made);
    let qemu = qemu_process::spawn(
        Path::new(&spec.qemu),
        &args,
        inherit,
        Confinement {
            uid: spec.user.uid,
            gid: spec.user.gid,
            groups: spec.user.groups.clone(),
            cgroup_procs: cgroup_procs()?,
            apparmor_profile: apparmor_profile.clone(),
            view: Some(MountView::new(&config.state_dir, &paths.dir, spec.kvm)?),
        },
        helper_log::create(&paths.qemu_log)?,
    )
    .map_err(|e| {
        e.within(&format!(
            "start QEMU ({})",
            helper_log::tail(&paths.qemu_log)
        ))
    })?;
    let process = qemu
        .id()
        .ok_or_else(|| helper_log::ended(&paths.qemu_log, "QEMU"))?;
    rec.record(Made::Qemu(process))?;
    if let Some(name) = &apparmor_profile {
        qemu_apparmor::check_enforced(qemu.pid, name)?;
    }
    Ok(qemu)
}

/// Loads the profile of the pod's QEMU (recorded first, so that the teardown removes it
/// whatever happens next) and says its name.
async fn load_profile(
    config: &NodeConfig,
    rec: &Recorder<'_>,
    spec: &VmSpec,
) -> Result<String, Error> {
    let name = qemu_apparmor::profile_name(&spec.pod_id)?;
    let qemu = std::fs::canonicalize(&spec.qemu)
        .map_err(|e| Error::io(format!("resolve QEMU's path {}", spec.qemu), e))?;
    let text = qemu_apparmor::profile(
        &name,
        &qemu,
        spec.kvm,
        qemu_apparmor::shim_label()?.as_deref(),
        &qemu_apparmor::pod_files(spec),
    )?;
    rec.record(Made::AppArmorProfile(name.clone()))?;
    qemu_apparmor::load(&config.helpers.apparmor_parser, &text)
        .await
        .map_err(|e| e.within(&format!("pod {}: its QEMU's AppArmor profile", spec.pod_id)))?;
    Ok(name)
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
}
