//! A VM-image pod's part of a create's plan ([`super::plan`]): a Virtlet-named image only
//! in a VM-mode pod, the pod's hold and a container's boot in it, and the image's boot
//! request (cloud-init's inputs, its disks and the block volume its root may live on),
//! each refused by name where the pod cannot have it.

use oci_spec::runtime::Spec;
use vmlet_config::{CloudInitNetwork, PodAnnotations};

use crate::devices::block_devices::BlockDevice;
use crate::spec::hooks::{HookState, HostHooks};
use crate::vm::pod_vm::{BootRequest, ImagePod, ImageRequest, PodHold, PodVm};
use crate::vmm::vm_spec::RootBus;
use crate::Error;

/// A container whose image is named as Virtlet named its VM images (`virtlet.cloud/...`)
/// is a VM image: its pod must be a VM-mode one, else FAILED_PRECONDITION names the remedy.
pub(super) fn check_virtlet_image(
    id: &str,
    annotations: &std::collections::HashMap<String, String>,
    vm_image: bool,
) -> Result<(), Error> {
    let Some(image) = annotations.get(crate::spec::IMAGE_NAME_ANNOTATION) else {
        return Ok(());
    };
    let virtlet = image
        .strip_prefix(vmlet_config::VIRTLET_RUNTIME)
        .is_some_and(|rest| rest.starts_with('/'));
    if virtlet && !vm_image {
        return Err(Error::FailedPrecondition(format!(
            "container {id}: its image {image:?} is named as Virtlet named VM images, but its pod is not a VM-mode pod: annotate the pod {}: {} (as Virtlet's pods are) or vmlet.io/image-type: vm",
            vmlet_config::TARGET_RUNTIME_KEY,
            vmlet_config::VIRTLET_RUNTIME
        )));
    }
    Ok(())
}

/// A VM-mode CRI pod's container `id` boots in the pod `sandbox_id` its running `sandbox`
/// holds: in the pod's network namespace, with the pod's identity for cloud-init.
pub(super) fn in_image_pod(
    id: &str,
    sandbox_id: &str,
    sandbox: &dyn PodVm,
    boot: &mut BootRequest,
) -> Result<(), Error> {
    let pod = sandbox.image_pod().ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "container {id} is a VM image (vmlet.io/image-type: vm) but its pod {sandbox_id} is not a VM-mode pod: the annotation is the pod's"
        ))
    })?;
    sandbox.check_running()?;
    boot.sandbox_id = Some(sandbox_id.to_owned());
    boot.netns = pod.netns.clone();
    if let Some(image) = boot.image.as_mut() {
        image.instance_id = pod.instance_id.clone();
        image.hostname = pod.hostname.clone();
    }
    Ok(())
}

/// A VM-mode CRI pod's sandbox: its network namespace and cgroup, held by the pod's host
/// process; cloud-init's instance id is the pod's UID and the host name the pod's (the
/// spec's, else the pod's name), each else the sandbox's id.
pub(super) fn pod_hold(
    id: &str,
    spec: &Spec,
    hooks: &HostHooks,
    hook_state: &HookState,
) -> Result<PodHold, Error> {
    let netns = crate::spec::network_namespace(spec)?;
    let (instance_id, hostname) = crate::spec::bundle::pod_identity(spec, id);
    Ok(PodHold {
        pod_id: id.to_owned(),
        netns: netns.clone(),
        cgroup: crate::spec::bundle::cgroup(spec)?,
        create_hooks: hooks.create.clone(),
        hook_state: hook_state.clone(),
        pod: ImagePod::new(netns, instance_id, hostname),
    })
}

/// A VM image's boot (docs/vm-mode.md): cloud-init's instance is the task, its host name
/// the spec's (else the task's id), its user-data and keys the annotations', and the
/// spec's environment goes into the guest's `/etc/cloud/environment`; its block devices
/// are the VM's disks, named by their paths.
pub(super) fn image_request(
    id: &str,
    spec: &Spec,
    pod: &PodAnnotations,
    block_devices: &[BlockDevice],
) -> Result<ImageRequest, Error> {
    let (mut slash, others): (Vec<_>, Vec<_>) =
        block_devices.iter().cloned().partition(|d| d.path == "/");
    if slash.len() > 1 {
        return Err(Error::InvalidArgument(format!(
            "container {id}: {} block devices at /",
            slash.len()
        )));
    }
    let mut disks = crate::devices::block_devices::named(&others)?;
    let root_volume = take_root_volume(id, pod, &mut disks, slash.pop())?;
    check_disks(id, pod, &disks, root_volume.as_ref())?;
    Ok(ImageRequest {
        root_volume_mib: pod.root_volume_mib,
        instance_id: id.to_owned(),
        hostname: crate::spec::bundle::hostname(spec).unwrap_or_else(|| id.to_owned()),
        user_data: pod.cloud_init_user_data.clone(),
        user_data_script: pod.cloud_init_user_data_script.clone(),
        user_data_overwrite: pod.cloud_init_user_data_overwrite,
        meta_data: pod.cloud_init_meta_data.clone(),
        seed_source: pod.seed_source.unwrap_or_default(),
        ssh_keys: pod.ssh_keys.clone().unwrap_or_default(),
        env: crate::spec::bundle::env(spec),
        resolv_conf: crate::spec::bundle::resolv_conf(spec),
        network_config: pod.cloud_init_network.unwrap_or_default() == CloudInitNetwork::V2,
        root_bus: RootBus::of(pod.disk_driver),
        firmware: pod.firmware.unwrap_or_default(),
        disks,
        volumes: Vec::new(),
        root_volume,
    })
}

