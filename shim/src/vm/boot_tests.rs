//! The boot's steps over fakes: a VM manager that records (or fails), a "QEMU" that connects
//! vmlet's QMP monitor as the real one does, and a pod's state in a temporary directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vmlet_config::{Accel, CpuModel, NodeConfig, VmOptions, VmShape, VsockTransport};

use super::fake_qemu::FakeQemu;
use super::{
    accel, host_setup, launch, made_pod_state, new_pod_paths, new_pod_state, power_off_and_reclaim,
    reclaim_failed_boot, vsock_backend, BootRequest, Recorder,
};
use crate::devices::memory::PodMemory;
use crate::host::pod_paths::PodPaths;
use crate::host::state::PodState;
use crate::vm::RootfsSource;
use crate::vmm::vm_spec::VsockDevice;
use crate::vmm::{FakeVmm, VmManager};
use crate::Error;

/// A node config whose state lives under `dir`, whose QEMU user is the test's own, and
/// whose virtiofsd is a stand-in that waits ([`FAKE_VIRTIOFSD`], made where `dir` is).
fn config(dir: &Path) -> NodeConfig {
    let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap();
    let mut config = NodeConfig {
        state_dir: dir.join("state"),
        qemu_user: me.name,
        accel: Accel::Tcg,
        vsock: VsockTransport::Vhost,
        ..NodeConfig::default()
    };
    if dir.is_dir() {
        let virtiofsd = dir.join("virtiofsd");
        std::fs::write(&virtiofsd, FAKE_VIRTIOFSD).unwrap();
        std::fs::set_permissions(&virtiofsd, std::fs::Permissions::from_mode(0o755)).unwrap();
        config.helpers.virtiofsd = virtiofsd;
    }
    config
}

/// A virtiofsd that serves nothing, and ends by itself if no teardown kills it.
const FAKE_VIRTIOFSD: &str = "#!/bin/sh\nexec sleep 30\n";

fn request(pod_id: &str) -> BootRequest {
    BootRequest {
        pod_id: pod_id.into(),
        container_id: pod_id.into(),
        shape: VmShape {
            vcpus: 1,
            memory_mib: 128,
        },
        memory: PodMemory::new(128, 0, 0, true),
        options: VmOptions {
            machine: "q35".into(),
            cpu_model: None,
            kernel_params: String::new(),
            disk_driver: Default::default(),
        },
        rootfs: RootfsSource::Dir(PathBuf::from("/nonexistent")),
        binds: Vec::new(),
        netns: None,
        host_process: None,
        cgroup: None,
        image: None,
        sandbox_id: None,
        names: crate::host::pod_record::PodNames {
            namespace: "default".into(),
            name: pod_id.into(),
        },
    }
}

/// A new pod's state directory, its share and log directory made (as the host's setup
/// makes them), and the recorder the steps save into.
fn pod(config: &NodeConfig, pod_id: &str) -> (PodPaths, Arc<Mutex<PodState>>) {
    let (paths, state) = pod_state_now(config, pod_id, None).unwrap();
    std::fs::create_dir_all(&paths.share).unwrap();
    std::fs::create_dir_all(paths.virtiofsd_log.parent().unwrap()).unwrap();
    (paths, state)
}

/// [`new_pod_state`] without a runtime.
fn pod_state_now(
    config: &NodeConfig,
    pod_id: &str,
    sandbox_id: Option<&str>,
) -> Result<(PodPaths, Arc<Mutex<PodState>>), Error> {
    let paths = new_pod_paths(config, pod_id)?;
    let lock = crate::host::pod_lock::take_blocking(
        &config.state_dir,
        pod_id,
        std::time::Duration::from_secs(1),
    )?;
    made_pod_state(paths, sandbox_id, lock)
}

/// Pod `p` with its state under a temporary directory (removed when dropped), no cgroup.
struct Scratch {
    _dir: tempfile::TempDir,
    config: NodeConfig,
    paths: PodPaths,
    rec: Recorder<'static>,
}

fn scratch_pod() -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let (paths, state) = pod(&config, "p");
    Scratch {
        _dir: dir,
        config,
        paths,
        rec: Recorder {
            state,
            cgroup: None,
        },
    }
}

/// What the pod's state file on disk says (what a restarted shim would find).
fn saved(paths: &PodPaths) -> PodState {
    PodState::load(&paths.dir).unwrap()
}

