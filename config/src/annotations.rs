//! Pod annotations under `vmlet.io/`, parsed once from one table of keys.

use std::collections::HashMap;

use crate::{parse_memory_mib, Error};

/// Every vmlet annotation starts with this prefix.
pub const ANNOTATION_PREFIX: &str = "vmlet.io/";

/// A known annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnotationKey {
    /// `vmlet.io/vcpus`: a whole number of vCPUs, at least 1.
    Vcpus,
    /// `vmlet.io/memory`: a memory quantity (`512Mi`, `1Gi`).
    Memory,
}

/// The table of known annotations: the one place a key's name is written.
pub const ANNOTATION_KEYS: &[(&str, AnnotationKey)] = &[
    ("vmlet.io/vcpus", AnnotationKey::Vcpus),
    ("vmlet.io/memory", AnnotationKey::Memory),
];

/// What a pod asked for through its annotations. `None` means "not set".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAnnotations {
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u64>,
}

impl PodAnnotations {
    /// Parses the `vmlet.io/` annotations of an OCI spec; other annotations are not vmlet's
    /// and are left alone. An unknown `vmlet.io/` key or a bad value is an error naming it.
    pub fn parse<'a, I>(annotations: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        let mut parsed = PodAnnotations::default();
        for (key, value) in annotations {
            if !key.starts_with(ANNOTATION_PREFIX) {
                continue;
            }
            let Some((_, known)) = ANNOTATION_KEYS.iter().find(|(name, _)| name == key) else {
                return Err(Error::UnknownAnnotation {
                    key: key.clone(),
                    known: ANNOTATION_KEYS
                        .iter()
                        .map(|(name, _)| *name)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            let invalid = |reason: String| Error::InvalidAnnotation {
                key: key.clone(),
                value: value.clone(),
                reason,
            };
            match known {
                AnnotationKey::Vcpus => {
                    let vcpus: u32 = value
                        .trim()
                        .parse()
                        .map_err(|_| invalid("expected a whole number of vCPUs".into()))?;
                    if vcpus == 0 {
                        return Err(invalid("must be at least 1".into()));
                    }
                    parsed.vcpus = Some(vcpus);
                }
                AnnotationKey::Memory => {
                    parsed.memory_mib = Some(parse_memory_mib(value).map_err(invalid)?);
                }
            }
        }
        Ok(parsed)
    }

    /// Convenience for callers holding a map.
    pub fn from_map(annotations: &HashMap<String, String>) -> Result<Self, Error> {
        Self::parse(annotations.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<PodAnnotations, Error> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PodAnnotations::from_map(&map)
    }

    #[test]
    fn good_values() {
        let a = parse(&[("vmlet.io/vcpus", "2"), ("vmlet.io/memory", "512Mi")]).unwrap();
        assert_eq!(a.vcpus, Some(2));
        assert_eq!(a.memory_mib, Some(512));
    }

    #[test]
    fn foreign_annotations_are_ignored() {
        let a = parse(&[("io.kubernetes.cri.sandbox-id", "abc")]).unwrap();
        assert_eq!(a, PodAnnotations::default());
    }

    #[test]
    fn bad_memory_names_key_and_value() {
        let err = parse(&[("vmlet.io/memory", "lots")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("vmlet.io/memory"), "{err}");
        assert!(err.contains("lots"), "{err}");
    }

    #[test]
    fn bad_vcpus_are_refused() {
        for bad in ["0", "-1", "two", "", "1.5"] {
            let err = parse(&[("vmlet.io/vcpus", bad)]).unwrap_err().to_string();
            assert!(err.contains("vmlet.io/vcpus"), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_vmlet_key_is_refused() {
        let err = parse(&[("vmlet.io/cpus", "2")]).unwrap_err().to_string();
        assert!(err.contains("vmlet.io/cpus"), "{err}");
    }
}
