//! End to end: a loop device given to a container as a raw block device (`ctr run --device`,
//! which puts it into the spec's `linux.devices`) is hot-plugged into the pod's VM with the
//! pod's disk driver, appears in the container at its path, and what the container writes
//! is on the host's backing file after the pod ended. Through CRI, a container created in a
//! running pod gets its disk hot-plugged, and gives it back when it is removed. Run by
//! `make test`.

use crate::support::{stack, text};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vmlet_integration::cri::Cri;
use vmlet_integration::{unique_id, Stack};

/// A loop device over a 4 MiB file under the stack directory, detached when dropped.
pub(crate) struct LoopDevice {
    pub(crate) device: String,
    file: PathBuf,
}

impl LoopDevice {
    pub(crate) fn new(s: &Stack, name: &str) -> Self {
        let file = PathBuf::from(&s.dir).join(format!("{name}.img"));
        std::fs::write(&file, vec![0u8; 4 << 20]).unwrap();
        Self::attach(file)
    }

    /// A device of `size` bytes over a sparse file in `/var/tmp` (the node's disk, not the
    /// stack's tmpfs).
    pub(crate) fn sparse(name: &str, size: u64) -> Self {
        let file = PathBuf::from("/var/tmp").join(format!("{name}.img"));
        std::fs::File::create(&file).unwrap().set_len(size).unwrap();
        Self::attach(file)
    }

    fn attach(file: PathBuf) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .expect("losetup (util-linux) is needed");
        assert!(out.status.success(), "losetup: {}", text(&out.stderr));
        LoopDevice {
            device: text(&out.stdout).trim().to_owned(),
            file,
        }
    }

    /// Detaches the device and returns the start of the backing file.
    pub(crate) fn detach_and_read(&mut self, len: usize) -> Vec<u8> {
        self.detach();
        let data = std::fs::read(&self.file).unwrap();
        data[..len].to_vec()
    }

    fn detach(&mut self) {
        if !self.device.is_empty() {
            let status = Command::new("losetup")
                .args(["-d", &self.device])
                .status()
                .unwrap();
            assert!(status.success(), "losetup -d {}", self.device);
            self.device.clear();
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if !self.device.is_empty() {
            let _ = Command::new("losetup").args(["-d", &self.device]).status();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Runs a container of a pod with disk driver `driver` that is given a loop device, checks
/// the guest's name for the disk and the node in the container, and writes a marker that
/// must reach the host.
fn loop_device_reaches_the_container(driver: &str, guest_prefix: &str) {
    let s = stack();
    let mut dev = LoopDevice::new(&s, &unique_id(&format!("blk-{driver}")));
    let marker = format!("vmlet-block-{driver}");
    let script = format!(
        "set -e; test -b {d}; ls /sys/block; \
         printf '{marker}' | dd of={d} bs=512 count=1 conv=sync,fsync 2>/dev/null; \
         dd if={d} bs=512 count=1 2>/dev/null | head -c {n}; echo",
        d = dev.device,
        n = marker.len()
    );
    let annotation = format!("vmlet.io/disk-driver={driver}");
    let out = s
        .run(
            &unique_id(&format!("blk-{driver}")),
            &["--device", &dev.device, "--annotation", &annotation],
            &["sh", "-c", &script],
        )
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let disks: Vec<&str> = stdout.lines().filter(|l| !l.contains(&marker)).collect();
    assert!(
        disks.iter().any(|d| d.starts_with(guest_prefix)),
        "the guest should see a {guest_prefix}* disk; /sys/block: {disks:?}"
    );
    assert!(
        stdout.lines().any(|l| l == marker),
        "the container reads back what it wrote: {stdout}"
    );
    let on_host = dev.detach_and_read(marker.len());
    assert_eq!(
        text(&on_host),
        marker,
        "the host's backing file after the pod ended"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn virtio_disk_appears_as_vd() {
    loop_device_reaches_the_container("virtio", "vd");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn scsi_disk_appears_as_sd() {
    loop_device_reaches_the_container("scsi", "sd");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn nvme_disk_appears_as_nvme() {
    loop_device_reaches_the_container("nvme", "nvme");
}

/// Runs a CRI container with `device` at `container_path` and returns its log once it
/// exited; the container is removed (which unplugs its disk).
async fn cri_container_with_device(
    cri: &mut Cri,
    pod: &str,
    config: &k8s_cri::v1::PodSandboxConfig,
    logs: &Path,
    (name, image, script): (&str, &str, &str),
    (device, container_path): (&str, &str),
) -> String {
    let mut container = Cri::container_config(config, name, image, &["sh", "-c", script], 0);
    container.devices = vec![k8s_cri::v1::Device {
        container_path: container_path.into(),
        host_path: device.into(),
        permissions: "rwm".into(),
    }];
    let id = cri
        .create_and_start_config(pod, config, container)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = cri.container_status(&id).await.unwrap();
        if status.state == k8s_cri::v1::ContainerState::ContainerExited as i32
            || Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cri.remove_container(&id, 2).await.unwrap();
    std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_containers_get_their_disk_hot_plugged_and_give_it_back() {
    let s = stack();
    let mut dev = LoopDevice::new(&s, &unique_id("blk-cri"));
    let mut cri = Cri::connect(&s.containerd).await.unwrap();
    let logs = std::env::temp_dir().join(unique_id("vmlet-cri-logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let mut config = Cri::pod_config(
        &unique_id("cri-blk"),
        &unique_id("uid"),
        &logs.to_string_lossy(),
    );
    // Through the CRI plugin's pod_annotations (deploy/containerd-vmlet-v2.toml, -v3.toml).
    config
        .annotations
        .insert("vmlet.io/disk-driver".into(), "nvme".into());
    let pod = cri.run_pod(&config, "vmlet").await.unwrap();

    let marker = "vmlet-block-cri";
    let write = format!(
        "test -b /dev/xvda && ls /sys/block && printf '{marker}' | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync && echo WROTE"
    );
    let first = cri_container_with_device(
        &mut cri,
        &pod,
        &config,
        &logs,
        ("c1", &s.image, &write),
        (&dev.device, "/dev/xvda"),
    )
    .await;
    // The second container's disk is plugged after the first one's was unplugged: the
    // guest sees exactly one NVMe disk again, with what the first container wrote.
    let read = format!(
        "test -b /dev/xvdb && echo DISKS $(ls /sys/block | grep -c nvme) && dd if=/dev/xvdb bs=512 count=1 2>/dev/null | head -c {}; echo",
        marker.len()
    );
    let second = cri_container_with_device(
        &mut cri,
        &pod,
        &config,
        &logs,
        ("c2", &s.image, &read),
        (&dev.device, "/dev/xvdb"),
    )
    .await;
    cri.remove_pod(&pod).await.unwrap();
    let _ = std::fs::remove_dir_all(&logs);

    assert!(
        first.contains("nvme0n1") && first.contains("WROTE"),
        "first container:\n{first}"
    );
    assert!(second.contains("DISKS 1"), "second container:\n{second}");
    assert!(second.contains(marker), "second container:\n{second}");
    let on_host = dev.detach_and_read(marker.len());
    assert_eq!(
        text(&on_host),
        marker,
        "the host's backing file after the pod ended"
    );
    assert!(!s.has_pod_domain(&pod), "the pod's VM is left");
}
