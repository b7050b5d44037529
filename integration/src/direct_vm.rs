//! A guest VM that QEMU runs directly, without libvirt or the shim, on the kernel and
//! initramfs of a vmlet guest image: the start benchmark's floor, and the template tests,
//! which save one such VM and load it into others. Like the shim, it gives the guest its
//! own agent key through fw_cfg and reaches the agent through its own vhost-device-vsock,
//! and can give it a share through its own virtiofsd.
//! Everything lives in a [`PrivateDir`]; QEMU and the vsock backend are ended, and the
//! directory removed, when the [`DirectVm`] is dropped.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmlet_protocol::agent_ttrpc::AgentClient;
use vmlet_protocol::auth::{AgentKey, FW_CFG_NAME};
use vmlet_protocol::TEMPLATE_PARAM;
use vmlet_shim::devices::qmp::Qmp;
use vmlet_shim::guest::vsock::{new_agent_key, Endpoint, Route};
use vmlet_shim::vm::connect_agent;

use crate::unique_id;

pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";
pub const VSOCK_BACKEND: &str = "/usr/local/bin/vhost-device-vsock";
pub const VIRTIOFSD: &str = "/usr/local/bin/virtiofsd";
/// The id of the root port a vsock device can be hot-plugged into.
pub const HOTPLUG_PORT: &str = "hotplug0";
/// How long QEMU's QMP socket and the vsock backend's socket may take to appear.
const SOCKET_DEADLINE: Duration = Duration::from_secs(10);

/// What a direct VM boots.
pub struct Guest {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Guest {
    /// The kernel and initramfs of the image in `dir` (its manifest names the kernel's file).
    pub fn of_image(dir: &str) -> anyhow::Result<Self> {
        let manifest = vmlet_vm_image::Manifest::load(Path::new(dir))
            .with_context(|| format!("the image in {dir}"))?;
        Ok(Guest {
            kernel: Path::new(dir).join(manifest.kernel_file),
            initrd: Path::new(dir).join("initrd.img"),
        })
    }
}

/// How QEMU is started.
#[derive(Debug, Clone, Copy, Default)]
pub struct Launch {
    /// The guest boots as a template ([`TEMPLATE_PARAM`]), with QEMU's vmgenid device; a
    /// VM that loads a template's state must be started with it too.
    pub template: bool,
    /// The vsock device is there from the start (else it can be plugged into
    /// [`HOTPLUG_PORT`] later).
    pub vsock_at_boot: bool,
    /// QEMU waits for a state to load (`-incoming defer`) instead of booting.
    pub incoming: bool,
    /// The guest has a virtio-fs device served by the VM's own virtiofsd
    /// ([`DirectVm::start_virtiofsd`]) and mounts it as the shim's share.
    pub share: bool,
}

/// A directory of the temporary directory only root may enter (mode 0700), removed with
/// what it holds when dropped.
pub struct PrivateDir(PathBuf);

impl PrivateDir {
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(unique_id(prefix));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("create {}", dir.display()))?;
        Ok(PrivateDir(dir))
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One direct VM: its directory, key, QEMU and vsock backend.
pub struct DirectVm {
    dir: PrivateDir,
    key: AgentKey,
    qemu: Option<Child>,
    vsock: Option<Child>,
    virtiofsd: Option<Child>,
}

impl DirectVm {
    /// A private directory and a new key; nothing runs yet.
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        let dir = PrivateDir::new(prefix)?;
        let key = new_agent_key().map_err(|e| anyhow::anyhow!(e.message()))?;
        std::fs::write(dir.join("agent.key"), key.as_bytes()).context("write the agent key")?;
        Ok(DirectVm {
            dir,
            key,
            qemu: None,
            vsock: None,
            virtiofsd: None,
        })
    }

    pub fn key(&self) -> &AgentKey {
        &self.key
    }

    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// The vhost-user socket QEMU's vsock device connects to.
    pub fn vsock_backend_socket(&self) -> PathBuf {
        self.dir.join("vhost.sock")
    }

    /// The hybrid vsock socket of the guest's agent, reached with `key`.
    pub fn endpoint(&self, key: AgentKey) -> Endpoint {
        Endpoint::new(
            Route::Hybrid {
                uds: self.dir.join("vsock.sock"),
            },
            key,
        )
    }

