//! The agent: its key (made for each VM, given to QEMU in a pipe or a file it reads as it
//! starts), its endpoint (the vhost-user socket, or the CID libvirt gave the guest), the first
//! connection (waiting for the guest's console to show the agent listening, and
//! giving up at once when QEMU ends first), and the pod network configured in the guest.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmlet_config::NodeConfig;
use vmlet_protocol::agent::{ConfigureNetworkRequest, NetworkInterface, PingRequest, Route};
use vmlet_protocol::agent_ttrpc::AgentClient;
use vmlet_protocol::AGENT_PORT;

use super::block;
use super::launch::Launched;
use crate::guest::vsock::Endpoint;
use crate::host::pod_paths::PodPaths;
use crate::vmm::vm_spec::VsockDevice;
use crate::vmm::VmManager;
use crate::Error;
use vmlet_protocol::auth::AgentKey;

/// Makes the VM's agent key and gives it to QEMU, which reads it as it starts (`-fw_cfg`,
/// see [`vmlet_protocol::auth`]):
/// - QEMU the shim starts (`direct`) inherits the read end of a pipe that holds the key, its
///   write end closed, the pod's user's, and reads it through `/proc/self/fd/N`: the key is
///   never a file;
/// - libvirt's QEMU, which inherits nothing of the shim's, reads a file made new in the
///   pod's directory, not following a link, readable by the pod's user only, removed once
///   QEMU has read it ([`GivenKey::into_parts`]); a boot that fails before drops it, which
///   removes it too.
pub(super) fn give_key(
    user: &crate::host::pod_user::PodUser,
    paths: &PodPaths,
    direct: bool,
) -> Result<(AgentKey, GivenKey), Error> {
    let key = crate::guest::vsock::new_agent_key()?;
    let given = match direct {
        true => GivenKey::Pipe(key_pipe(user, &key)?),
        false => GivenKey::File(key_file(user, paths, &key)?),
    };
    Ok((key, given))
}

fn key_pipe(user: &crate::host::pod_user::PodUser, key: &AgentKey) -> Result<OwnedFd, Error> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("make the agent key's pipe", e.into()))?;
    // A pipe holds far more than a key: the write does not block.
    nix::unistd::write(&write, key.as_bytes())
        .map_err(|e| Error::io("write the agent key's pipe", e.into()))
        .and_then(|n| match n == key.as_bytes().len() {
            true => Ok(()),
            false => Err(Error::Internal(
                "the agent key's pipe took part of it".into(),
            )),
        })?;
    drop(write);
    // Reopened through /proc, the pipe is checked as a file: the pod's user's, 0400.
    nix::sys::stat::fchmod(&read, nix::sys::stat::Mode::S_IRUSR)
        .map_err(|e| Error::io("chmod the agent key's pipe", e.into()))?;
    nix::unistd::fchown(
        &read,
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(0)),
    )
    .map_err(|e| Error::io("chown the agent key's pipe", e.into()))?;
    Ok(read)
}

fn key_file(
    user: &crate::host::pod_user::PodUser,
    paths: &PodPaths,
    key: &AgentKey,
) -> Result<KeyFile, Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = &paths.agent_key;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    let guard = KeyFile {
        path: path.clone(),
        removed: false,
    };
    file.write_all(key.as_bytes())
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    user.give_file(&file, path)?;
    Ok(guard)
}

/// Where QEMU reads the agent's key ([`give_key`]).
pub(super) enum GivenKey {
    /// The read end of the key's pipe, which the shim's QEMU inherits.
    Pipe(OwnedFd),
    /// The key's file, for libvirt's QEMU.
    File(KeyFile),
}

impl GivenKey {
    /// The path QEMU reads the key from.
    pub(super) fn qemu_path(&self) -> String {
        match self {
            GivenKey::Pipe(fd) => format!("/proc/self/fd/{}", fd.as_raw_fd()),
            GivenKey::File(file) => file.path.to_string_lossy().into_owned(),
        }
    }

    /// The pipe QEMU inherits, and the file to remove once QEMU has started.
    pub(super) fn into_parts(self) -> (Option<OwnedFd>, Option<KeyFile>) {
        match self {
            GivenKey::Pipe(fd) => (Some(fd), None),
            GivenKey::File(file) => (None, Some(file)),
        }
    }
}

