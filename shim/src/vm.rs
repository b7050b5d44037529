//! One pod's VM: state directory, shared directory, vsock backend, libvirt domain, agent.
//! Everything created is recorded in [`PodState`] first and removed by [`teardown`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use containerd_shim_protos::api::Mount as RootfsMount;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use vmlet_config::{Accel, NodeConfig, VmShape, VsockTransport};
use vmlet_protocol::agent::{PingRequest, ShutdownRequest};
use vmlet_protocol::agent_ttrpc::AgentClient;
use vmlet_protocol::AGENT_PORT;

use crate::domain::{Domain, DomainParams, VsockDevice};
use crate::state::PodState;
use crate::vmm::VmManager;
use crate::vsock::{self, Endpoint};
use crate::Error;

/// virtio-fs tag of the shared directory.
const SHARE_TAG: &str = "vmlet";
/// How long teardown waits for the guest to power itself off.
const POWER_OFF_WAIT: Duration = Duration::from_secs(2);
/// How much of the console log an agent timeout error carries.
const CONSOLE_TAIL: usize = 2048;

pub fn domain_name(pod_id: &str) -> String {
    format!("vmlet-{pod_id}")
}

/// The paths of one pod's state directory.
#[derive(Debug, Clone)]
pub struct PodPaths {
    pub dir: PathBuf,
    pub share: PathBuf,
    pub vhost_socket: PathBuf,
    pub vsock_uds: PathBuf,
    pub console: PathBuf,
    pub vsock_log: PathBuf,
}

impl PodPaths {
    pub fn new(state_dir: &Path, pod_id: &str) -> Self {
        let dir = state_dir.join(pod_id);
        Self {
            share: dir.join("share"),
            vhost_socket: dir.join("vhost-vsock.sock"),
            vsock_uds: dir.join("vsock.sock"),
            console: dir.join("console.log"),
            vsock_log: dir.join("vhost-device-vsock.log"),
            dir,
        }
    }
}

/// A booted VM with its agent connected.
pub struct Vm {
    pub pod_id: String,
    pub paths: PodPaths,
    pub endpoint: Endpoint,
    pub agent: AgentClient,
    pub boot_id: String,
    state: Mutex<PodState>,
    vmm: Arc<dyn VmManager>,
}

/// Where the container's rootfs comes from.
pub enum RootfsSource {
    /// Mounts from containerd's CreateTask request (usually one overlay).
    Mounts(Vec<RootfsMount>),
    /// A directory already prepared in the bundle.
    Dir(PathBuf),
}

/// Runs a blocking call (libvirt, mounts) off the async executor.
async fn block<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task: {e}")))
}

