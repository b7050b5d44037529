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

/// The pod's resource limits, where it has them: CRI's sandbox annotations (the sum of the
/// containers' limits) or a plain task's own `linux.resources`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLimits {
    /// CPU quota over period, rounded up to whole vCPUs.
    pub vcpus: Option<u32>,
    /// Memory limit, rounded up to whole MiB.
    pub memory_mib: Option<u64>,
}

impl PodLimits {
    /// From a CPU quota and period (microseconds; a quota <= 0 means none) and a memory
    /// limit in bytes (<= 0: none).
    pub fn from_cgroup_values(quota: i64, period: u64, memory_bytes: i64) -> Self {
        let period = if period == 0 { 100_000 } else { period };
        Self {
            vcpus: (quota > 0).then(|| (quota as u64).div_ceil(period).min(u32::MAX as u64) as u32),
            memory_mib: (memory_bytes > 0).then(|| (memory_bytes as u64).div_ceil(1 << 20)),
        }
    }
}

/// Why a VM has the shape it has, for the shim's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeSource {
    Annotation,
    /// The pod's limit plus the node's overhead.
    Limits,
    /// The limit plus overhead was above the node's maximum, which was used instead.
    LimitsCapped,
    Default,
}

impl VmShape {
    /// The rule, for each of vCPUs and memory: the pod's annotation if it set one (above the
    /// node's maximum is an error naming it, and so is one above the pod's limit plus the
    /// overhead unless `beyond_limits`); else the pod's limit plus the node's overhead, at
    /// most the node's maximum; else the node's default.
    pub fn resolve(
        guest: &GuestConfig,
        pod: &PodAnnotations,
        limits: &PodLimits,
        beyond_limits: bool,
    ) -> Result<(Self, [ShapeSource; 2]), Error> {
        if !beyond_limits {
            within_limits(guest, pod, limits)?;
        }
        let sized =
            |annotation: Option<u64>, limit: Option<u64>, overhead: u64, max: u64, default: u64| {
                match (annotation, limit) {
                    (Some(v), _) => (v, ShapeSource::Annotation),
                    (None, Some(l)) if l.saturating_add(overhead) > max => {
                        (max, ShapeSource::LimitsCapped)
                    }
                    (None, Some(l)) => (l + overhead, ShapeSource::Limits),
                    (None, None) => (default, ShapeSource::Default),
                }
            };
        let (vcpus, vcpu_source) = sized(
            pod.vcpus.map(u64::from),
            limits.vcpus.map(u64::from),
            u64::from(guest.overhead_vcpus),
            u64::from(guest.max_vcpus),
            u64::from(guest.vcpus),
        );
        let vcpus = vcpus as u32;
        let (memory_mib, memory_source) = sized(
            pod.memory_mib,
            limits.memory_mib,
            guest.overhead_memory_mib,
            guest.max_memory_mib,
            guest.memory_mib,
        );
        if vcpus > guest.max_vcpus {
            return Err(Error::InvalidAnnotation {
                key: "vmlet.io/vcpus".into(),
                value: vcpus.to_string(),
                reason: format!("above the node maximum of {}", guest.max_vcpus),
            });
        }
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
        Ok((Self { vcpus, memory_mib }, [vcpu_source, memory_source]))
    }
}

