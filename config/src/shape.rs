//! The VM shape and options: what the node allows combined with what the pod asked for.

use crate::{CpuModel, DiskDriver, Error, GuestConfig, PodAnnotations};

/// The rest of a pod's VM: machine type, CPU model, kernel parameters, disk driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmOptions {
    pub machine: String,
    /// None: the host's CPU under KVM, QEMU's default under TCG.
    pub cpu_model: Option<CpuModel>,
    /// The node's `guest.kernel_params`, then the pod's.
    pub kernel_params: String,
    pub disk_driver: DiskDriver,
}

impl VmOptions {
    /// The pod's choices where it made them (already allowlisted and checked), the node's
    /// otherwise.
    pub fn resolve(guest: &GuestConfig, pod: &PodAnnotations) -> Self {
        let kernel_params = [
            guest.kernel_params.trim(),
            pod.kernel_params.as_deref().unwrap_or(""),
        ]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
        Self {
            machine: pod.machine.clone().unwrap_or_else(|| guest.machine.clone()),
            cpu_model: pod.cpu_model.clone(),
            kernel_params,
            disk_driver: pod.disk_driver.unwrap_or_default(),
        }
    }
}

/// vCPUs and memory of one pod's VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmShape {
    pub vcpus: u32,
    pub memory_mib: u64,
}

impl VmShape {
    /// Annotations win over the node defaults; asking for more than the node's maximum is an
    /// error naming the annotation.
    pub fn resolve(guest: &GuestConfig, pod: &PodAnnotations) -> Result<Self, Error> {
        let vcpus = pod.vcpus.unwrap_or(guest.vcpus);
        if vcpus > guest.max_vcpus {
            return Err(Error::InvalidAnnotation {
                key: "vmlet.io/vcpus".into(),
                value: vcpus.to_string(),
                reason: format!("above the node maximum of {}", guest.max_vcpus),
            });
        }
        let memory_mib = pod.memory_mib.unwrap_or(guest.memory_mib);
        if memory_mib > guest.max_memory_mib {
            return Err(Error::InvalidAnnotation {
                key: "vmlet.io/memory".into(),
                value: format!("{memory_mib}Mi"),
                reason: format!("above the node maximum of {}Mi", guest.max_memory_mib),
            });
        }
        if memory_mib < 64 {
            return Err(Error::InvalidAnnotation {
                key: "vmlet.io/memory".into(),
                value: format!("{memory_mib}Mi"),
                reason: "a VM needs at least 64Mi".into(),
            });
        }
        Ok(Self { vcpus, memory_mib })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_without_annotations() {
        let g = GuestConfig::default();
        let s = VmShape::resolve(&g, &PodAnnotations::default()).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (g.vcpus, g.memory_mib));
    }

    #[test]
    fn annotations_override_defaults() {
        let pod = PodAnnotations {
            vcpus: Some(2),
            memory_mib: Some(512),
            ..Default::default()
        };
        let s = VmShape::resolve(&GuestConfig::default(), &pod).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (2, 512));
    }

    #[test]
    fn above_maximum_is_refused() {
        let pod = PodAnnotations {
            vcpus: Some(1000),
            memory_mib: None,
            ..Default::default()
        };
        let err = VmShape::resolve(&GuestConfig::default(), &pod).unwrap_err();
        assert!(err.to_string().contains("vmlet.io/vcpus"));
    }

    #[test]
    fn options_come_from_the_pod_then_the_node() {
        let guest = GuestConfig {
            kernel_params: "loglevel=3".into(),
            ..GuestConfig::default()
        };
        let o = VmOptions::resolve(&guest, &PodAnnotations::default());
        assert_eq!(o.machine, "q35");
        assert_eq!(o.kernel_params, "loglevel=3");
        assert_eq!(o.disk_driver, DiskDriver::Scsi);
        assert_eq!(o.cpu_model, None);
        let pod = PodAnnotations {
            machine: Some("pc-q35-7.2".into()),
            kernel_params: Some("mitigations=off".into()),
            disk_driver: Some(DiskDriver::Nvme),
            cpu_model: Some(CpuModel::HostModel),
            ..Default::default()
        };
        let o = VmOptions::resolve(&guest, &pod);
        assert_eq!(o.machine, "pc-q35-7.2");
        assert_eq!(o.kernel_params, "loglevel=3 mitigations=off");
        assert_eq!(o.disk_driver, DiskDriver::Nvme);
        assert_eq!(o.cpu_model, Some(CpuModel::HostModel));
    }

    #[test]
    fn tiny_memory_is_refused() {
        let pod = PodAnnotations {
            vcpus: None,
            memory_mib: Some(16),
            ..Default::default()
        };
        let err = VmShape::resolve(&GuestConfig::default(), &pod).unwrap_err();
        assert!(err.to_string().contains("vmlet.io/memory"));
    }
}