impl Vm {
    /// Boots the pod's VM with one container's rootfs in the share. On failure everything
    /// created so far is removed before the error is returned.
    pub async fn boot(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        pod_id: &str,
        container_id: &str,
        shape: VmShape,
        rootfs: RootfsSource,
    ) -> Result<Vm, Error> {
        let paths = PodPaths::new(&config.state_dir, pod_id);
        if paths.dir.exists() {
            return Err(Error::AlreadyExists(format!(
                "pod state {}",
                paths.dir.display()
            )));
        }
        std::fs::create_dir_all(&paths.share)
            .map_err(|e| Error::io(format!("create {}", paths.share.display()), e))?;
        let state = PodState {
            dir: paths.dir.clone(),
            ..Default::default()
        };
        let state = Arc::new(Mutex::new(state));
        let result = Self::boot_steps(
            config,
            vmm.clone(),
            pod_id,
            container_id,
            shape,
            rootfs,
            &paths,
            state.clone(),
        )
        .await;
        match result {
            Ok((endpoint, agent, boot_id)) => Ok(Vm {
                pod_id: pod_id.into(),
                paths,
                endpoint,
                agent,
                boot_id,
                state: Mutex::new(state.lock().unwrap().clone()),
                vmm,
            }),
            Err(e) => {
                let state = state.lock().unwrap().clone();
                if let Ok(Err(cleanup)) = block(move || teardown(&*vmm, &state)).await {
                    log::error!(
                        "cleanup after failed boot of {pod_id}: {}",
                        cleanup.message()
                    );
                }
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn boot_steps(
        config: &NodeConfig,
        vmm: Arc<dyn VmManager>,
        pod_id: &str,
        container_id: &str,
        shape: VmShape,
        rootfs: RootfsSource,
        paths: &PodPaths,
        state: Arc<Mutex<PodState>>,
    ) -> Result<(Endpoint, AgentClient, String), Error> {
        let save = |f: &dyn Fn(&mut PodState)| -> Result<(), Error> {
            let mut s = state.lock().unwrap();
            f(&mut s);
            s.save()
        };
        save(&|_| {})?;
        std::fs::set_permissions(&paths.dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io("chmod pod dir", e))?;

        let target = paths.share.join(crate::spec::rootfs_in_share(container_id));
        std::fs::create_dir_all(&target)
            .map_err(|e| Error::io(format!("create {}", target.display()), e))?;
        save(&|s| s.mounts.push(target.clone()))?;
        mount_rootfs(&rootfs, &target)?;

        let transport = match config.vsock {
            VsockTransport::Auto if Path::new("/dev/vhost-vsock").exists() => VsockTransport::Vhost,
            VsockTransport::Auto => VsockTransport::VhostUser,
            other => other,
        };
        let vsock_device = match transport {
            VsockTransport::VhostUser => {
                let (binary, socket, uds, log) = (
                    config.helpers.vhost_device_vsock.clone(),
                    paths.vhost_socket.clone(),
                    paths.vsock_uds.clone(),
                    paths.vsock_log.clone(),
                );
                let pid =
                    block(move || vsock::start_vhost_device_vsock(&binary, &socket, &uds, &log))
                        .await??;
                save(&|s| s.vsock_pid = Some(pid))?;
                chown_to_user(&paths.vhost_socket, &config.qemu_user)?;
                VsockDevice::VhostUser {
                    socket: paths.vhost_socket.to_string_lossy().into_owned(),
                }
            }
            _ => VsockDevice::Vhost,
        };

        let kvm = match config.accel {
            Accel::Kvm => true,
            Accel::Tcg => false,
            Accel::Auto => {
                let (vmm, qemu, machine) = (
                    vmm.clone(),
                    config.helpers.qemu.to_string_lossy().into_owned(),
                    config.guest.machine.clone(),
                );
                Path::new("/dev/kvm").exists()
                    && block(move || vmm.kvm_usable(&qemu, &machine)).await?
            }
        };
        let name = domain_name(pod_id);
        let params = DomainParams {
            name: name.clone(),
            pod_id: pod_id.into(),
            kvm,
            vcpus: shape.vcpus,
            memory_mib: shape.memory_mib,
            machine: config.guest.machine.clone(),
            kernel: config.guest.kernel.to_string_lossy().into_owned(),
            initrd: config.guest.initrd.to_string_lossy().into_owned(),
            cmdline: format!(
                "console=ttyS0 panic=-1 quiet vmlet.share={SHARE_TAG} {}",
                config.guest.kernel_params
            )
            .trim_end()
            .to_owned(),
            emulator: config.helpers.vmwrapper.to_string_lossy().into_owned(),
            qemu: config.helpers.qemu.to_string_lossy().into_owned(),
            virtiofsd: config.helpers.virtiofsd.to_string_lossy().into_owned(),
            share_dir: paths.share.to_string_lossy().into_owned(),
            share_tag: SHARE_TAG.into(),
            console_log: paths.console.to_string_lossy().into_owned(),
            vsock: vsock_device.clone(),
        };
        let xml = Domain::new(&params).to_xml()?;
        log::info!(
            "pod {pod_id}: starting {name} ({} vCPU, {} MiB, {})",
            shape.vcpus,
            shape.memory_mib,
            if kvm { "kvm" } else { "tcg" }
        );
        save(&|s| s.domain = Some(name.clone()))?;
        let started = Instant::now();
        {
            let vmm = vmm.clone();
            block(move || vmm.start(&xml)).await??;
        }
        log::info!(
            "pod {pod_id}: domain started in {} ms",
            started.elapsed().as_millis()
        );
        let endpoint = match vsock_device {
            VsockDevice::VhostUser { .. } => Endpoint::Hybrid {
                uds: paths.vsock_uds.clone(),
            },
            VsockDevice::Vhost => {
                let vmm = vmm.clone();
                let n = name.clone();
                let xml = block(move || vmm.live_xml(&n)).await??;
                Endpoint::Vhost {
                    cid: guest_cid(&xml)
                        .ok_or_else(|| Error::Libvirt(format!("{name} has no vsock CID")))?,
                }
            }
        };
        let deadline = Duration::from_secs(config.agent_timeout_secs);
        let (agent, boot_id) = connect_agent(&endpoint, deadline).await.map_err(|e| {
            Error::Timeout(format!(
                "{}; console tail:\n{}",
                e.message(),
                console_tail(&paths.console)
            ))
        })?;
        log::info!(
            "pod {pod_id}: agent answered {} ms after start",
            started.elapsed().as_millis()
        );
        Ok((endpoint, agent, boot_id))
    }

    /// Stops the VM and removes everything the pod created. The guest is asked to power
    /// itself off first: that is faster than libvirt's destroy (SIGTERM, then waiting for
    /// QEMU), which remains the fallback.
    pub async fn teardown(&self) -> Result<(), Error> {
        let started = Instant::now();
        let name = domain_name(&self.pod_id);
        let asked = tokio::time::timeout(
            POWER_OFF_WAIT,
            self.agent.shutdown(
                ttrpc::context::with_timeout(1_000_000_000),
                &ShutdownRequest::default(),
            ),
        )
        .await;
        if matches!(asked, Ok(Ok(_))) {
            let deadline = Instant::now() + POWER_OFF_WAIT;
            while Instant::now() < deadline {
                let (vmm, n) = (self.vmm.clone(), name.clone());
                if !block(move || vmm.is_active(&n)).await?.unwrap_or(true) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let state = self.state.lock().unwrap().clone();
        let vmm = self.vmm.clone();
        let result = block(move || teardown(&*vmm, &state)).await?;
        log::info!(
            "pod {}: torn down in {} ms",
            self.pod_id,
            started.elapsed().as_millis()
        );
        result
    }
}

fn mount_rootfs(rootfs: &RootfsSource, target: &Path) -> Result<(), Error> {
    match rootfs {
        RootfsSource::Dir(dir) => mount(
            Some(dir),
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| Error::io(format!("bind {} to the share", dir.display()), e.into())),
        RootfsSource::Mounts(mounts) => {
            if mounts.len() != 1 {
                return Err(Error::Unimplemented(format!(
                    "a rootfs of {} mounts",
                    mounts.len()
                )));
            }
            let m = &mounts[0];
            containerd_shim::mount::mount_rootfs(
                Some(m.type_.as_str()),
                Some(m.source.as_str()),
                &m.options,
                target,
            )
            .map_err(|e| Error::Internal(format!("mount rootfs: {e}")))
        }
    }
}

fn chown_to_user(path: &Path, user: &str) -> Result<(), Error> {
    let user = nix::unistd::User::from_name(user)
        .map_err(|e| Error::io(format!("look up user {user}"), e.into()))?
        .ok_or_else(|| {
            Error::Config(vmlet_config::Error::InvalidConfig {
                key: "qemu_user",
                reason: format!("no user {user} on this host"),
            })
        })?;
    nix::unistd::chown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| Error::io(format!("chown {}", path.display()), e.into()))
}

/// The guest CID libvirt assigned (`<cid auto='yes' address='N'/>` in the live XML).
fn guest_cid(xml: &str) -> Option<u32> {
    let cid = xml.split("<cid ").nth(1)?.split("/>").next()?;
    let address = cid.split("address=").nth(1)?;
    address
        .trim_matches(|c| c == '\'' || c == '"' || c == ' ')
        .split(['\'', '"'])
        .next()?
        .parse()
        .ok()
}

fn console_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(CONSOLE_TAIL);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

/// Connects to the agent and pings it until it answers or `timeout` passes.
pub async fn connect_agent(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<(AgentClient, String), Error> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        match endpoint.connect(AGENT_PORT).await {
            Ok(stream) => {
                let client = AgentClient::new(ttrpc::r#async::Client::new(
                    ttrpc::r#async::transport::Socket::new(stream),
                ));
                match client
                    .ping(
                        ttrpc::context::with_timeout(2_000_000_000),
                        &PingRequest::default(),
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

/// Removes what `state` lists: domain, vsock backend, mounts, then the directory. Goes on
/// past failures and reports the first.
pub fn teardown(vmm: &dyn VmManager, state: &PodState) -> Result<(), Error> {
    let mut first: Option<Error> = None;
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            log::warn!("teardown: {}", e.message());
            first.get_or_insert(e);
        }
    };
    if let Some(domain) = &state.domain {
        note(vmm.remove(domain));
    }
    if let Some(pid) = state.vsock_pid {
        if is_vhost_device_vsock(pid) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
    for target in state.mounts.iter().rev() {
        note(unmount(target));
    }
    if state.dir.exists() {
        note(
            std::fs::remove_dir_all(&state.dir)
                .map_err(|e| Error::io(format!("remove {}", state.dir.display()), e)),
        );
    }
    first.map_or(Ok(()), Err)
}

/// Guards against killing a recycled PID.
fn is_vhost_device_vsock(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .map(|c| c.contains("vhost-device-vsock"))
        .unwrap_or(false)
}

fn unmount(target: &Path) -> Result<(), Error> {
    // Mounts may stack; detach until the path is no longer a mount point.
    for _ in 0..8 {
        match umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(Error::io(format!("unmount {}", target.display()), e.into())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cid_from_live_xml() {
        assert_eq!(
            guest_cid("<vsock model='virtio'>\n<cid auto='yes' address='7'/>"),
            Some(7)
        );
        assert_eq!(guest_cid("<vsock/>"), None);
    }

    #[test]
    fn teardown_removes_domain_and_dir() {
        let dir = std::env::temp_dir().join(format!("vmlet-teardown-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("share")).unwrap();
        let vmm = crate::vmm::FakeVmm::default();
        vmm.start("<name>vmlet-p</name>").unwrap();
        let state = PodState {
            dir: dir.clone(),
            domain: Some("vmlet-p".into()),
            vsock_pid: None,
            mounts: vec![],
        };
        teardown(&vmm, &state).unwrap();
        assert!(vmm.running.lock().unwrap().is_empty());
        assert!(!dir.exists());
    }
}
