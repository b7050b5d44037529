//! The VM shape: what the node allows combined with what the pod asked for.

use crate::{Error, GuestConfig, PodAnnotations};

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
        };
        let s = VmShape::resolve(&GuestConfig::default(), &pod).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (2, 512));
    }

    #[test]
    fn above_maximum_is_refused() {
        let pod = PodAnnotations {
            vcpus: Some(1000),
            memory_mib: None,
        };
        let err = VmShape::resolve(&GuestConfig::default(), &pod).unwrap_err();
        assert!(err.to_string().contains("vmlet.io/vcpus"));
    }

    #[test]
    fn tiny_memory_is_refused() {
        let pod = PodAnnotations {
            vcpus: None,
            memory_mib: Some(16),
        };
        let err = VmShape::resolve(&GuestConfig::default(), &pod).unwrap_err();
        assert!(err.to_string().contains("vmlet.io/memory"));
    }
}