#[tokio::test]
async fn the_accelerator_is_the_configs_when_it_names_one() {
    let dir = tempfile::tempdir().unwrap();
    let vmm: Arc<dyn VmManager> = Arc::new(FakeVmm::default());
    let options = request("p").options;
    let mut config = config(dir.path());
    config.accel = Accel::Tcg;
    assert!(!accel::use_kvm(&config, &vmm, &options).await.unwrap());
    config.accel = Accel::Kvm;
    assert!(accel::use_kvm(&config, &vmm, &options).await.unwrap());
}

#[tokio::test]
async fn auto_is_tcg_where_libvirt_offers_no_kvm() {
    let dir = tempfile::tempdir().unwrap();
    let vmm: Arc<dyn VmManager> = Arc::new(FakeVmm::default());
    let mut config = config(dir.path());
    config.accel = Accel::Auto;
    let kvm = accel::use_kvm(&config, &vmm, &request("p").options).await;
    assert!(!kvm.unwrap());
}

#[tokio::test]
async fn a_host_cpu_model_under_tcg_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let vmm: Arc<dyn VmManager> = Arc::new(FakeVmm::default());
    let mut options = request("p").options;
    options.cpu_model = Some(CpuModel::HostPassthrough);
    let err = accel::use_kvm(&config(dir.path()), &vmm, &options)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(err.message().contains("host-passthrough"), "{err:?}");
    options.cpu_model = Some(CpuModel::Named("qemu64".into()));
    assert!(!accel::use_kvm(&config(dir.path()), &vmm, &options)
        .await
        .unwrap());
}

#[tokio::test]
async fn a_pods_state_is_new_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let (paths, state) = new_pod_state(&config, "p", Some("sandbox")).await.unwrap();
    assert!(paths.dir.is_dir());
    let state = state.lock().unwrap().clone();
    assert_eq!(state.shim_pid, Some(std::process::id()));
    assert_eq!(state.shim_id(), "sandbox");
    // Refused at once, not after waiting for the live pod's lock.
    let again = new_pod_state(&config, "p", None).await.unwrap_err();
    assert!(matches!(again, Error::AlreadyExists(_)), "{again:?}");
    // The pod's lock is held while its state lives: a removal of leftovers waits.
    assert!(crate::host::pod_lock::try_take(&config.state_dir, "p")
        .unwrap()
        .is_none());
    drop(state);
}

