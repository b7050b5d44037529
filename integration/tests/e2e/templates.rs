//! Template starts, the guest's half: a guest booted as a template is saved once and loaded
//! into two VMs, each of which becomes a pod's own VM (its key, its vsock device, its
//! random numbers, its share: the virtio-fs device migrates with the template, which never
//! mounted it, and each pod's agent mounts its own virtiofsd's) before its agent serves. QEMU runs directly here, on the stack's guest
//! image, with the shim's QMP client, save and load ([`vmlet_shim::devices`]). Attack: a pod
//! that knows its own key (a compromised guest does) tries it on the other pod loaded from
//! the same template.
//!
//! Then the same through the shim: with `templates.enabled`, the first `ctr` pod of a shape
//! boots as a template and saves it, and the next ones load it; each still gets its own
//! random state, and the template directory holds one root-only file. Attack: pods choosing
//! other shapes (a Kubernetes user writes `vmlet.io/memory`) to fill the node's disk with
//! templates get none past the node's limit, and start cold. Pods with a network start
//! from a template of their shape too, their NICs plugged in after the load on their own
//! taps: two such pods on one CNI bridge, one that saved the template and one that loaded
//! it, reach the gateway and each other, and pods with two networks have each NIC under
//! its pod interface's name whatever order the guest found them in. These change the node's config, so the area runs
//! alone.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use crate::support::{stack, text};
use vmlet_integration::direct_vm::{DirectVm, Guest, Launch, PrivateDir, HOTPLUG_PORT};
use vmlet_integration::{unique_id, ConfigSwap, TemplatesOn};
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
        // The shim's connection to the backend, handed over the monitor, as the shim's
        // launcher plugs it.
        let backend = vmlet_shim::host::vhost_device_vsock::connect(&vm.vsock_backend_socket())
            .map(identity::VsockBackend::Connection)
            .unwrap();
        identity::plug_vsock(&qmp, backend, HOTPLUG_PORT)
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
            console.contains("restored from a template as vsock CID 3")
                && console.contains("reseeded the random number generator from this pod's key"),
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

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn ctr_pods_of_one_shape_start_from_its_template() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let s = stack();
    let private = PrivateDir::new("vmlet-templates").unwrap();
    let dir = private.join("store");
    let _config = ConfigSwap::edited(|c| {
        format!(
            "{c}\n[templates]\nenabled = true\ndir = \"{}\"\nmax_count = 1\nmax_mib = 1024\n",
            dir.display()
        )
    });
    let log_before = s.containerd_log().len();
    let mut boot_ids = Vec::new();
    for n in 0..3 {
        let id = unique_id("tpl");
        let started = Instant::now();
        let out = s
            .run(&id, &[], &["cat", "/proc/sys/kernel/random/boot_id"])
            .unwrap();
        assert!(out.status.success(), "pod {n}: {}", text(&out.stderr));
        println!("pod {n}: ctr run --rm in {} ms", ms(started));
        boot_ids.push(text(&out.stdout).trim().to_owned());
        if n == 0 {
            let saved: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".vmstate"))
                .collect();
            assert_eq!(saved.len(), 1, "one template after the first pod");
            let meta = saved[0].metadata().unwrap();
            assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (0, 0o600));
            let dir_mode = std::fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(dir_mode & 0o777, 0o700);
        }
    }
    // The attack: every other shape past the limit of one template.
    for memory in ["192Mi", "320Mi"] {
        let id = unique_id("tpl-shape");
        let annotation = format!("vmlet.io/memory={memory}");
        let out = s
            .run(&id, &["--annotation", &annotation], &["true"])
            .unwrap();
        assert!(out.status.success(), "{memory}: {}", text(&out.stderr));
    }
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with(".vmstate"), "{files:?}");
    let log = &s.containerd_log()[log_before..];
    assert_eq!(log.matches("saved template").count(), 1, "{log}");
    assert_eq!(log.matches("loaded template").count(), 2, "{log}");
    assert_eq!(
        log.matches("pods of this shape start cold").count(),
        2,
        "{log}"
    );
    let mut unique = boot_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        3,
        "pods from one template drew the same boot id: {boot_ids:?}"
    );
}

#[test]
#[ignore = "needs the vmlet stack and root: make test"]
fn pods_on_a_cni_bridge_start_from_their_template_with_their_own_nics() {
    use crate::cni::{run_pod_reaching_gateway_and_peer, Node, Pod};
    let s = stack();
    let _templates = TemplatesOn::new("vmlet-templates-net").unwrap();
    let log_before = s.containerd_log().len();
    let node = Node::new();
    let saver = Pod::new(&node, "tpl-save");
    let loader = Pod::new(&node, "tpl-load");

    // The first pod of the networked shape boots as its template, is saved, gets its NIC.
    let saver_id = unique_id("tpl-net-save");
    let started = Instant::now();
    let with_ns = format!("network:{}", saver.path().display());
    s.run_detached_with(&saver_id, &["--with-ns", &with_ns], &["sleep", "1000"])
        .unwrap();
    println!("saving pod running in {} ms", ms(started));

    // The next loads it, gets its own NIC, and reaches the gateway and the first pod.
    let loader_id = unique_id("tpl-net-load");
    let started = Instant::now();
    run_pod_reaching_gateway_and_peer(&s, &node, &loader, &loader_id, &saver.ip);
    println!("loading pod done in {} ms", ms(started));
    s.kill_and_remove(&saver_id).unwrap();

    assert_saved_and_loaded(&s.containerd_log()[log_before..], &saver_id, &loader_id);
    assert_eq!(saver.vmlet_leftovers(), "");
    assert_eq!(loader.vmlet_leftovers(), "");
}

/// Two NICs plugged in one after the other after a load may be found by the guest in either
/// order: each still gets its pod interface's name and MAC, in the pod that saved the
/// template and in the one that loaded it.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn pods_with_two_networks_from_a_template_have_each_nic_under_its_name() {
    use crate::network::run_pod_on_two_networks;
    use vmlet_integration::testnet::TestNet;
    let s = stack();
    let _templates = TemplatesOn::new("vmlet-templates-two").unwrap();
    let log_before = s.containerd_log().len();
    let net = TestNet::new("tpl2", 1500);
    net.add_second_network();
    let (saver, loader) = (unique_id("tpl2-save"), unique_id("tpl2-load"));
    run_pod_on_two_networks(&s, &net, &saver);
    run_pod_on_two_networks(&s, &net, &loader);
    assert_saved_and_loaded(&s.containerd_log()[log_before..], &saver, &loader);
}

/// Asserts that containerd's `log` says pod `saver` saved a template and pod `loader` loaded
/// one.
pub(crate) fn assert_saved_and_loaded(log: &str, saver: &str, loader: &str) {
    assert!(
        log.contains(&format!("pod {saver}: saved template")),
        "{log}"
    );
    assert!(
        log.contains(&format!("pod {loader}: loaded template")),
        "{log}"
    );
}
