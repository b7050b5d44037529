//! A pod's boot from a template (`templates.enabled`): the pod's own domain, started with
//! a [`TemplateRole`], either loads the saved guest of its VM shape, or (the first pod of
//! the shape) boots as a template, is saved, and goes on. Either way the pod's vsock device
//! is plugged in after that, and its NICs before it (on the pod's taps, with the pod's
//! MACs), and the agent only then reads the pod's key and mounts its share (docs/design.md,
//! "Guest").
//!
//! Only vmlet's guest on vhost-user vsock starts this way; other pods, and
//! pods whose shape the template directory has no room for ([`crate::host::templates`]),
//! boot cold.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmlet_config::NodeConfig;

use crate::devices::identity::{self, VsockBackend};
use crate::devices::qmp::Qmp;
use crate::devices::snapshot::{self, Loaded};
use crate::host::taps::TapDescription;
use crate::host::templates::{key, Limits, Reserved, TemplateStore};
use crate::vmm::vm_spec::{nic_port, GuestBoot, TemplateRole, VmSpec, VSOCK_PORT};
use crate::Error;

/// How long a save or a load may take (each takes well under a second under TCG).
const SAVE_OR_LOAD: Duration = Duration::from_secs(60);
/// The room counted for a saved state beside the guest's RAM (mapped-ram's header and
/// bitmaps, the devices' state).
const STATE_OVERHEAD: u64 = 16 << 20;

/// What the boot does with its shape's template, the vsock backend's socket its device is
/// plugged in with afterwards, and the NICs plugged in before that (each on its tap).
pub(super) struct TemplateStart {
    key: String,
    vsock: VsockBackend,
    nics: Vec<(TapDescription, OwnedFd)>,
    action: Action,
}

enum Action {
    /// Boot as a template and save it (this shim reserved the shape's file).
    Save {
        reserved: Reserved,
        store: TemplateStore,
    },
    /// Load the saved guest.
    Load { file: File, store: TemplateStore },
}

/// The template start `spec` gets, if any: none when templates are off or the pod cannot
/// start that way, a load when its shape has a saved guest, a save when the directory has
/// room for one and no other shim is saving it.
pub(super) async fn choose(
    config: &NodeConfig,
    spec: &VmSpec,
    direct: bool,
) -> Result<Option<TemplateStart>, Error> {
    if !config.templates.enabled {
        return Ok(None);
    }
    let Some(vsock) = spec
        .vhost_user_vsock()
        .map(|socket| VsockBackend::Socket(PathBuf::from(socket)))
    else {
        log::info!("pod {}: boots cold: {}", spec.pod_id, why_cold(spec));
        return Ok(None);
    };
    let store = TemplateStore::new(
        &config.templates.dir,
        Limits {
            max_count: config.templates.max_count as usize,
            max_bytes: config.templates.max_mib.saturating_mul(1 << 20),
        },
    );
    let description = describe(spec, direct)?;
    let key = key(&description);
    log::debug!("pod {}: template {key} is of {description:?}", spec.pod_id);
    if let Some(file) = store.open(&key)? {
        let action = Action::Load { file, store };
        return Ok(Some(TemplateStart {
            key,
            vsock,
            nics: Vec::new(),
            action,
        }));
    }
    // The guest's RAM: a template never has memory plugged into its virtio-mem region
    // (only a container's limit plugs it), which the save skips.
    let size = (spec.memory_mib << 20) + STATE_OVERHEAD;
    Ok(store
        .reserve(&key, size)
        .await?
        .map(|reserved| TemplateStart {
            key,
            vsock,
            nics: Vec::new(),
            action: Action::Save { reserved, store },
        }))
}

/// Why a pod not of vmlet's guest on vhost-user vsock does not start from a template.
fn why_cold(spec: &VmSpec) -> &'static str {
    match &spec.guest {
        GuestBoot::Image(_) => "a VM image boots its own guest, never a template",
        GuestBoot::Agent(_) => {
            "template starts need the vhost-user vsock transport, and this node's vsock is \
             the kernel's /dev/vhost-vsock (node config `vsock = \"vhost-user\"`)"
        }
    }
}

