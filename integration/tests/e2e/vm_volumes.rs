//! End to end: a VM-mode CRI pod's Kubernetes volumes and verbs (docs/vm-mode.md). A block
//! volume (the container's `devices`, as kubelet gives a `volumeDevice`) is a disk of the
//! VM that the guest finds by the volume's name under `/dev/disk/by-id/`, and what one pod
//! wrote on it the next pod reads; ContainerStats has the VM's CPU and memory, read from
//! QEMU's cgroup on the host. Filesystem volumes (a configMap's directory as kubelet writes
//! it, a read-write emptyDir) are mounted at their paths by the seed over virtio-fs: an
//! update of the configMap is seen, a write to the emptyDir reaches the host, and the guest
//! can neither write the read-only one nor see anything of the host but its volumes. A
//! persistent root (`vmlet.io/root-volume`) keeps the guest's files from one pod to the next,
//! and is booted raw whatever its bytes say. Run by `make test`.

use std::process::Command;

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
    let (p, c) = vm_pod_with_device(s, "/dev/data", device, &user_data, &[]).await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
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

/// A directory laid out as kubelet's atomic writer leaves a configMap volume: the data in a
/// timestamped directory, `..data` naming it, each key a link through `..data`; removed on
/// drop.
struct ConfigMapDir(std::path::PathBuf);

impl ConfigMapDir {
    fn new(value: &str) -> Self {
        let dir = std::env::temp_dir().join(unique_id("vm-configmap"));
        std::fs::create_dir(&dir).unwrap();
        let it = ConfigMapDir(dir);
        it.publish("..2026_11_29_first", value);
        std::os::unix::fs::symlink("..data/key", it.0.join("key")).unwrap();
        it
    }

    /// Writes `value` into a new data directory and swaps `..data` to it with a rename, as
    /// kubelet updates a configMap volume.
    fn publish(&self, version: &str, value: &str) {
        std::fs::create_dir(self.0.join(version)).unwrap();
        std::fs::write(self.0.join(version).join("key"), value).unwrap();
        let _ = std::fs::remove_file(self.0.join("..data_tmp"));
        std::os::unix::fs::symlink(version, self.0.join("..data_tmp")).unwrap();
        std::fs::rename(self.0.join("..data_tmp"), self.0.join("..data")).unwrap();
    }
}