#[tokio::test]
async fn a_new_pod_waits_for_a_removal_of_its_ids_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    std::fs::create_dir_all(&config.state_dir).unwrap();
    // `vmletctl gc` at work on what an earlier pod "q" left.
    let gc = crate::host::pod_lock::take(&config.state_dir, "q", std::time::Duration::ZERO)
        .await
        .unwrap();
    let err =
        crate::host::pod_lock::take(&config.state_dir, "q", std::time::Duration::from_millis(50))
            .await
            .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    let waiting = tokio::spawn({
        let config = config.clone();
        async move {
            new_pod_state(&config, "q", None)
                .await
                .map(|(paths, _)| paths)
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the create waits for the removal");
    drop(gc);
    let paths = waiting.await.unwrap().unwrap();
    assert!(paths.dir.is_dir());
}

#[test]
fn the_first_step_saves_the_state_and_gives_the_pod_dir_its_mode() {
    let Scratch {
        _dir,
        config: _,
        paths,
        rec,
    } = scratch_pod();
    host_setup::dir_and_cgroup(&paths, None, &rec).unwrap();
    let mode = std::fs::metadata(&paths.dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, crate::host::share::POD_DIR_MODE);
    let state = saved(&paths);
    assert_eq!(state.dir, paths.dir);
    assert_eq!(state.cgroup(), None);
    // Without a cgroup, the VM's processes stay where they are.
    rec.place(std::process::id(), "the test").unwrap();
}

#[tokio::test]
async fn without_hooks_the_pods_namespace_is_the_one_given_and_no_process_starts() {
    let Scratch {
        _dir,
        config: _,
        paths,
        rec,
    } = scratch_pod();
    let mut req = request("p");
    assert!(host_setup::start_host_process(&req, &rec)
        .await
        .unwrap()
        .is_none());
    req.netns = Some(PathBuf::from("/var/run/netns/pod"));
    let netns = host_setup::start_host_process(&req, &rec)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(netns.path, PathBuf::from("/var/run/netns/pod"));
    assert!(!netns.may_be_empty);
    assert!(rec.state.lock().unwrap().made.is_empty());
    assert!(!paths.dir.join(crate::host::state::STATE_FILE).exists());
}

#[tokio::test]
async fn the_kernels_vsock_needs_no_backend_process() {
    let Scratch {
        _dir,
        config,
        paths,
        rec,
    } = scratch_pod();
    let user = crate::host::pod_user::PodUser::shared(&config).unwrap();
    let (device, connection) = vsock_backend::start(&config, &paths, &rec, &user, false)
        .await
        .unwrap();
    assert_eq!(device, VsockDevice::Vhost);
    assert!(connection.is_none());
    assert!(rec.state.lock().unwrap().made.is_empty());
}

#[test]
fn the_guest_boots_the_nodes_kernel_with_the_share_and_the_pods_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let paths = PodPaths::new(&config.state_dir, "p");
    let mut req = request("p");
    let guest = |req: &BootRequest| match launch::agent_guest(
        &config,
        req,
        &paths,
        &VsockDevice::Vhost,
        paths.agent_key.to_string_lossy().into_owned(),
    ) {
        crate::vmm::vm_spec::GuestBoot::Agent(guest) => guest,
        other => panic!("not vmlet's guest: {other:?}"),
    };
    let plain = guest(&req);
    assert!(
        plain.cmdline.ends_with("vmlet.share=vmlet"),
        "{}",
        plain.cmdline
    );
    assert_eq!(plain.share_dir, paths.share.to_string_lossy());
    assert_eq!(plain.share_socket, paths.share_socket.to_string_lossy());
    assert_eq!(plain.key_file, paths.agent_key.to_string_lossy());
    req.options.kernel_params = "loglevel=7".into();
    let tuned = guest(&req);
    assert!(tuned.cmdline.ends_with("vmlet.share=vmlet loglevel=7"));
}

/// vmlet's guest for pod `p` at `paths`, without taps.
fn devices(paths: &PodPaths) -> launch::Devices {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    launch::Devices {
        kvm: false,
        direct: false,
        guest: crate::vmm::vm_spec::GuestBoot::Agent(crate::vmm::vm_spec::AgentBoot {
            kernel: "/boot/vmlinuz".into(),
            initrd: "/boot/initrd".into(),
            cmdline: "console=ttyS0".into(),
            virtiofsd: "/usr/libexec/virtiofsd".into(),
            share_dir: path(&paths.share),
            share_socket: path(&paths.share_socket),
            share_tag: "vmlet".into(),
            vsock: VsockDevice::Vhost,
            key_file: path(&paths.agent_key),
        }),
        taps: None,
        user: crate::host::pod_user::PodUser::shared(&config(Path::new("/nonexistent"))).unwrap(),
        key_pipe: None,
        vsock_connection: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_domain_is_recorded_before_it_starts_and_qemus_monitor_tells_its_end() {
    let Scratch {
        _dir,
        config,
        paths,
        rec,
    } = scratch_pod();
    let (qemu, vmm, quit) = FakeQemu::manager(paths.qmp_socket.clone(), false);
    let launched = launch::start(&config, &vmm, &request("p"), &paths, &rec, devices(&paths))
        .await
        .unwrap();
    assert_eq!(launched.name, "vmlet-p");
    assert_eq!(saved(&paths).domain(), Some("vmlet-p"));
    // The monitor's peer is the process that connected it: QEMU's PID (here, the test's).
    assert_eq!(launched.qemu_pid, std::process::id());
    let xml = qemu.started.lock().unwrap().join("");
    assert!(xml.contains(&*paths.qmp_socket.to_string_lossy()), "{xml}");
    assert!(xml.contains("<name>vmlet-p</name>"), "{xml}");
    // Only QEMU's user may connect the monitor.
    let mode = std::fs::metadata(&paths.qmp_socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The pod's virtiofsd is the shim's, on a socket of the pod's QEMU's user alone, which
    // the domain names.
    let socket = std::fs::metadata(&paths.share_socket).unwrap();
    assert_eq!(socket.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&socket),
        nix::unistd::geteuid().as_raw()
    );
    let source = format!("<source socket=\"{}\"/>", paths.share_socket.display());
    assert!(xml.contains(&source), "{xml}");
    let mut ended = launched.ended.clone();
    assert!(!*ended.borrow());
    drop(quit);
    tokio::time::timeout(std::time::Duration::from_secs(5), ended.wait_for(|e| *e))
        .await
        .expect("the monitor's close is seen")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_taps_are_served_with_their_slots_before_qemu_starts() {
    let Scratch {
        _dir,
        config,
        paths,
        rec,
    } = scratch_pod();
    let (qemu, vmm, _quit) = FakeQemu::manager(paths.qmp_socket.clone(), false);
    let listener = tokio::net::UnixListener::bind(&paths.tap_socket).unwrap();
    let nic = |mac: &str| crate::vmm::vm_spec::Nic {
        mac: mac.into(),
        mtu: 1500,
    };
    let network = crate::vmm::vm_spec::Network {
        tap_socket: paths.tap_socket.to_string_lossy().into_owned(),
        nics: vec![nic("0a:00:00:00:00:01"), nic("0a:00:00:00:00:02")],
    };
    let fds = (0..2)
        .map(|_| std::fs::File::open("/dev/null").unwrap().into())
        .collect();
    let mut devices = devices(&paths);
    let user = devices.user.clone();
    devices.taps = Some(super::net::PendingTaps::new(network, listener, fds, user));
    let launched = launch::start(&config, &vmm, &request("p"), &paths, &rec, devices)
        .await
        .unwrap();
    let fetched = qemu
        .fetched
        .lock()
        .unwrap()
        .clone()
        .expect("the wrapper ran");
    let slots: Vec<_> = fetched
        .expect("the taps were served as QEMU started")
        .into_iter()
        .map(|t| (t.mac, t.slot))
        .collect();
    assert_eq!(
        slots,
        [
            ("0a:00:00:00:00:01".to_owned(), 0x12),
            ("0a:00:00:00:00:02".to_owned(), 0x13)
        ]
    );
    assert!(launched.tap_server.is_some());
}

#[tokio::test]
async fn a_start_libvirt_refuses_is_torn_down_from_what_was_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let (paths, state) = pod(&config, "p");
    let rec = Recorder {
        state: state.clone(),
        cgroup: None,
    };
    let (_, vmm, _quit) = FakeQemu::manager(paths.qmp_socket.clone(), true);
    let err = launch::start(&config, &vmm, &request("p"), &paths, &rec, devices(&paths))
        .await
        .err()
        .expect("the start fails");
    assert!(err.message().contains("libvirt refused"), "{err:?}");
    // Recorded before the start: a teardown finds the domain to remove, and the pod's
    // virtiofsd (the shim's, started first) to end.
    let saved = saved(&paths);
    assert_eq!(saved.domain(), Some("vmlet-p"));
    let virtiofsd = saved
        .made
        .iter()
        .find_map(|m| match m {
            crate::host::undo::Made::Process(p) if p.what == "virtiofsd" => Some(p.clone()),
            _ => None,
        })
        .expect("virtiofsd is in the journal");
    assert!(virtiofsd.runs());
    let fake = Arc::new(FakeVmm::default());
    fake.running.lock().unwrap().push("vmlet-p".into());
    let vmm: Arc<dyn VmManager> = fake.clone();
    let returned = reclaim_failed_boot(&vmm, &state, "p", err).await;
    assert!(
        returned.message().contains("libvirt refused"),
        "{returned:?}"
    );
    assert!(fake.running.lock().unwrap().is_empty());
    assert!(!virtiofsd.runs());
    assert!(!paths.dir.exists());
}

/// A state with a domain and a directory, as a booted pod's.
fn booted_state(config: &NodeConfig, fake: &FakeVmm) -> (PodPaths, PodState) {
    let (paths, state) = pod(config, "p");
    let mut state = state.lock().unwrap().clone();
    state.record(crate::host::undo::Made::Domain("vmlet-p".into()));
    state.save().unwrap();
    fake.running.lock().unwrap().push("vmlet-p".into());
    (paths, state)
}

#[tokio::test(start_paused = true)]
async fn a_running_guest_is_asked_to_power_off_before_everything_goes() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let fake = Arc::new(FakeVmm::default());
    let (paths, state) = booted_state(&config, &fake);
    let vm = crate::task::fakes::FakeVm::default();
    // The guest never powers off: the teardown goes on after its wait.
    power_off_and_reclaim(&vm, state, fake.clone())
        .await
        .unwrap();
    assert_eq!(vm.guest.called("shutdown"), 1);
    assert!(fake.running.lock().unwrap().is_empty());
    assert!(!paths.dir.exists());
}

#[tokio::test]
async fn an_ended_vm_is_reclaimed_without_asking_its_guest() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let fake = Arc::new(FakeVmm::default());
    let (paths, state) = booted_state(&config, &fake);
    let vm = crate::task::fakes::FakeVm::default();
    vm.end();
    power_off_and_reclaim(&vm, state, fake.clone())
        .await
        .unwrap();
    assert_eq!(vm.guest.called("shutdown"), 0);
    assert!(fake.running.lock().unwrap().is_empty());
    assert!(!paths.dir.exists());
}