/// Everything a saved guest depends on, one item a line: the shape, the machine, the
/// guest's command line, where each device sits (the NICs' ports too: how many, where), the
/// host's boot, and the identity of the kernel, initramfs, QEMU, wrapper and virtiofsd files
/// (their size, inode and modification time: a replaced file is another guest; not the
/// change time, which libvirt's ownership changes move at every start), and whether the
/// shim starts QEMU itself (`direct`: another command line and virtiofsd than libvirt's).
fn describe(spec: &VmSpec, direct: bool) -> Result<String, Error> {
    let GuestBoot::Agent(agent) = &spec.guest else {
        return Err(Error::Internal("a template of a VM image".into()));
    };
    Ok(format!(
        "vmlet {}\nvcpus {}\nmemory {} MiB\nhotplug {} MiB\nmachine {}\ncpu {:?}\nkvm {}\n\
         tcg cache {:?}\nfree page reporting {}\nslots {:?}\nnic slots {:?}\ncmdline {}\n\
         kernel {}\ninitrd {}\nqemu {}\nemulator {}\nvirtiofsd {}\nhost boot {}\n\
         launcher {}\n",
        env!("CARGO_PKG_VERSION"),
        spec.vcpus,
        spec.memory_mib,
        spec.hotplug_mib,
        spec.machine,
        spec.cpu_model,
        spec.kvm,
        spec.tcg_translation_cache_mib,
        spec.free_page_reporting,
        spec.slots,
        spec.taps().iter().map(|t| t.slot).collect::<Vec<_>>(),
        spec.kernel_cmdline().unwrap_or_default(),
        file_identity(&agent.kernel)?,
        file_identity(&agent.initrd)?,
        file_identity(&spec.qemu)?,
        file_identity(&spec.emulator)?,
        file_identity(&agent.virtiofsd)?,
        host_boot()?,
        if direct { "direct" } else { "libvirt" },
    ))
}

/// The host's boot id: a template saved before the host's last boot (its kernel, microcode
/// or CPU may have changed) is never loaded.
fn host_boot() -> Result<String, Error> {
    let path = "/proc/sys/kernel/random/boot_id";
    std::fs::read_to_string(path)
        .map(|id| id.trim().to_owned())
        .map_err(|e| Error::io(format!("read {path}"), e))
}