/// Refuses a sizing annotation above the pod's limit plus the node's overhead (a pod
/// without a limit has nothing to exceed).
fn within_limits(
    guest: &GuestConfig,
    pod: &PodAnnotations,
    limits: &PodLimits,
) -> Result<(), Error> {
    if let (Some(asked), Some(limit)) = (pod.vcpus, limits.vcpus) {
        let most = limit.saturating_add(guest.overhead_vcpus);
        if asked > most {
            return Err(Error::AnnotationBeyondLimits {
                key: "vmlet.io/vcpus".into(),
                value: asked.to_string(),
                limit: most.to_string(),
            });
        }
    }
    if let (Some(asked), Some(limit)) = (pod.memory_mib, limits.memory_mib) {
        let most = limit.saturating_add(guest.overhead_memory_mib);
        if asked > most {
            return Err(Error::AnnotationBeyondLimits {
                key: "vmlet.io/memory".into(),
                value: format!("{asked}Mi"),
                limit: format!("{most}Mi"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_without_annotations() {
        let g = GuestConfig::default();
        let (s, _) =
            VmShape::resolve(&g, &PodAnnotations::default(), &PodLimits::default(), false).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (g.vcpus, g.memory_mib));
    }

    #[test]
    fn annotations_override_defaults() {
        let pod = PodAnnotations {
            vcpus: Some(2),
            memory_mib: Some(512),
            ..Default::default()
        };
        let limits = PodLimits::from_cgroup_values(400_000, 100_000, 1 << 30);
        let (s, source) = VmShape::resolve(&GuestConfig::default(), &pod, &limits, false).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (2, 512));
        assert_eq!(source, [ShapeSource::Annotation; 2]);
    }

    #[test]
    fn annotations_beyond_the_pods_limits_need_the_nodes_leave() {
        let pod = PodAnnotations {
            vcpus: Some(2),
            memory_mib: Some(2048),
            ..Default::default()
        };
        // 1 CPU and 1 GiB: at most 1 vCPU and 1024 + 128 MiB.
        let limits = PodLimits::from_cgroup_values(100_000, 100_000, 1 << 30);
        let g = GuestConfig::default();
        let err = VmShape::resolve(&g, &pod, &limits, false).unwrap_err();
        assert!(
            matches!(&err, Error::AnnotationBeyondLimits { key, value, limit }
                if key == "vmlet.io/vcpus" && value == "2" && limit == "1"),
            "{err}"
        );
        let cpu_ok = PodAnnotations {
            vcpus: Some(1),
            ..pod.clone()
        };
        let err = VmShape::resolve(&g, &cpu_ok, &limits, false).unwrap_err();
        assert!(
            err.to_string()
                .contains("2048Mi is above the pod's limit of 1152Mi"),
            "{err}"
        );
        let (s, _) = VmShape::resolve(&g, &pod, &limits, true).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (2, 2048));
        // No limits: nothing to exceed.
        let (s, _) = VmShape::resolve(&g, &pod, &PodLimits::default(), false).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (2, 2048));
    }

    #[test]
    fn above_maximum_is_refused() {
        let pod = PodAnnotations {
            vcpus: Some(1000),
            memory_mib: None,
            ..Default::default()
        };
        let err = VmShape::resolve(&GuestConfig::default(), &pod, &PodLimits::default(), false)
            .unwrap_err();
        assert!(err.to_string().contains("vmlet.io/vcpus"));
    }

    #[test]
    fn limits_plus_overhead_size_the_vm_up_to_the_maximum() {
        let g = GuestConfig::default();
        // 1 CPU, 300 MiB: 1 + 0 vCPUs, 300 + 128 MiB.
        let limits = PodLimits::from_cgroup_values(100_000, 100_000, 300 << 20);
        let (s, source) = VmShape::resolve(&g, &PodAnnotations::default(), &limits, false).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (1, 428));
        assert_eq!(source, [ShapeSource::Limits; 2]);
        // 1.5 CPUs round up; a part of a MiB rounds up.
        let limits = PodLimits::from_cgroup_values(150_000, 100_000, (300 << 20) + 1);
        assert_eq!(
            limits,
            PodLimits {
                vcpus: Some(2),
                memory_mib: Some(301)
            }
        );
        // Above the node's maximum: the maximum.
        let limits = PodLimits::from_cgroup_values(64 * 100_000, 100_000, 64 << 30);
        let (s, source) = VmShape::resolve(&g, &PodAnnotations::default(), &limits, false).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (g.max_vcpus, g.max_memory_mib));
        assert_eq!(source, [ShapeSource::LimitsCapped; 2]);
        // No limits: none.
        assert_eq!(
            PodLimits::from_cgroup_values(-1, 0, 0),
            PodLimits::default()
        );
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
        let err = VmShape::resolve(&GuestConfig::default(), &pod, &PodLimits::default(), false)
            .unwrap_err();
        assert!(err.to_string().contains("vmlet.io/memory"));
    }
}
