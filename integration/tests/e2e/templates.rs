//! Template starts, the guest's half: a guest booted as a template is saved once and loaded
//! into two VMs, each of which becomes a pod's own VM (its key, its vsock device, its
//! random numbers, its share: the virtio-fs device migrates with the template, which never
//! mounted it, and each pod's agent mounts its own virtiofsd's) before its agent serves. QEMU runs directly here, on the stack's guest
//! image, with the shim's QMP client, save and load ([`vmlet_shim::devices`]). Attack: a pod
//! that knows its own key (a compromised guest does) tries it on the other pod loaded from
//! the same template.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use crate::support::stack;
use vmlet_integration::direct_vm::{DirectVm, Guest, Launch, PrivateDir, HOTPLUG_PORT};
use vmlet_protocol::TEMPLATE_READY_LINE;
use vmlet_shim::devices::{identity, snapshot};
use vmlet_shim::vm::connect_agent;

const BOOT: Duration = Duration::from_secs(60);
const SAVE_OR_LOAD: Duration = Duration::from_secs(30);

fn ms(since: Instant) -> u128 {
    since.elapsed().as_millis()
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_guest_loaded_from_a_template_becomes_a_pod_of_its_own() {
    let s = stack();
    let guest = Guest::of_image(&s.guest_dir).unwrap();
    let store = PrivateDir::new("vmlet-template-store").unwrap();
    let state = store.join("state");

    let started = Instant::now();
    let mut template = DirectVm::new("vmlet-template").unwrap();
    template.start_virtiofsd().await.unwrap();
    template
        .launch(
            &guest,
            Launch {
                template: true,
                share: true,
                ..Launch::default()
            },
        )
        .unwrap();
    template
        .console_shows(TEMPLATE_READY_LINE, BOOT)
        .await
        .unwrap();
    let booted = ms(started);
    let saving = Instant::now();
    let qmp = template.qmp().await.unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&state)
        .unwrap();
    snapshot::save(&qmp, OwnedFd::from(file), SAVE_OR_LOAD)
        .await
        .unwrap();
    println!("template: ready in {booted} ms, saved in {} ms", ms(saving));
    drop(qmp);
    drop(template);

    let mut pods = Vec::new();
    for n in 0..2 {
        let started = Instant::now();
        let mut vm = DirectVm::new("vmlet-from-template").unwrap();
        vm.start_virtiofsd().await.unwrap();
        vm.launch(
            &guest,
            Launch {
                template: true,
                incoming: true,
                share: true,
                ..Launch::default()
            },
        )
        .unwrap();
        let qmp = vm.qmp().await.unwrap();
        let file = std::fs::File::open(&state).unwrap();
        snapshot::load(&qmp, OwnedFd::from(file), SAVE_OR_LOAD)
            .await
            .unwrap();
        let loaded = ms(started);
        vm.start_vsock_backend().await.unwrap();
        identity::plug_vsock(&qmp, &vm.vsock_backend_socket(), HOTPLUG_PORT)
            .await
            .unwrap();
        // It serves only once it mounted the share (or it powers off).
        let (_agent, boot_id) = vm.agent(BOOT).await.unwrap();
        println!(
            "pod {n}: loaded in {loaded} ms, its agent answered after {} ms",
            ms(started)
        );
        let console = std::fs::read_to_string(vm.console()).unwrap();
        assert!(
            console.contains("restored from a template as vsock CID 3"),
            "{console}"
        );
        pods.push((vm, qmp, boot_id));
    }
    assert_ne!(
        pods[0].2, pods[1].2,
        "two pods loaded from one template drew the same boot id: their random numbers are the same"
    );

    // The attack: pod 0's key, which its guest knows, on pod 1.
    let (zero, one) = (&pods[0].0, &pods[1].0);
    let attempt = connect_agent(
        &one.endpoint(zero.key().clone()),
        Duration::from_secs(5),
        None,
    )
    .await;
    assert!(
        attempt.is_err(),
        "pod 1's agent answered pod 0's key: one template, one key"
    );
    let console = std::fs::read_to_string(one.console()).unwrap();
    assert!(console.contains("not this VM's key"), "{console}");
}