/// The block volume the root lives on: the one `vmlet.io/root-volume` names, taken out of
/// `disks`, or the one at `/` (Virtlet's spelling, `slash`). It must be written to (a
/// read-only one cannot hold a root) and on a disk bus libvirt attaches (not NVMe).
pub(super) fn take_root_volume(
    id: &str,
    pod: &PodAnnotations,
    disks: &mut Vec<BlockDevice>,
    slash: Option<BlockDevice>,
) -> Result<Option<BlockDevice>, Error> {
    let what = match (&pod.root_volume, &slash) {
        (None, None) => return Ok(None),
        (Some(name), None) => format!("vmlet.io/root-volume {name:?}"),
        (None, Some(_)) => "the block device at / (a persistent root)".to_owned(),
        (Some(name), Some(_)) => {
            return Err(Error::InvalidArgument(format!(
                "container {id}: vmlet.io/root-volume {name:?} and a block device at / both name the root volume"
            )))
        }
    };
    let refused = |why: String| Error::InvalidArgument(format!("container {id}: {what}: {why}"));
    if pod.disk_driver == Some(vmlet_config::DiskDriver::Nvme) {
        return Err(refused(
            "a root volume is attached as virtio or scsi, not nvme (vmlet.io/disk-driver)".into(),
        ));
    }
    if pod.root_volume_mib.is_some() {
        return Err(refused(
            "a root on a block volume is that volume's size (no vmlet.io/root-volume-size or VirtletRootVolumeSize)".into(),
        ));
    }
    let volume = match (&pod.root_volume, slash) {
        (_, Some(slash)) => slash,
        (Some(name), None) => {
            let Some(at) = disks.iter().position(|d| d.serial.as_deref() == Some(name)) else {
                let names: Vec<_> = disks.iter().map(|d| d.path.as_str()).collect();
                return Err(refused(format!(
                    "the container has no block device whose path ends in {name:?} (its devices: {})",
                    if names.is_empty() { "none".into() } else { names.join(", ") }
                )));
            };
            disks.remove(at)
        }
        (None, None) => return Ok(None),
    };
    if volume.readonly {
        return Err(refused(format!(
            "{} is read-only to the container, and the guest writes its root",
            volume.path
        )));
    }
    Ok(Some(volume))
}

/// A VM image's disks (its block devices but the root volume): on a PCI disk driver
/// (virtio, NVMe) each takes one of the VM's hot-plug ports, so more are refused by name;
/// one host device given twice (two disks, or a disk and the root) is refused too.
pub(super) fn check_disks(
    id: &str,
    pod: &PodAnnotations,
    disks: &[BlockDevice],
    root: Option<&BlockDevice>,
) -> Result<(), Error> {
    let driver = pod.disk_driver.unwrap_or(vmlet_config::DiskDriver::Virtio);
    let ports = crate::vmm::pci_slots::HOTPLUG_PORTS;
    if driver != vmlet_config::DiskDriver::Scsi && disks.len() > ports {
        return Err(Error::InvalidArgument(format!(
            "container {id}: {} block devices, and a VM-mode pod takes at most {ports} on {} (each its own PCI port; vmlet.io/disk-driver: scsi puts any number on one controller)",
            disks.len(),
            driver.as_str()
        )));
    }
    let all: Vec<&BlockDevice> = root.into_iter().chain(disks).collect();
    for (n, a) in all.iter().enumerate() {
        if let Some(b) = all[..n]
            .iter()
            .find(|b| (b.major, b.minor) == (a.major, a.minor))
        {
            return Err(Error::InvalidArgument(format!(
                "container {id}: block devices {:?} and {:?} are one host device ({}:{}), which a VM takes once",
                b.path, a.path, a.major, a.minor
            )));
        }
    }
    Ok(())
}
