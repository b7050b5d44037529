//! The pod's virtiofsd, which the shim starts under either launcher
//! ([`crate::host::virtiofsd`]: as root, sandboxing itself, in the pod's cgroup from its
//! exec), recorded in the journal as soon as it runs (`Made::Process`), on a socket no other
//! pod reaches. virtiofsd serves the first connection to its socket and no other, so who
//! may connect first is the point:
//! - QEMU the shim starts is handed a connection the shim made itself: the socket stays
//!   root's ([`Client::Shim`]);
//! - QEMU libvirt starts connects by path (the domain's `<source socket>`): the socket is
//!   the pod's own user's, 0600 ([`Client::Qemu`]). libvirt's own virtiofsd would serve on
//!   a socket its group may connect, and every pod's QEMU has that group (`kvm`).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use vmlet_config::NodeConfig;

use super::{helper_log, Recorder};
use crate::host::pod_paths::PodPaths;
use crate::host::pod_user::PodUser;
use crate::vmm::vm_spec::Share;
use crate::Error;

/// Who connects the pod's virtiofsd.
pub(super) enum Client<'a> {
    /// The shim, for QEMU it starts itself: the connection is returned.
    Shim,
    /// The pod's QEMU, running as this user, by the socket's path.
    Qemu(&'a PodUser),
}

/// Starts the pod's virtiofsd exporting `share.dir` on `share.socket`, in the cgroups whose
/// `cgroup.procs` are `cgroup_procs`; returns the shim's connection for [`Client::Shim`].
pub(super) fn start(
    config: &NodeConfig,
    paths: &PodPaths,
    rec: &Recorder<'_>,
    share: Share<'_>,
    cgroup_procs: Vec<File>,
    client: Client<'_>,
) -> Result<Option<OwnedFd>, Error> {
    let socket = Path::new(share.socket);
    let listener = UnixListener::bind(socket)
        .map_err(|e| Error::io(format!("bind {}", socket.display()), e))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod {}", socket.display()), e))?;
    let connection = match client {
        // Queued on the listening socket now, taken by virtiofsd when it runs.
        Client::Shim => {
            Some(OwnedFd::from(UnixStream::connect(socket).map_err(|e| {
                Error::io(format!("connect {}", socket.display()), e)
            })?))
        }
        Client::Qemu(user) => {
            user.give_private(socket)?;
            None
        }
    };
    let pid = crate::host::virtiofsd::spawn(
        &config.helpers.virtiofsd,
        Path::new(share.dir),
        listener,
        cgroup_procs,
        helper_log::create(&paths.virtiofsd_log)?,
    )?;
    rec.record_helper(pid, "virtiofsd", &paths.virtiofsd_log)?;
    Ok(connection)
}
