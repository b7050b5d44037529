//! End to end: a VM-mode CRI pod's Kubernetes volumes and verbs (docs/vm-mode.md). A block
//! volume (the container's `devices`, as kubelet gives a `volumeDevice`) is a disk of the
//! VM that the guest finds by the volume's name under `/dev/disk/by-id/`, and what one pod
//! wrote on it the next pod reads; ContainerStats has the VM's CPU and memory, read from
//! QEMU's cgroup on the host. Run by `make test`.

use crate::block_devices::LoopDevice;
use crate::support::{stack, PodUnderTest};
use crate::vm_mode::{marker_in, vm_image, vm_pod};
use vmlet_integration::cri::Cri;
use vmlet_integration::{unique_id, Stack};

/// Waits for the volume's disk (plugged while the guest boots) and prints what `then` says.
fn user_data(then: &str) -> String {
    format!(
        r#"runcmd:
  - udevadm settle; for i in $(seq 60); do test -b /dev/disk/by-id/virtio-data && break; sleep 1; done
  - {then}
"#
    )
}

/// A VM-mode pod whose container has the loop device `device` at `/dev/data` and runs
/// `user_data`; returns the pod, its container and the marker line it printed.
async fn vm_pod_with_volume(
    s: &Stack,
    device: &str,
    user_data: String,
) -> (PodUnderTest, String, String) {
    let mut p = vm_pod(s, &user_data, &[]).await;
    let mut container = Cri::container_config(&p.config, "vm", &vm_image(), &[], 0);
    container.devices = vec![k8s_cri::v1::Device {
        container_path: "/dev/data".into(),
        host_path: device.into(),
        permissions: "rwm".into(),
    }];
    let (pod, config) = (p.pod.clone(), p.config.clone());
    let c = p
        .cri
        .create_and_start_config(&pod, &config, container)
        .await
        .unwrap();
    let name = config.metadata.as_ref().unwrap().name.clone();
    let marker = marker_in(&p.logs.join("vm.log"), &name, "v2").await;
    (p, c, marker)
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_block_volume_is_a_disk_of_the_vm_the_next_pod_reads_and_stats_are_the_vms() {
    let s = stack();
    let mut dev = LoopDevice::new(&s, &unique_id("vm-volume"));
    let write = user_data(
        r#"printf 'vmlet-volume-%s\n' "$(hostname)" | dd of=/dev/disk/by-id/virtio-data bs=512 count=1 conv=sync,fsync && echo "vmlet-marker $(hostname) wrote $(readlink -f /dev/disk/by-id/virtio-data)""#,
    );
    let (mut first, c, wrote) = vm_pod_with_volume(&s, &dev.device, write).await;
    let writer = first.config.metadata.as_ref().unwrap().name.clone();
    let stats = first.cri.cpu_and_working_set(&c).await;
    first.finish(&[&c]).await;
    assert!(
        wrote.contains(&format!("vmlet-marker {writer} wrote /dev/vd")),
        "{wrote}"
    );
    let (cpu, memory) = stats.expect("ContainerStats of a VM-mode pod");
    eprintln!("ContainerStats of the VM-mode pod: CPU {cpu} ns, working set {memory} bytes");
    // A VM that booted Debian under TCG used seconds of CPU and tens of MiB.
    assert!(cpu > 1_000_000_000, "CPU {cpu} ns");
    assert!(memory > 16 << 20, "memory {memory} bytes");

    let read = user_data(
        r#"echo "vmlet-marker $(hostname) read $(head -c 512 /dev/disk/by-id/virtio-data | head -n 1 | tr -cd 'a-z0-9-')""#,
    );
    let (second, c, marker) = vm_pod_with_volume(&s, &dev.device, read).await;
    let reader = second.config.metadata.as_ref().unwrap().name.clone();
    second.finish(&[&c]).await;
    assert!(
        marker.contains(&format!("vmlet-marker {reader} read vmlet-volume-{writer}")),
        "the second pod read {marker:?}, not what {writer} wrote"
    );
    let on_host = dev.detach_and_read(64);
    assert!(
        on_host.starts_with(format!("vmlet-volume-{writer}\n").as_bytes()),
        "the host's file holds {:?}",
        String::from_utf8_lossy(&on_host)
    );
}