/// The key's file in the pod's directory, removed when dropped.
pub(super) struct KeyFile {
    path: std::path::PathBuf,
    removed: bool,
}

impl KeyFile {
    /// Removes the file: QEMU read it when it started (fw_cfg files are read as the
    /// command line is parsed), and nothing else needs it.
    pub(super) fn given(mut self) -> Result<(), Error> {
        self.removed = true;
        std::fs::remove_file(&self.path)
            .map_err(|e| Error::io(format!("remove {}", self.path.display()), e))
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        if !self.removed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Connects to the booting VM's agent, which must prove it holds `key`, within the node's
/// `agent_timeout_secs`; returns the endpoint, the client and the guest's boot id. A
/// failure carries the console's tail.
#[allow(clippy::too_many_arguments)]
pub(super) async fn connect(
    config: &NodeConfig,
    vmm: &Arc<dyn VmManager>,
    pod_id: &str,
    paths: &PodPaths,
    vsock: &VsockDevice,
    launched: &Launched,
    key: AgentKey,
) -> Result<(Endpoint, AgentClient, String), Error> {
    let route = match vsock {
        VsockDevice::VhostUser { .. } => crate::guest::vsock::Route::Hybrid {
            uds: paths.vsock_uds.clone(),
        },
        VsockDevice::Vhost => {
            let (vmm, name) = (vmm.clone(), launched.name.clone());
            let xml = block(move || vmm.live_xml(&name)).await??;
            crate::guest::vsock::Route::Vhost {
                cid: crate::vmm::libvirt_xml::guest_cid(&xml)
                    .ok_or_else(|| Error::Libvirt(format!("{} has no vsock CID", launched.name)))?,
            }
        }
    };
    let endpoint = Endpoint::new(route, key);
    let deadline = Duration::from_secs(config.agent_timeout_secs);
    let mut end = launched.ended.clone();
    let connected = tokio::select! {
        r = connect_agent(&endpoint, deadline, Some(&paths.console)) => r,
        // The guest died while booting (kernel panic, no init): no need to wait on.
        _ = end.wait_for(|ended| *ended) => Err(Error::FailedPrecondition(
            "the VM stopped (QEMU exited) before its agent answered".into(),
        )),
    };
    let (agent, boot_id) = connected.map_err(|e| {
        let message = format!(
            "{}; console tail:\n{}",
            e.message(),
            crate::guest::console::tail(&paths.console)
        );
        match e {
            Error::Timeout(_) => Error::Timeout(message),
            _ => Error::FailedPrecondition(message),
        }
    })?;
    log::info!(
        "pod {pod_id}: agent answered {} ms after start",
        launched.started.elapsed().as_millis()
    );
    Ok((endpoint, agent, boot_id))
}

/// Gives the guest the pod's interfaces (addresses, routes), if it has any.
pub(super) async fn configure_network(
    agent: &AgentClient,
    interfaces: &[vmlet_netns::Interface],
) -> Result<(), Error> {
    if interfaces.is_empty() {
        return Ok(());
    }
    agent
        .configure_network(agent_ctx(), &network_request(interfaces))
        .await
        .map_err(Error::from)?;
    Ok(())
}

fn agent_ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(30_000_000_000)
}

/// The agent's view of the wired interfaces.
fn network_request(interfaces: &[vmlet_netns::Interface]) -> ConfigureNetworkRequest {
    ConfigureNetworkRequest {
        interfaces: interfaces
            .iter()
            .map(|i| NetworkInterface {
                mac: i.mac_string(),
                name: i.name.clone(),
                mtu: i.mtu,
                addresses: i.addresses.iter().map(|a| a.to_string()).collect(),
                routes: i
                    .routes
                    .iter()
                    .map(|r| Route {
                        destination: r.destination.map(|d| d.to_string()).unwrap_or_default(),
                        gateway: r.gateway.map(|g| g.to_string()).unwrap_or_default(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// How long one connection attempt to the agent may take.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// The host's wall clock in ns since the epoch, for the agent to set the guest's from.
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Connects to the agent and pings it (which sets the guest's clock). With `console`, waits
/// first until the guest console shows the agent listening (see
/// [`vmlet_protocol::READY_LINE`]).
pub async fn connect_agent(
    endpoint: &Endpoint,
    timeout: Duration,
    console: Option<&Path>,
) -> Result<(AgentClient, String), Error> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no attempt");
    if let Some(console) = console {
        let mut watch = crate::guest::console::ReadyWatch::new(console, vmlet_protocol::READY_LINE);
        if !watch.wait_until(deadline).await {
            return Err(Error::Timeout(format!(
                "the agent did not report ready on the console within {} s",
                timeout.as_secs()
            )));
        }
    }
    while Instant::now() < deadline {
        // One attempt may hang: vhost-device-vsock can leave a CONNECT made while the guest
        // is still booting without any reply. Bound each attempt, then retry.
        let attempt = tokio::time::timeout(CONNECT_ATTEMPT, endpoint.connect(AGENT_PORT)).await;
        let connected = match attempt {
            Ok(result) => result,
            Err(_) => {
                last = format!("connect: no answer within {CONNECT_ATTEMPT:?}");
                continue;
            }
        };
        match connected {
            Ok(stream) => {
                let client = AgentClient::new(ttrpc::r#async::Client::new(
                    ttrpc::r#async::transport::Socket::new(stream),
                ));
                match client
                    .ping(
                        ttrpc::context::with_timeout(2_000_000_000),
                        &PingRequest {
                            host_realtime_ns: realtime_ns(),
                            ..Default::default()
                        },
                    )
                    .await
                {
                    Ok(pong) => return Ok((client, pong.boot_id)),
                    Err(e) => last = format!("ping: {e}"),
                }
            }
            Err(e) => last = e.message(),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(Error::Timeout(format!(
        "the agent did not answer within {} s (last error: {last})",
        timeout.as_secs()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim's QEMU reads the key from a pipe it inherits, the pod user's, 0400, through
    /// `/proc/self/fd`, and no file is made; libvirt's reads a file of the pod's directory,
    /// removed once given.
    #[test]
    fn the_key_reaches_the_shims_qemu_in_a_pipe_and_libvirts_in_a_file_it_loses() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: the key is given to another user by root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let paths = PodPaths::new(dir.path(), "p");
        std::fs::create_dir_all(&paths.dir).unwrap();
        let user = crate::host::pod_user::PodUser {
            uid: 4242,
            gid: 0,
            groups: Vec::new(),
        };
        let (key, given) = give_key(&user, &paths, true).unwrap();
        let path = given.qemu_path();
        let (pipe, file) = given.into_parts();
        assert!(file.is_none());
        let pipe = pipe.unwrap();
        assert_eq!(path, format!("/proc/self/fd/{}", pipe.as_raw_fd()));
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_fifo());
        assert_eq!((meta.uid(), meta.mode() & 0o777), (4242, 0o400));
        // Root reads what QEMU will: the key, then the end.
        assert_eq!(std::fs::read(&path).unwrap(), key.as_bytes());
        assert!(!paths.agent_key.exists());

        let (key, given) = give_key(&user, &paths, false).unwrap();
        assert_eq!(given.qemu_path(), paths.agent_key.to_string_lossy());
        let meta = std::fs::metadata(&paths.agent_key).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (4242, 0o400));
        assert_eq!(std::fs::read(&paths.agent_key).unwrap(), key.as_bytes());
        let (pipe, file) = given.into_parts();
        assert!(pipe.is_none());
        file.unwrap().given().unwrap();
        assert!(!paths.agent_key.exists());
    }

    /// vhost-device-vsock that accepts CONNECT and never answers (as seen while a guest
    /// boots): the agent connection must give up in time instead of hanging.
    #[tokio::test]
    async fn agent_connect_gives_up_on_an_unanswered_handshake() {
        let dir = std::env::temp_dir().join(format!("vmlet-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uds = dir.join("vsock.sock");
        let listener = tokio::net::UnixListener::bind(&uds).unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let endpoint = Endpoint::new(
            crate::guest::vsock::Route::Hybrid { uds: uds.clone() },
            crate::guest::vsock::new_agent_key().unwrap(),
        );
        let started = Instant::now();
        let result = connect_agent(&endpoint, Duration::from_secs(3), None).await;
        let took = started.elapsed();
        server.abort();
        std::fs::remove_dir_all(&dir).unwrap();
        let err = result.err().expect("no agent answered");
        assert!(took < Duration::from_secs(6), "gave up after {took:?}");
        assert!(err.message().contains("no answer"), "{}", err.message());
    }
}
