//! The launcher without libvirt, its parts alone: QEMU started with vmlet's own command line
//! ([`vmlet_shim::vmm::qemu_command`]) as the node's QEMU user with that user's groups
//! ([`vmlet_shim::host::qemu_process`]), on the stack's guest image, with the pod's
//! virtiofsd and vsock backend, boots vmlet's guest; the guest's agent answers with the
//! pod's key once it mounted the share; vmlet's QMP monitor connects to the shim's socket;
//! and QEMU ends by itself when the guest powers off. Pods started so, in their cgroups, are
//! `direct_pods`; the AppArmor request at the exec is unit-tested in `qemu_process`.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::stack;
use vmlet_integration::direct_vm::{DirectVm, Guest, QEMU, VIRTIOFSD};
use vmlet_protocol::agent::ShutdownRequest;
use vmlet_shim::devices::qmp::Qmp;
use vmlet_shim::host::qemu_process::{self, Confinement};
use vmlet_shim::vmm::pci_slots::PciSlots;
use vmlet_shim::vmm::qemu_command::{qemu_command, Launched};
use vmlet_shim::vmm::vm_spec::{
    agent_cmdline, AgentBoot, ConsoleTarget, GuestBoot, VmSpec, VsockDevice,
};

const BOOT: Duration = Duration::from_secs(60);

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn vmlets_own_qemu_command_line_boots_a_pod_whose_agent_answers() {
    let s = stack();
    let guest = Guest::of_image(&s.guest_dir).unwrap();
    let mut vm = DirectVm::new("vmlet-direct").unwrap();
    vm.start_virtiofsd().await.unwrap();
    vm.start_vsock_backend().await.unwrap();
    let path = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
    // QEMU gets the shim's connection to the vsock backend, as the launcher gives it.
    let vsock = vmlet_shim::host::vhost_device_vsock::connect(&vm.vsock_backend_socket()).unwrap();
    let qmp_socket = vm.path("qmp.sock");
    let qmp_listener = tokio::net::UnixListener::bind(&qmp_socket).unwrap();
    let spec = VmSpec {
        name: "vmlet-direct".into(),
        pod_id: "direct".into(),
        kvm: false,
        tcg_translation_cache_mib: None,
        free_page_reporting: false,
        vcpus: 1,
        memory_mib: 256,
        hotplug_mib: 512,
        machine: "q35".into(),
        cpu_model: None,
        guest: GuestBoot::Agent(AgentBoot {
            kernel: path(guest.kernel.clone()),
            initrd: path(guest.initrd.clone()),
            cmdline: agent_cmdline("vmlet", ""),
            virtiofsd: VIRTIOFSD.into(),
            share_dir: path(vm.share_dir()),
            share_socket: path(vm.share_socket()),
            share_tag: "vmlet".into(),
            vsock: VsockDevice::VhostUser {
                socket: path(vm.vsock_backend_socket()),
                connection: Some(std::os::fd::AsRawFd::as_raw_fd(&vsock)),
            },
            key_file: path(vm.path("agent.key")),
        }),
        emulator: QEMU.into(),
        qemu: QEMU.into(),
        console: ConsoleTarget::File(path(vm.console())),
        network: None,
        qmp_socket: path(qmp_socket),
        slots: PciSlots::assign(),
        template: None,
        // The node's QEMU user, as the spawn below runs it.
        user: vmlet_shim::host::pod_user::PodUser::shared(
            &vmlet_config::NodeConfig::load_from(Path::new(
                &std::env::var("VMLET_CONFIG").expect("VMLET_CONFIG"),
            ))
            .expect("the stack's config"),
        )
        .unwrap(),
    };
    let console = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(vm.console())
        .unwrap();
    let console = OwnedFd::from(console);
    // QEMU gets the connection to virtiofsd, as the launcher gives it.
    let share = OwnedFd::from(std::os::unix::net::UnixStream::connect(vm.share_socket()).unwrap());
    let launched = Launched {
        uuid: "4a1f3c2e-9b7d-4e1a-8c55-0d2f6b7a9e10".into(),
        share_fd: Some(std::os::fd::AsRawFd::as_raw_fd(&share)),
        console_fd: Some(std::os::fd::AsRawFd::as_raw_fd(&console)),
        tap_fds: Vec::new(),
        image: None,
    };
    let args = qemu_command(&spec, &launched).unwrap();
    // What a pod's QEMU opens by path is its user's to open (the shim gives it so).
    let config = std::env::var("VMLET_CONFIG").expect("VMLET_CONFIG: the stack's config");
    let name = vmlet_config::NodeConfig::load_from(Path::new(&config))
        .expect("the stack's config")
        .qemu_user;
    let user = nix::unistd::User::from_name(&name)
        .unwrap()
        .expect("the QEMU user");
    let groups = nix::unistd::getgrouplist(&CString::new(name).unwrap(), user.gid).unwrap();
    std::fs::set_permissions(vm.path(""), std::fs::Permissions::from_mode(0o711)).unwrap();
    // The directory lets others through (0711), so each file is the QEMU user's alone.
    for file in ["qmp.sock", "agent.key"] {
        std::os::unix::fs::chown(vm.path(file), Some(user.uid.as_raw()), None).unwrap();
        std::fs::set_permissions(vm.path(file), std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    let started = Instant::now();
    let qemu = qemu_process::spawn(
        Path::new(QEMU),
        &args,
        vec![console, share, vsock],
        Confinement {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups: groups.iter().map(|g| g.as_raw()).collect(),
            cgroup_procs: Vec::new(),
            apparmor_profile: None,
            view: None,
        },
        std::fs::File::create(vm.path("qemu.log")).unwrap(),
    )
    .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", qemu.pid)).unwrap();
    assert!(
        status.contains(&format!("\nUid:\t{0}\t{0}\t{0}\t{0}\n", user.uid)),
        "QEMU runs as the QEMU user: {status}"
    );
    let (stream, _) = tokio::time::timeout(Duration::from_secs(10), qmp_listener.accept())
        .await
        .expect("QEMU connects vmlet's QMP monitor")
        .unwrap();
    let qmp = Qmp::handshake(stream).await.unwrap();
    let (agent, boot_id) = vm.agent(BOOT).await.unwrap();
    println!(
        "direct: agent answered {} ms after QEMU started (boot id {boot_id})",
        started.elapsed().as_millis()
    );
    let status = qmp
        .execute("query-status", serde_json::json!({}), Vec::new())
        .await
        .unwrap();
    assert_eq!(status["status"], "running", "{status}");

    // The guest powers off; QEMU, started without -no-shutdown, ends with it.
    let powering_off = Instant::now();
    let _ = agent
        .shutdown(
            ttrpc::context::with_timeout(2_000_000_000),
            &ShutdownRequest::default(),
        )
        .await;
    assert!(
        qemu.ended_within(Duration::from_secs(30)).await.unwrap(),
        "QEMU ends when the guest powers off: {}",
        std::fs::read_to_string(vm.path("qemu.log")).unwrap_or_default()
    );
    println!(
        "direct: QEMU ended {} ms after the power-off",
        powering_off.elapsed().as_millis()
    );
}