fn file_identity(path: &str) -> Result<String, Error> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| Error::io(format!("stat {path}"), e))?;
    Ok(format!(
        "{path} {} bytes, dev {} ino {}, modified {}.{:09}",
        meta.len(),
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

impl TemplateStart {
    pub fn role(&self) -> TemplateRole {
        match self.action {
            Action::Save { .. } => TemplateRole::Save,
            Action::Load { .. } => TemplateRole::Load,
        }
    }

    /// Has the pod's vsock device served by the shim's `connection` to its backend (QEMU
    /// the shim started), not by QEMU's own connection to the backend's socket.
    pub fn hand_vsock_connection(&mut self, connection: OwnedFd) {
        self.vsock = VsockBackend::Connection(connection);
    }

    /// Has the pod's NICs (each with its tap's fd) plugged in after the load.
    pub fn plug_nics(&mut self, nics: Vec<(TapDescription, OwnedFd)>) {
        self.nics = nics;
    }

    /// After the domain started: saves or loads the guest, then plugs the pod's NICs and
    /// its vsock device in (the NICs first: they are probed by the time the agent, which
    /// waits for the vsock device, is asked to configure them). A save that fails leaves no
    /// template and the pod goes on; a load that fails fails the boot, and so does a
    /// device that cannot be plugged in after a save or a load. Where QEMU refused or ended
    /// ([`blames_the_template`]), that saved guest is discarded (the shape's next pod boots
    /// cold and saves a new one), so that a template no pod can be made its own from is not
    /// loaded again and again; a passed deadline leaves it. Returns the template the pod now
    /// runs from (none where a save failed), for [`Used::discard`] should the pod's agent
    /// never answer.
    pub async fn finish(
        self,
        qmp: &Qmp,
        pod_id: &str,
        console: &Path,
        ready_within: Duration,
    ) -> Result<Option<Used>, Error> {
        let TemplateStart {
            key,
            vsock,
            nics,
            action,
        } = self;
        let (store, file) = match action {
            Action::Save { reserved, store } => {
                wait_for_template(console, ready_within).await?;
                let saved = save(qmp, reserved, pod_id, &key).await;
                qmp.execute("cont", serde_json::json!({}), Vec::new())
                    .await?;
                (store, saved)
            }
            Action::Load { file, store } => {
                let dup = file
                    .try_clone()
                    .map_err(|e| Error::io(format!("dup template {key}"), e))?;
                match snapshot::load(qmp, dup.into(), SAVE_OR_LOAD).await {
                    Ok(Loaded::Running) => log::info!("pod {pod_id}: loaded template {key}"),
                    Ok(Loaded::Refused(reason)) => {
                        let discarded = discard(&store, &key, &file, pod_id).await;
                        return Err(Error::Internal(format!(
                            "QEMU refused template {key}, {discarded}: {reason}"
                        )));
                    }
                    Err(e) if blames_the_template(&e) => {
                        let discarded = discard(&store, &key, &file, pod_id).await;
                        return Err(e.within(&format!(
                            "QEMU ended or refused loading template {key}, {discarded}"
                        )));
                    }
                    Err(e) => return Err(e),
                }
                (store, Some(file))
            }
        };
        match (plug_devices(qmp, nics, vsock).await, file) {
            (Ok(()), file) => Ok(file.map(|file| Used { store, key, file })),
            (Err(e), Some(file)) if blames_the_template(&e) => {
                let discarded = discard(&store, &key, &file, pod_id).await;
                Err(e.within(&format!(
                    "the pod's devices could not be plugged in after template {key}, {discarded}"
                )))
            }
            (Err(e), _) => Err(e),
        }
    }
}

/// The template a pod was saved from or loaded.
#[derive(Debug)]
pub(super) struct Used {
    store: TemplateStore,
    key: String,
    file: File,
}

impl Used {
    /// Discards the template, whose pod's agent never answered (a template no pod can be
    /// made its own from must not be loaded again, nor kept fresh by each pod that loads
    /// it); says how that went, for the pod's error.
    pub async fn discard(self, pod_id: &str) -> String {
        let Used { store, key, file } = self;
        format!(
            "the pod ran from template {key}, {}",
            discard(&store, &key, &file, pod_id).await
        )
    }
}

/// Saves the template guest, ready to be saved, into the `reserved` file; the saved file,
/// or `None` where the save failed (logged: the pod goes on, and the shape's pods keep
/// starting cold).
async fn save(qmp: &Qmp, reserved: Reserved, pod_id: &str, key: &str) -> Option<File> {
    let started = Instant::now();
    let saved = match reserved.file() {
        Ok(file) => snapshot::save(qmp, file.into(), SAVE_OR_LOAD)
            .await
            .and_then(|()| reserved.commit()),
        Err(e) => Err(e),
    };
    match saved {
        Ok(file) => {
            log::info!(
                "pod {pod_id}: saved template {key} in {} ms",
                started.elapsed().as_millis()
            );
            Some(file)
        }
        // Dropped, the reservation's file is removed.
        Err(e) => {
            log::warn!(
                "pod {pod_id}: template {key} not saved, pods of this shape keep starting cold: {}",
                e.message()
            );
            None
        }
    }
}

/// Plugs each NIC into its port, then the vsock device.
async fn plug_devices(
    qmp: &Qmp,
    nics: Vec<(TapDescription, OwnedFd)>,
    vsock: VsockBackend,
) -> Result<(), Error> {
    for (i, (tap, fd)) in nics.into_iter().enumerate() {
        identity::plug_nic(qmp, i, &tap, fd, &nic_port(i)).await?;
    }
    identity::plug_vsock(qmp, vsock, VSOCK_PORT).await
}

/// Removes the template `file` of `key`; what became of it, for the pod's error.
async fn discard(store: &TemplateStore, key: &str, file: &File, pod_id: &str) -> String {
    match store.discard(key, file).await {
        Ok(()) => "which is discarded (the shape's next pod boots cold and saves a new one)".into(),
        Err(e) => {
            log::warn!("pod {pod_id}: discard template {key}: {}", e.message());
            format!("which could not be discarded ({})", e.message())
        }
    }
}

/// Whether `e`, met loading a template or plugging a pod's devices in after it, can be the
/// template's doing: QEMU refused a command or ended. A deadline passed (a loaded node) or
/// the shim's own I/O failed says nothing of the template, which other pods share: it stays.
fn blames_the_template(e: &Error) -> bool {
    !matches!(e, Error::Timeout(_) | Error::Io { .. })
}

/// The agent's log line that says the template is ready ([`vmlet_protocol::TEMPLATE_READY_LINE`]
/// at the start of a line, with the agent's prefix): what a pod's kernel parameters print on
/// the console (the kernel echoes its command line) is never at a line's start.
const READY_ON_CONSOLE: &str = "\nvmlet-agent INFO: template ready to be saved";

/// Waits until the guest's console says it is ready to be saved.
async fn wait_for_template(console: &Path, within: Duration) -> Result<(), Error> {
    let mut watch = crate::guest::console::ReadyWatch::new(console, READY_ON_CONSOLE);
    if !watch.wait_until(Instant::now() + within).await {
        return Err(Error::Timeout(format!(
            "the template guest did not say it was ready to be saved within {} s",
            within.as_secs()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::qmp::tests::{fake_qemu, finished};
    use crate::vmm::vm_spec::tests::spec;
    use crate::vmm::vm_spec::VsockDevice;
    use serde_json::{json, Value};

    fn pod(dir: &Path) -> VmSpec {
        let mut spec = spec(VsockDevice::VhostUser {
            socket: "/run/vmlet/t1/vsock.sock".into(),
            connection: None,
        });
        spec.network = None;
        for (name, file) in [
            ("vmlinux", "kernel"),
            ("initrd", "initrd"),
            ("qemu", "qemu"),
            ("virtiofsd", "virtiofsd"),
        ] {
            std::fs::write(dir.join(name), file).unwrap();
        }
        if let GuestBoot::Agent(agent) = &mut spec.guest {
            agent.kernel = dir.join("vmlinux").to_string_lossy().into_owned();
            agent.initrd = dir.join("initrd").to_string_lossy().into_owned();
            agent.virtiofsd = dir.join("virtiofsd").to_string_lossy().into_owned();
        }
        spec.qemu = dir.join("qemu").to_string_lossy().into_owned();
        spec.emulator = spec.qemu.clone();
        spec
    }

    #[tokio::test]
    async fn only_vmlets_guest_on_vhost_user_starts_from_a_template() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::default();
        config.templates.enabled = true;
        config.templates.dir = dir.path().join("templates");
        let ok = pod(dir.path());
        let chosen = choose(&config, &ok, false).await.unwrap().unwrap();
        assert_eq!(chosen.role(), TemplateRole::Save);
        drop(chosen);
        let mut networked = ok.clone();
        networked.network = spec(VsockDevice::Vhost).network;
        assert!(choose(&config, &networked, false).await.unwrap().is_some());
        let mut kernel_vsock = ok.clone();
        if let GuestBoot::Agent(agent) = &mut kernel_vsock.guest {
            agent.vsock = VsockDevice::Vhost;
        }
        assert!(choose(&config, &kernel_vsock, false)
            .await
            .unwrap()
            .is_none());
        assert!(why_cold(&kernel_vsock).contains("vhost-user"));
        config.templates.enabled = false;
        assert!(choose(&config, &ok, false).await.unwrap().is_none());
    }

    #[test]
    fn the_key_changes_with_the_shape_and_the_files_but_not_the_pod() {
        let dir = tempfile::tempdir().unwrap();
        let a = pod(dir.path());
        let mut other_pod = a.clone();
        other_pod.name = "vmlet-t2".into();
        other_pod.pod_id = "t2".into();
        other_pod.qmp_socket = "/run/vmlet/t2/qmp.sock".into();
        assert_eq!(
            describe(&a, false).unwrap(),
            describe(&other_pod, false).unwrap()
        );
        let mut bigger = a.clone();
        bigger.memory_mib += 256;
        assert_ne!(
            describe(&a, false).unwrap(),
            describe(&bigger, false).unwrap()
        );
        assert_ne!(describe(&a, false).unwrap(), describe(&a, true).unwrap());
        let mut networked = a.clone();
        networked.network = spec(VsockDevice::Vhost).network;
        assert_ne!(
            describe(&a, false).unwrap(),
            describe(&networked, false).unwrap()
        );
        let mut other_macs = networked.clone();
        for nic in &mut other_macs.network.as_mut().unwrap().nics {
            nic.mac = "0a:58:0a:00:00:99".into();
        }
        assert_eq!(
            describe(&networked, false).unwrap(),
            describe(&other_macs, false).unwrap()
        );
        let before = describe(&a, false).unwrap();
        std::fs::remove_file(dir.path().join("vmlinux")).unwrap();
        std::fs::write(dir.path().join("vmlinux"), "another kernel").unwrap();
        assert_ne!(before, describe(&a, false).unwrap(), "a replaced kernel");
    }

    /// A QEMU whose loads complete and whose `device_add` of `failing` is refused.
    fn qemu_refusing(failing: &'static str) -> impl Fn(&Value) -> Vec<Value> + Send + 'static {
        move |c| match c["execute"].as_str().unwrap() {
            "add-fd" => vec![json!({"return": {"fdset-id": 3, "fd": 25}})],
            "migrate-incoming" => vec![
                json!({"return": {}}),
                json!({"event": "MIGRATION", "data": {"status": "completed"}}),
            ],
            "query-migrate" => vec![json!({"return": {"status": "completed"}})],
            "device_add" if c["arguments"]["driver"] == failing => {
                vec![json!({"error": {"class": "GenericError", "desc": "no room"}})]
            }
            _ => vec![json!({"return": {}})],
        }
    }

    /// Loads a saved template into a fake QEMU that refuses `failing`'s plug, with one NIC;
    /// what `finish` returned, and whether the template is still there.
    /// Loads a template into a fake QEMU that refuses `failing`: how `finish` went, whether
    /// the template is still there, and the directory that holds it.
    async fn load_with_a_refused(
        failing: &'static str,
    ) -> (Result<Option<Used>, Error>, bool, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        let limits = Limits {
            max_count: 4,
            max_bytes: 1 << 30,
        };
        let key = key("a shape");
        let store = TemplateStore::new(&templates, limits);
        store
            .reserve(&key, 1 << 20)
            .await
            .unwrap()
            .unwrap()
            .commit()
            .unwrap();
        let file = store.open(&key).unwrap().unwrap();
        let start = TemplateStart {
            key: key.clone(),
            vsock: VsockBackend::Socket(dir.path().join("vsock.sock")),
            nics: vec![(
                TapDescription {
                    mac: "0a:58:0a:00:00:07".into(),
                    mtu: 1500,
                    slot: 0x12,
                },
                OwnedFd::from(File::open("/dev/null").unwrap()),
            )],
            action: Action::Load { file, store },
        };
        let (stream, server) = fake_qemu(qemu_refusing(failing));
        let qmp = Qmp::handshake(stream).await.unwrap();
        let console = dir.path().join("console.log");
        let finished_with = start
            .finish(&qmp, "p1", &console, Duration::from_secs(1))
            .await;
        drop(qmp);
        finished(server).await;
        let kept = TemplateStore::new(&templates, limits)
            .open(&key)
            .unwrap()
            .is_some();
        (finished_with, kept, dir)
    }

    #[tokio::test]
    async fn a_loaded_pod_gets_its_devices_and_the_template_stays() {
        let (finished_with, kept, _dir) = load_with_a_refused("none").await;
        assert!(finished_with.unwrap().is_some());
        assert!(kept);
    }

    #[tokio::test]
    async fn a_template_whose_pods_agent_never_answers_is_discarded() {
        let (finished_with, _, dir) = load_with_a_refused("none").await;
        let said = finished_with.unwrap().unwrap().discard("p1").await;
        assert!(said.contains("is discarded"), "{said}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("templates"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| !n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn a_nic_that_cannot_be_plugged_after_a_load_discards_the_template() {
        let (finished_with, kept, _dir) = load_with_a_refused("virtio-net-pci").await;
        let message = finished_with.unwrap_err().message();
        assert!(message.contains("is discarded"), "{message}");
        assert!(
            message.contains("plug NIC 0 (MAC 0a:58:0a:00:00:07)"),
            "{message}"
        );
        assert!(message.contains("no room"), "{message}");
        assert!(!kept, "the template is gone");
    }

    #[tokio::test]
    async fn a_vsock_device_that_cannot_be_plugged_after_a_load_discards_the_template() {
        let (finished_with, kept, _dir) = load_with_a_refused("vhost-user-vsock-pci").await;
        let message = finished_with.unwrap_err().message();
        assert!(message.contains("vsock device"), "{message}");
        assert!(!kept, "the template is gone");
    }

    #[test]
    fn only_qemus_refusal_or_end_blames_a_template() {
        assert!(blames_the_template(&Error::Internal(
            "QEMU refused device_add: no room".into()
        )));
        assert!(blames_the_template(&Error::Internal(
            "QMP device_add: QEMU closed the QMP monitor".into()
        )));
        assert!(!blames_the_template(&Error::Timeout("no answer".into())));
        assert!(!blames_the_template(&Error::io(
            "send",
            std::io::Error::other("gone")
        )));
    }

    #[test]
    fn the_ready_line_is_the_agents_log_line_at_a_lines_start() {
        assert!(READY_ON_CONSOLE.starts_with("\nvmlet-agent INFO: "));
        assert!(READY_ON_CONSOLE.ends_with(vmlet_protocol::TEMPLATE_READY_LINE));
    }
}