    /// Starts this VM's vhost-device-vsock and waits for its socket.
    pub async fn start_vsock_backend(&mut self) -> anyhow::Result<()> {
        let socket = self.vsock_backend_socket();
        self.vsock = Some(
            Command::new(VSOCK_BACKEND)
                .arg("--vm")
                .arg(format!(
                    "guest-cid=3,socket={},uds-path={}",
                    socket.display(),
                    self.dir.join("vsock.sock").display()
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start vhost-device-vsock")?,
        );
        wait_for_path(&socket).await
    }

    /// The directory the VM's virtiofsd serves.
    pub fn share_dir(&self) -> PathBuf {
        self.dir.join("share")
    }

    /// The vhost-user socket of the VM's virtiofsd.
    pub fn share_socket(&self) -> PathBuf {
        self.dir.join("virtiofs.sock")
    }

    /// `name` in the VM's private directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Starts this VM's virtiofsd on [`DirectVm::share_dir`] and waits for its socket.
    pub async fn start_virtiofsd(&mut self) -> anyhow::Result<()> {
        let socket = self.share_socket();
        std::fs::create_dir_all(self.share_dir()).context("create the share")?;
        self.virtiofsd = Some(
            Command::new(VIRTIOFSD)
                .arg(format!("--socket-path={}", socket.display()))
                .arg(format!("--shared-dir={}", self.share_dir().display()))
                .arg("--sandbox=none")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start virtiofsd")?,
        );
        wait_for_path(&socket).await
    }

    /// Starts QEMU on `guest` (256 MiB of shared memory, one vCPU, TCG).
    pub fn launch(&mut self, guest: &Guest, how: Launch) -> anyhow::Result<()> {
        let mut qemu = Command::new(QEMU);
        qemu.args([
            "-machine",
            "q35,accel=tcg",
            "-m",
            "256",
            "-smp",
            "1",
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
        ])
        .args([
            "-object",
            "memory-backend-memfd,id=mem,size=256M,share=on",
            "-numa",
            "node,memdev=mem",
        ])
        .arg("-device")
        .arg(format!(
            "pcie-root-port,id={HOTPLUG_PORT},bus=pcie.0,chassis=1"
        ))
        .arg("-serial")
        .arg(format!("file:{}", self.console().display()))
        .arg("-qmp")
        .arg(format!(
            "unix:{},server=on,wait=off",
            self.dir.join("qmp.sock").display()
        ))
        .arg("-fw_cfg")
        .arg(format!(
            "name={FW_CFG_NAME},file={}",
            self.dir.join("agent.key").display()
        ))
        .arg("-kernel")
        .arg(&guest.kernel)
        .arg("-initrd")
        .arg(&guest.initrd);
        let mut cmdline = String::from("console=ttyS0 panic=-1 quiet");
        if how.share {
            qemu.arg("-chardev")
                .arg(format!(
                    "socket,id=fs,path={}",
                    self.dir.join("virtiofs.sock").display()
                ))
                .args(["-device", "vhost-user-fs-pci,chardev=fs,tag=vmlet"]);
            cmdline = format!("{cmdline} vmlet.share=vmlet");
        }
        if how.template {
            qemu.args(["-device", "vmgenid,guid=auto"]);
            cmdline = format!("{cmdline} {TEMPLATE_PARAM}");
        }
        qemu.arg("-append").arg(cmdline);
        if how.vsock_at_boot {
            qemu.arg("-chardev")
                .arg(format!(
                    "socket,id=vs,path={}",
                    self.vsock_backend_socket().display()
                ))
                .args(["-device", "vhost-user-vsock-pci,chardev=vs"]);
        }
        if how.incoming {
            qemu.args(["-incoming", "defer"]);
        }
        self.qemu = Some(
            qemu.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start qemu")?,
        );
        Ok(())
    }

    /// A QMP client of this VM's QEMU.
    pub async fn qmp(&self) -> anyhow::Result<Qmp> {
        let socket = self.dir.join("qmp.sock");
        wait_for_path(&socket).await?;
        let stream = tokio::net::UnixStream::connect(&socket)
            .await
            .with_context(|| format!("connect {}", socket.display()))?;
        Qmp::handshake(stream)
            .await
            .map_err(|e| anyhow::anyhow!(e.message()))
    }

    /// Waits, up to `timeout`, until the console shows `line`.
    pub async fn console_shows(&self, line: &'static str, timeout: Duration) -> anyhow::Result<()> {
        let mut watch = vmlet_shim::guest::console::ReadyWatch::new(&self.console(), line);
        if !watch.wait_until(Instant::now() + timeout).await {
            bail!("the console did not show {line:?} within {timeout:?}");
        }
        Ok(())
    }

    /// Connects to the agent with this VM's key once the console shows it ready, and pings
    /// it; returns the client and the guest's boot id.
    pub async fn agent(&self, timeout: Duration) -> anyhow::Result<(AgentClient, String)> {
        let console = self.console();
        connect_agent(&self.endpoint(self.key.clone()), timeout, Some(&console))
            .await
            .map_err(|e| anyhow::anyhow!(e.message()))
    }

    /// Waits for QEMU to end (after the guest powered off).
    pub async fn wait_qemu(&mut self) -> anyhow::Result<()> {
        if let Some(mut qemu) = self.qemu.take() {
            tokio::task::spawn_blocking(move || qemu.wait())
                .await
                .context("join")?
                .context("wait for qemu")?;
        }
        Ok(())
    }
}

impl Drop for DirectVm {
    fn drop(&mut self) {
        let children = [self.qemu.take(), self.vsock.take(), self.virtiofsd.take()];
        for child in children.into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn wait_for_path(path: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + SOCKET_DEADLINE;
    while !path.exists() {
        if Instant::now() >= deadline {
            bail!(
                "{} did not appear within {SOCKET_DEADLINE:?}",
                path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}