impl Drop for ConfigMapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `command` through the guest agent; its stdout, trimmed, and exit code.
async fn in_guest(p: &mut PodUnderTest, c: &str, command: &str) -> (String, i32) {
    let r = p
        .cri
        .exec_sync(c, &["sh", "-c", command], 30)
        .await
        .expect("an exec through the guest agent");
    (
        String::from_utf8_lossy(&r.stdout).trim().to_owned(),
        r.exit_code,
    )
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn filesystem_volumes_are_mounted_a_config_map_update_is_seen_and_read_only_holds() {
    let s = stack();
    let config = ConfigMapDir::new("first-value");
    let scratch = std::env::temp_dir().join(unique_id("vm-emptydir"));
    std::fs::create_dir(&scratch).unwrap();
    let _scratch = scopeguard(scratch.clone());
    let mut p = vm_pod(
        &s,
        "runcmd:\n  - echo \"vmlet-marker $(hostname) $(cat /etc/app/key)\"\n",
        &[],
    )
    .await;
    let mut container = Cri::container_config(&p.config, "vm", &vm_image(), &[], 0);
    container.mounts = vec![
        k8s_cri::v1::Mount {
            container_path: "/etc/app".into(),
            host_path: config.0.to_string_lossy().into_owned(),
            readonly: true,
            ..Default::default()
        },
        k8s_cri::v1::Mount {
            container_path: "/scratch".into(),
            host_path: scratch.to_string_lossy().into_owned(),
            ..Default::default()
        },
    ];
    let (pod, pod_config) = (p.pod.clone(), p.config.clone());
    let c = p
        .cri
        .create_and_start_config(&pod, &pod_config, container)
        .await
        .unwrap();
    let name = pod_config.metadata.as_ref().unwrap().name.clone();
    let marker = marker_in(&p.logs.join("vm.log"), &name, "v2").await;

    config.publish("..2026_11_29_second", "second-value");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let updated = loop {
        let (value, _) = in_guest(&mut p, &c, "cat /etc/app/key").await;
        if value == "second-value" || std::time::Instant::now() > deadline {
            break value;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let (_, wrote) = in_guest(&mut p, &c, "echo from-the-guest > /scratch/out").await;
    // The attack: write the read-only volume, first as mounted, then remounted read-write.
    let (_, plain) = in_guest(&mut p, &c, "echo x > /etc/app/planted").await;
    // The guest's own remounts work (its mounts are its own)...
    let remount = "mount -o remount,rw /etc/app && mount -o remount,rw /run/vmlet/volumes \
                   && awk '$2 == \"/etc/app\" {print $4}' /proc/mounts | tail -n 1 | cut -d, -f1";
    let (mode, remounts) = in_guest(&mut p, &c, remount).await;
    // ...and change nothing on the host's side.
    let (_, remounted) = in_guest(&mut p, &c, "echo x > /etc/app/planted").await;
    let (_, share_rw) = in_guest(&mut p, &c, "echo x > /run/vmlet/volumes/planted").await;
    let (listing, _) = in_guest(&mut p, &c, "ls -A /run/vmlet/volumes | tr '\\n' ' '").await;
    p.finish(&[&c]).await;

    assert!(
        marker.ends_with(&format!("vmlet-marker {name} first-value")),
        "{marker}"
    );
    assert_eq!(
        updated, "second-value",
        "the configMap's update in the guest"
    );
    assert_eq!(wrote, 0);
    assert_eq!(
        std::fs::read_to_string(scratch.join("out")).unwrap(),
        "from-the-guest\n"
    );
    assert_ne!(plain, 0, "a write to the read-only volume succeeded");
    assert_eq!((remounts, mode.as_str()), (0, "rw"), "the guest's remounts");
    assert_ne!(
        remounted, 0,
        "a write after remounting it read-write succeeded"
    );
    assert_ne!(share_rw, 0, "a write to the share's top succeeded");
    assert!(!config.0.join("planted").exists());
    // The two volumes, by number: not the runtime's files, not the container's root file
    // system (the image).
    let entries: Vec<_> = listing.split_whitespace().collect();
    assert!(
        entries.len() == 2 && entries.iter().all(|n| n.parse::<u32>().is_ok()),
        "the guest sees of the host: {listing}"
    );
}

/// Removes a test directory on drop.
fn scopeguard(dir: std::path::PathBuf) -> impl Drop {
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    Remove(dir)
}

/// A VM-mode pod booted from the block volume `device` with `user_data`: named by
/// `vmlet.io/root-volume`, or (`at_slash`, Virtlet's way) given at `/`; the pod and its
/// container.
async fn vm_pod_on_root(
    s: &Stack,
    device: &str,
    user_data: &str,
    at_slash: bool,
) -> (PodUnderTest, String) {
    if at_slash {
        vm_pod_with_device(s, "/", device, user_data, &[]).await
    } else {
        let named = [("vmlet.io/root-volume", "vm-root")];
        vm_pod_with_device(s, "/dev/vm-root", device, user_data, &named).await
    }
}

/// A VM-mode pod with `annotations` whose container has the host's `device` at `path` and
/// runs `user_data`; the pod and its container.
async fn vm_pod_with_device(
    s: &Stack,
    path: &str,
    device: &str,
    user_data: &str,
    annotations: &[(&str, &str)],
) -> (PodUnderTest, String) {
    let mut p = vm_pod(s, user_data, annotations).await;
    let mut container = Cri::container_config(&p.config, "vm", &vm_image(), &[], 0);
    container.devices = vec![k8s_cri::v1::Device {
        container_path: path.into(),
        host_path: device.into(),
        permissions: "rwm".into(),
    }];
    let (pod, config) = (p.pod.clone(), p.config.clone());
    let c = p
        .cri
        .create_and_start_config(&pod, &config, container)
        .await
        .unwrap();
    (p, c)
}

/// Whether any process on the node has `path` open.
fn open_anywhere(path: &std::path::Path) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .any(|process| {
            std::fs::read_dir(process.path().join("fd"))
                .map(|fds| {
                    fds.flatten()
                        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
                })
                .unwrap_or(false)
        })
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_persistent_root_keeps_the_guests_files_and_is_booted_raw() {
    let s = stack();
    let id = unique_id("vm-root");
    let mut dev = LoopDevice::sparse(&id, 1 << 30);
    // A pod on the volume that runs `command`: its name and marker line.
    let on_root = |command: &'static str, at_slash: bool| {
        let (s, device) = (&s, dev.device.clone());
        async move {
            let user_data = format!("runcmd:\n  - {command}\n");
            let (p, c) = vm_pod_on_root(s, &device, &user_data, at_slash).await;
            let name = p.config.metadata.as_ref().unwrap().name.clone();
            let marker = marker_in(&p.logs.join("vm.log"), &name, "v2").await;
            p.finish(&[&c]).await;
            (name, marker)
        }
    };
    let (writer, kept) = on_root(
        r#"hostname > /var/lib/vmlet-kept && sync && echo "vmlet-marker $(hostname) kept""#,
        false,
    )
    .await;
    // The next pod names it Virtlet's way.
    let (reader, found) = on_root(
        r#"echo "vmlet-marker $(hostname) found $(cat /var/lib/vmlet-kept)""#,
        true,
    )
    .await;
    assert!(
        kept.ends_with(&format!("vmlet-marker {writer} kept")),
        "{kept}"
    );
    assert!(
        found.ends_with(&format!("vmlet-marker {reader} found {writer}")),
        "the second pod found {found:?}, not what {writer} wrote"
    );

    // The attack: the volume's user puts a qcow2 header naming a host file where the guest's
    // disk starts; the VM boots it raw, and nothing opens that file.
    let secret = std::path::PathBuf::from("/var/tmp").join(format!("{id}.secret"));
    std::fs::write(&secret, b"node secret").unwrap();
    let _secret = scopeguard(secret.clone());
    let planted = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&secret)
        .arg(format!("/var/tmp/{id}.qcow2"))
        .arg("64M")
        .status()
        .unwrap();
    assert!(planted.success());
    let header = std::fs::read(format!("/var/tmp/{id}.qcow2")).unwrap();
    let _ = std::fs::remove_file(format!("/var/tmp/{id}.qcow2"));
    {
        use std::os::unix::fs::FileExt;
        let volume = std::fs::OpenOptions::new()
            .write(true)
            .open(&dev.device)
            .unwrap();
        volume.write_all_at(&header, 1 << 20).unwrap();
        volume.sync_all().unwrap();
    }
    let (third, c) = vm_pod_on_root(&s, &dev.device, "runcmd: [true]\n", false).await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let opened = open_anywhere(&secret);
    third.finish(&[&c]).await;
    assert!(
        !opened,
        "the planted backing file {} was opened",
        secret.display()
    );
    let on_host = dev.detach_and_read(25);
    assert_eq!(on_host, b"vmlet persistent root v1\n", "vmlet's header");
}
