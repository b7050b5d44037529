//! Pod annotations: vmlet's own under `vmlet.io/` and Virtlet's names where they mean the
//! same thing, parsed once from one table of keys into typed values. A key must be on the
//! node's allowlist ([`crate::NodeConfig`]'s `annotations.allowed`) to be used at all.

use std::collections::HashMap;

use crate::annotation_keys::*;
use crate::annotation_values::*;
use crate::vm_choices::*;
use crate::{parse_memory_mib, Error};

/// The longest block volume name (the serial every disk driver carries whole).
const MAX_VOLUME_NAME: usize = 20;

/// Whether `machine` is a q35 machine type (`q35`, `pc-q35-<version>`): vmlet's devices sit
/// on q35's PCIe root bus.
pub fn is_q35(machine: &str) -> bool {
    machine == "q35" || machine.starts_with("pc-q35-")
}

/// What a pod asked for through its annotations. `None` means "not set".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAnnotations {
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u64>,
    pub cpu_model: Option<CpuModel>,
    pub disk_driver: Option<DiskDriver>,
    /// Whitespace-separated `key` or `key=value` words, checked.
    pub kernel_params: Option<String>,
    pub machine: Option<String>,
    pub image_type: Option<ImageType>,
    /// The size (MiB) a VM-mode pod's root disk grows to.
    pub root_volume_mib: Option<u64>,
    /// The block volume (its name) a VM-mode pod's root lives on.
    pub root_volume: Option<String>,
    /// cloud-init user-data (a YAML mapping), as given.
    pub cloud_init_user_data: Option<String>,
    /// SSH public keys, one per entry.
    pub ssh_keys: Option<Vec<String>>,
    pub cloud_init_network: Option<CloudInitNetwork>,
    pub firmware: Option<Firmware>,
    /// cloud-init meta-data keys over vmlet's: a JSON object's text.
    pub cloud_init_meta_data: Option<String>,
    /// Whether the pod's user-data keys replace vmlet's (else they are merged).
    pub cloud_init_user_data_overwrite: bool,
    /// The whole user-data as the pod wrote it (not a cloud-config).
    pub cloud_init_user_data_script: Option<String>,
    pub seed_source: Option<SeedSource>,
}

impl PodAnnotations {
    /// Parses the pod's vmlet and Virtlet annotations; others are not vmlet's and are left
    /// alone. An unknown `vmlet.io/` or `Virtlet` key, a known key that `allowed` does not
    /// list, a bad value, or one setting given two different values is an error naming the
    /// key.
    pub fn parse<'a, I>(annotations: I, allowed: &[String]) -> Result<Self, Error>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        let mut parsed = PodAnnotations::default();
        let mut seen: HashMap<AnnotationKey, (&'a String, &'a String)> = HashMap::new();
        let mut pairs: Vec<(&'a String, &'a String)> = annotations.into_iter().collect();
        // Deterministic errors whatever the map's order.
        pairs.sort();
        for (key, value) in pairs {
            let theirs = key == TARGET_RUNTIME_KEY && value != VIRTLET_RUNTIME;
            if theirs
                || !key.starts_with(ANNOTATION_PREFIX)
                    && !key.starts_with(VIRTLET_PREFIX)
                    && key != TARGET_RUNTIME_KEY
            {
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
            if *known == AnnotationKey::KubernetesObject {
                return Err(Error::InvalidAnnotation {
                    key: key.clone(),
                    value: value.clone(),
                    reason: "vmlet reads no ConfigMap or Secret: a runtime holds no credentials for the API server (put SSH keys in VirtletSSHKeys, user-data in VirtletCloudInitUserData, files in a volume)".into(),
                });
            }
            if !allowed.iter().any(|a| a == key) {
                return Err(Error::AnnotationNotAllowed { key: key.clone() });
            }
            if let Some((other, other_value)) = seen.get(&known.setting()) {
                if *other_value != value {
                    return Err(Error::InvalidAnnotation {
                        key: key.clone(),
                        value: value.clone(),
                        reason: format!("{other} sets the same thing to {other_value:?}"),
                    });
                }
            }
            seen.insert(known.setting(), (key, value));
            parsed.set(*known, key, value)?;
        }
        parsed.check_virtlet_pairs(&seen)?;
        if let (Some(_), Some((key, value))) = (
            &parsed.root_volume,
            seen.get(&AnnotationKey::RootVolumeSize),
        ) {
            return Err(Error::InvalidAnnotation {
                key: (*key).clone(),
                value: (*value).clone(),
                reason: "a root on a block volume (vmlet.io/root-volume) is that volume's size"
                    .into(),
            });
        }
        if parsed.image_type != Some(ImageType::Vm) {
            for setting in [
                AnnotationKey::RootVolumeSize,
                AnnotationKey::RootVolume,
                AnnotationKey::CloudInitUserData,
                AnnotationKey::SshKeys,
                AnnotationKey::CloudInitNetworkConfig,
                AnnotationKey::Firmware,
                AnnotationKey::CloudInitMetaData,
                AnnotationKey::CloudInitUserDataOverwrite,
                AnnotationKey::CloudInitUserDataScript,
                AnnotationKey::CloudInitImageType,
                AnnotationKey::ForceDhcpNetworkConfig,
            ] {
                if let Some((key, value)) = seen.get(&setting) {
                    return Err(Error::InvalidAnnotation {
                        key: (*key).clone(),
                        value: (*value).clone(),
                        reason: "only a VM-mode pod (vmlet.io/image-type: vm) has a root volume, firmware and cloud-init".into(),
                    });
                }
            }
        }
        Ok(parsed)
    }

    /// Virtlet's keys that say what vmlet's (or another of Virtlet's) say too: they must
    /// agree. Checked once all are parsed (they are read in the order of their names).
    fn check_virtlet_pairs(
        &self,
        seen: &HashMap<AnnotationKey, (&String, &String)>,
    ) -> Result<(), Error> {
        let conflict = |a: AnnotationKey, b: AnnotationKey, why: &str| -> Result<(), Error> {
            match (seen.get(&a), seen.get(&b)) {
                (Some((key, value)), Some((other, other_value))) => Err(Error::InvalidAnnotation {
                    key: (*key).clone(),
                    value: (*value).clone(),
                    reason: format!("{other} is {other_value:?}: {why}"),
                }),
                _ => Ok(()),
            }
        };
        if self.image_type == Some(ImageType::Container) {
            conflict(
                AnnotationKey::TargetRuntime,
                AnnotationKey::ImageType,
                "Virtlet's pods are VM-mode pods",
            )?;
        }
        conflict(
            AnnotationKey::CloudInitUserDataScript,
            AnnotationKey::CloudInitUserData,
            "the user-data is one or the other",
        )?;
        let forces_dhcp = seen
            .get(&AnnotationKey::ForceDhcpNetworkConfig)
            .is_some_and(|(_, value)| value.as_str() == "true");
        if forces_dhcp && self.cloud_init_network == Some(CloudInitNetwork::V2) {
            conflict(
                AnnotationKey::ForceDhcpNetworkConfig,
                AnnotationKey::CloudInitNetworkConfig,
                "DHCP means no network-config",
            )?;
        }
        Ok(())
    }

    /// Convenience for callers holding a map.
    pub fn from_map(
        annotations: &HashMap<String, String>,
        allowed: &[String],
    ) -> Result<Self, Error> {
        Self::parse(annotations.iter(), allowed)
    }

    fn set(&mut self, known: AnnotationKey, key: &str, value: &str) -> Result<(), Error> {
        let invalid = |reason: String| Error::InvalidAnnotation {
            key: key.to_owned(),
            value: value.to_owned(),
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
                self.vcpus = Some(vcpus);
            }
            AnnotationKey::Memory => {
                self.memory_mib = Some(parse_memory_mib(value).map_err(invalid)?);
            }
            AnnotationKey::CpuModel => {
                self.cpu_model = Some(match value.trim() {
                    "host-passthrough" => CpuModel::HostPassthrough,
                    "host-model" => CpuModel::HostModel,
                    name => CpuModel::Named(check_name(name, "a CPU model").map_err(invalid)?),
                });
            }
            AnnotationKey::LibvirtCpuSetting => {
                self.cpu_model = Some(CpuModel::Libvirt(
                    crate::cpu_setting::parse(value).map_err(invalid)?,
                ));
            }
            AnnotationKey::DiskDriver => {
                self.disk_driver = Some(match value.trim() {
                    "virtio" => DiskDriver::Virtio,
                    "scsi" => DiskDriver::Scsi,
                    "nvme" => DiskDriver::Nvme,
                    _ => return Err(invalid("expected virtio, scsi or nvme".into())),
                });
            }
            AnnotationKey::KernelParams => {
                self.kernel_params = Some(check_kernel_params(value).map_err(invalid)?);
            }
            AnnotationKey::Machine => {
                let name = check_name(value.trim(), "a machine type").map_err(invalid)?;
                if !is_q35(&name) {
                    return Err(invalid(
                        "vmlet's devices need a q35 machine (q35 or pc-q35-<version>)".into(),
                    ));
                }
                self.machine = Some(name);
            }
            AnnotationKey::ImageType => {
                self.image_type = Some(match value.trim() {
                    "container" => ImageType::Container,
                    "vm" => ImageType::Vm,
                    _ => return Err(invalid("expected container or vm".into())),
                });
            }
            AnnotationKey::RootVolumeSize => {
                self.root_volume_mib = Some(parse_memory_mib(value).map_err(invalid)?);
            }
            AnnotationKey::RootVolume => {
                let name = check_name(value.trim(), "a block volume").map_err(invalid)?;
                if name.len() > MAX_VOLUME_NAME
                    || name.starts_with('.')
                    || name.starts_with("vmlet")
                {
                    return Err(invalid(format!(
                        "expected the last part of one of the container's devicePaths: 1 to {MAX_VOLUME_NAME} letters, digits, '.', '_' or '-', not starting with '.' or vmlet"
                    )));
                }
                self.root_volume = Some(name);
            }
            AnnotationKey::CloudInitUserData => {
                self.cloud_init_user_data = Some(check_user_data(value).map_err(invalid)?);
            }
            AnnotationKey::SshKeys => {
                self.ssh_keys = Some(check_ssh_keys(value).map_err(invalid)?);
            }
            AnnotationKey::Firmware => {
                self.firmware = Some(match value.trim() {
                    "bios" => Firmware::Bios,
                    "uefi" => Firmware::Uefi,
                    _ => return Err(invalid("expected bios (SeaBIOS) or uefi (OVMF)".into())),
                });
            }
            AnnotationKey::CloudInitMetaData => {
                self.cloud_init_meta_data = Some(check_meta_data(value).map_err(invalid)?);
            }
            AnnotationKey::CloudInitUserDataOverwrite => {
                // Virtlet's booleans: "true" is true, anything else false.
                self.cloud_init_user_data_overwrite = value == "true";
            }
            AnnotationKey::CloudInitUserDataScript => {
                if value.len() > MAX_USER_DATA {
                    return Err(invalid(format!("longer than {MAX_USER_DATA} bytes")));
                }
                if user_data_kind(value).is_none() {
                    return Err(invalid(
                        "its first line must say its kind as cloud-init reads it: #! (a script), #cloud-config, #cloud-config-archive, #cloud-boothook, #include, #include-once or #part-handler".into(),
                    ));
                }
                self.cloud_init_user_data_script = Some(value.to_owned());
            }
            AnnotationKey::CloudInitImageType => {
                self.seed_source = Some(match value.trim().to_ascii_lowercase().as_str() {
                    "nocloud" => SeedSource::NoCloud,
                    "configdrive" => SeedSource::ConfigDrive,
                    _ => return Err(invalid("expected nocloud or configdrive".into())),
                });
            }
            AnnotationKey::ForceDhcpNetworkConfig => {
                if value == "true" {
                    self.cloud_init_network = Some(CloudInitNetwork::None);
                }
            }
            AnnotationKey::SshUser => {}
            AnnotationKey::Chown9pfsMounts => {
                if value == "true" {
                    return Err(invalid(
                        "vmlet makes no 9p mounts in a VM image (a block volume is a disk of the VM)"
                            .into(),
                    ));
                }
            }
            // Refused by `parse` before it gets here.
            AnnotationKey::KubernetesObject => {}
            AnnotationKey::TargetRuntime => {
                self.image_type = Some(ImageType::Vm);
            }
            AnnotationKey::CloudInitNetworkConfig => {
                self.cloud_init_network = Some(match value.trim() {
                    "v2" => CloudInitNetwork::V2,
                    "none" => CloudInitNetwork::None,
                    _ => return Err(invalid(
                        "expected v2 (the pod's network in the seed) or none (the image uses DHCP)"
                            .into(),
                    )),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_allowed() -> Vec<String> {
        ANNOTATION_KEYS.iter().map(|(k, _)| k.to_string()).collect()
    }

    fn parse_with(pairs: &[(&str, &str)], allowed: &[String]) -> Result<PodAnnotations, Error> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PodAnnotations::from_map(&map, allowed)
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<PodAnnotations, Error> {
        parse_with(pairs, &all_allowed())
    }

    #[test]
    fn a_virtlet_pods_annotations_mean_what_they_meant_to_virtlet() {
        let a = parse(&[
            (TARGET_RUNTIME_KEY, VIRTLET_RUNTIME),
            (
                "VirtletCloudInitMetaData",
                "instance-id: foobar\nzone: [a, b]\n",
            ),
            ("VirtletCloudInitUserDataOverwrite", "true"),
            ("VirtletCloudInitUserDataScript", "#!/bin/sh\necho hi\n"),
            ("VirtletCloudInitImageType", "ConfigDrive"),
            ("VirtletForceDHCPNetworkConfig", "true"),
            ("VirtletSSHUser", "cirros"),
            ("VirtletChown9pfsMounts", "false"),
        ])
        .unwrap();
        assert_eq!(a.image_type, Some(ImageType::Vm));
        assert_eq!(
            a.cloud_init_meta_data.as_deref(),
            Some(r#"{"instance-id":"foobar","zone":["a","b"]}"#)
        );
        assert!(a.cloud_init_user_data_overwrite);
        assert_eq!(
            a.cloud_init_user_data_script.as_deref(),
            Some("#!/bin/sh\necho hi\n")
        );
        assert_eq!(a.seed_source, Some(SeedSource::ConfigDrive));
        assert_eq!(a.cloud_init_network, Some(CloudInitNetwork::None));
        // Another runtime's value is not vmlet's.
        let other = parse(&[(TARGET_RUNTIME_KEY, "kata")]).unwrap();
        assert_eq!(other.image_type, None);
        let not_forced = parse(&[
            ("vmlet.io/image-type", "vm"),
            ("VirtletForceDHCPNetworkConfig", "false"),
            ("vmlet.io/cloud-init-network-config", "v2"),
        ])
        .unwrap();
        assert_eq!(not_forced.cloud_init_network, Some(CloudInitNetwork::V2));
        assert!(
            !parse(&[
                ("vmlet.io/image-type", "vm"),
                ("VirtletCloudInitUserDataOverwrite", "yes")
            ])
            .unwrap()
            .cloud_init_user_data_overwrite
        );
    }

    #[test]
    fn virtlet_annotations_vmlet_cannot_honour_or_that_disagree_are_refused_by_name() {
        for (pairs, key, says) in [
            (
                vec![
                    (TARGET_RUNTIME_KEY, VIRTLET_RUNTIME),
                    ("VirtletSSHKeySource", "secret/keys"),
                ],
                "VirtletSSHKeySource",
                "no credentials for the API server",
            ),
            (
                vec![("VirtletCloudInitUserDataSource", "configmap/ud")],
                "VirtletCloudInitUserDataSource",
                "reads no ConfigMap or Secret",
            ),
            (
                vec![
                    (TARGET_RUNTIME_KEY, VIRTLET_RUNTIME),
                    ("VirtletChown9pfsMounts", "true"),
                ],
                "VirtletChown9pfsMounts",
                "no 9p mounts",
            ),
            (
                vec![
                    (TARGET_RUNTIME_KEY, VIRTLET_RUNTIME),
                    ("vmlet.io/image-type", "container"),
                ],
                TARGET_RUNTIME_KEY,
                "are VM-mode pods",
            ),
            (
                vec![
                    ("vmlet.io/image-type", "vm"),
                    ("VirtletCloudInitUserDataScript", "#!/bin/sh"),
                    ("VirtletCloudInitUserData", "runcmd: []"),
                ],
                "VirtletCloudInitUserDataScript",
                "one or the other",
            ),
            (
                vec![
                    ("vmlet.io/image-type", "vm"),
                    ("VirtletForceDHCPNetworkConfig", "true"),
                    ("vmlet.io/cloud-init-network-config", "v2"),
                ],
                "VirtletForceDHCPNetworkConfig",
                "no network-config",
            ),
            (
                vec![
                    ("vmlet.io/image-type", "vm"),
                    ("VirtletCloudInitMetaData", "- a list"),
                ],
                "VirtletCloudInitMetaData",
                "expected a YAML mapping",
            ),
            (
                vec![
                    ("vmlet.io/image-type", "vm"),
                    ("VirtletCloudInitUserDataScript", "echo hi"),
                ],
                "VirtletCloudInitUserDataScript",
                "its first line must say its kind",
            ),
            (
                vec![
                    ("vmlet.io/image-type", "vm"),
                    ("VirtletCloudInitImageType", "ec2"),
                ],
                "VirtletCloudInitImageType",
                "nocloud or configdrive",
            ),
            (
                vec![("VirtletCloudInitMetaData", "a: b")],
                "VirtletCloudInitMetaData",
                "only a VM-mode pod",
            ),
        ] {
            let err = parse(&pairs).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(says), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn vm_mode_values() {
        let a = parse(&[
            ("vmlet.io/image-type", "vm"),
            ("VirtletRootVolumeSize", "4Gi"),
            (
                "vmlet.io/cloud-init-user-data",
                "runcmd:\n  - echo hello from $(hostname)\n",
            ),
            (
                "VirtletSSHKeys",
                "ssh-ed25519 AAAAC3Nza user@host\n\n  ecdsa-sha2-nistp256 AAAAE2Vj\n",
            ),
        ])
        .unwrap();
        assert_eq!(a.image_type, Some(ImageType::Vm));
        assert_eq!(a.root_volume_mib, Some(4096));
        assert!(a.cloud_init_user_data.unwrap().starts_with("runcmd:"));
        assert_eq!(
            a.ssh_keys.unwrap(),
            [
                "ssh-ed25519 AAAAC3Nza user@host",
                "ecdsa-sha2-nistp256 AAAAE2Vj"
            ]
        );
        assert_eq!(a.cloud_init_network, None);
        let dhcp = parse(&[
            ("vmlet.io/image-type", "vm"),
            ("vmlet.io/cloud-init-network-config", "none"),
        ])
        .unwrap();
        assert_eq!(dhcp.cloud_init_network, Some(CloudInitNetwork::None));
        let uefi = parse(&[("vmlet.io/image-type", "vm"), ("vmlet.io/firmware", "uefi")]).unwrap();
        assert_eq!(uefi.firmware, Some(Firmware::Uefi));
        let c = parse(&[("vmlet.io/image-type", "container")]).unwrap();
        assert_eq!(c.image_type, Some(ImageType::Container));
        for key in DEFAULT_ALLOWED {
            assert!(is_known(key), "{key}");
        }
    }

    #[test]
    fn bad_vm_mode_values_are_named() {
        let bad: &[(&str, &str)] = &[
            ("vmlet.io/image-type", "disk"),
            ("vmlet.io/image-type", ""),
            ("vmlet.io/cloud-init-user-data", "just a string"),
            ("vmlet.io/cloud-init-user-data", "- a\n- list\n"),
            ("vmlet.io/cloud-init-user-data", "runcmd: [unclosed"),
            ("vmlet.io/ssh-keys", ""),
            ("vmlet.io/ssh-keys", "not-a-key AAAA"),
            ("vmlet.io/ssh-keys", "ssh-rsa"),
            ("vmlet.io/ssh-keys", "ssh-rsa AAAA\u{7}"),
            ("vmlet.io/root-volume-size", "big"),
            ("vmlet.io/root-volume", "../dev/sda"),
            ("vmlet.io/root-volume", "vmlet0"),
            ("vmlet.io/root-volume", "a-name-longer-than-twenty"),
            ("vmlet.io/cloud-init-network-config", "dhcp"),
            ("vmlet.io/firmware", "efi"),
        ];
        for (key, value) in bad {
            let mut pairs = vec![(*key, *value)];
            if *key != "vmlet.io/image-type" {
                pairs.push(("vmlet.io/image-type", "vm"));
            }
            let err = parse(&pairs).unwrap_err().to_string();
            assert!(err.contains(key), "{key}={value:?}: {err}");
        }
        let too_long = format!("a: \"{}\"", "x".repeat(MAX_USER_DATA));
        let err = parse(&[
            ("vmlet.io/image-type", "vm"),
            ("vmlet.io/cloud-init-user-data", &too_long),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("longer than"), "{err}");
    }

    #[test]
    fn a_root_volume_is_named_and_takes_no_size() {
        let a = parse(&[
            ("vmlet.io/image-type", "vm"),
            ("vmlet.io/root-volume", "root"),
        ])
        .unwrap();
        assert_eq!(a.root_volume.as_deref(), Some("root"));
        let err = parse(&[
            ("vmlet.io/image-type", "vm"),
            ("vmlet.io/root-volume", "root"),
            ("VirtletRootVolumeSize", "4Gi"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("VirtletRootVolumeSize") && err.contains("that volume's size"),
            "{err}"
        );
        let err = parse(&[("vmlet.io/root-volume", "root")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("only a VM-mode pod"), "{err}");
    }

    #[test]
    fn cloud_init_needs_vm_mode() {
        for key in [
            "vmlet.io/root-volume-size",
            "VirtletCloudInitUserData",
            "vmlet.io/ssh-keys",
            "vmlet.io/cloud-init-network-config",
            "vmlet.io/firmware",
        ] {
            let value = match key {
                "vmlet.io/firmware" => "uefi",
                "vmlet.io/root-volume-size" => "4Gi",
                "vmlet.io/ssh-keys" => "ssh-ed25519 AAAA",
                "vmlet.io/cloud-init-network-config" => "none",
                _ => "runcmd: [true]",
            };
            for image_type in [None, Some("container")] {
                let mut pairs = vec![(key, value)];
                if let Some(t) = image_type {
                    pairs.push(("vmlet.io/image-type", t));
                }
                let err = parse(&pairs).unwrap_err().to_string();
                assert!(err.contains(key) && err.contains("image-type: vm"), "{err}");
            }
        }
    }

    #[test]
    fn good_values() {
        let a = parse(&[
            ("vmlet.io/vcpus", "2"),
            ("vmlet.io/memory", "512Mi"),
            ("vmlet.io/cpu-model", "Skylake-Client"),
            ("vmlet.io/disk-driver", "nvme"),
            ("vmlet.io/kernel-params", "  loglevel=7   quiet "),
            ("vmlet.io/machine", "pc-q35-7.2"),
        ])
        .unwrap();
        assert_eq!(a.vcpus, Some(2));
        assert_eq!(a.memory_mib, Some(512));
        assert_eq!(a.cpu_model, Some(CpuModel::Named("Skylake-Client".into())));
        assert_eq!(a.disk_driver, Some(DiskDriver::Nvme));
        assert_eq!(a.kernel_params.as_deref(), Some("loglevel=7 quiet"));
        assert_eq!(a.machine.as_deref(), Some("pc-q35-7.2"));
    }

    #[test]
    fn virtlet_names_mean_the_same() {
        let a = parse(&[
            ("VirtletVCPUCount", "3"),
            ("VirtletDiskDriver", "virtio"),
            ("VirtletCPUModel", "host-model"),
        ])
        .unwrap();
        assert_eq!(a.vcpus, Some(3));
        assert_eq!(a.disk_driver, Some(DiskDriver::Virtio));
        assert_eq!(a.cpu_model, Some(CpuModel::HostModel));
        // Both names with one value are fine; with two values they are refused.
        assert!(parse(&[("vmlet.io/vcpus", "2"), ("VirtletVCPUCount", "2")]).is_ok());
        let err = parse(&[("vmlet.io/vcpus", "2"), ("VirtletVCPUCount", "4")]).unwrap_err();
        assert!(err.to_string().contains("sets the same thing"), "{err}");
    }

    #[test]
    fn virtlets_libvirt_cpu_setting_is_the_cpu_and_conflicts_with_a_model() {
        let a = parse(&[(
            "VirtletLibvirtCPUSetting",
            "Mode: custom\nModel:\n  Value: Nehalem\nFeatures:\n- {Policy: disable, Name: sse4.2}\n",
        )])
        .unwrap();
        let Some(CpuModel::Libvirt(setting)) = a.cpu_model else {
            panic!("{:?}", a.cpu_model);
        };
        assert_eq!(setting.model.unwrap().name, "Nehalem");
        assert_eq!(setting.features[0].name, "sse4.2");
        let passthrough = parse(&[("VirtletLibvirtCPUSetting", "mode: host-passthrough")]).unwrap();
        assert_eq!(
            passthrough.cpu_model.unwrap().host_mode(),
            Some("host-passthrough")
        );
        let err = parse(&[
            ("VirtletLibvirtCPUSetting", "model: Nehalem"),
            ("vmlet.io/cpu-model", "Skylake-Client"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("sets the same thing"), "{err}");
    }

    #[test]
    fn foreign_annotations_are_ignored() {
        let a = parse(&[("io.kubernetes.cri.sandbox-id", "abc")]).unwrap();
        assert_eq!(a, PodAnnotations::default());
    }

    #[test]
    fn every_bad_value_names_its_key() {
        for (key, bad) in [
            ("vmlet.io/vcpus", "0"),
            ("vmlet.io/vcpus", "-1"),
            ("vmlet.io/vcpus", "two"),
            ("vmlet.io/vcpus", ""),
            ("vmlet.io/vcpus", "1.5"),
            ("vmlet.io/vcpus", "99999999999"),
            ("VirtletVCPUCount", "0"),
            ("vmlet.io/memory", "lots"),
            ("vmlet.io/memory", ""),
            ("vmlet.io/memory", "-512Mi"),
            ("vmlet.io/memory", "512Mb"),
            ("vmlet.io/cpu-model", ""),
            ("vmlet.io/cpu-model", "Skylake,+avx"),
            ("vmlet.io/cpu-model", &"x".repeat(65)),
            ("VirtletCPUModel", "a b"),
            ("vmlet.io/disk-driver", "ide"),
            ("vmlet.io/disk-driver", ""),
            ("VirtletDiskDriver", "VIRTIO"),
            ("vmlet.io/kernel-params", ""),
            ("vmlet.io/kernel-params", "init=\"/bin/sh\""),
            ("vmlet.io/kernel-params", "vmlet.share=other"),
            ("vmlet.io/kernel-params", "console=tty0"),
            ("vmlet.io/kernel-params", "a\nb"),
            ("vmlet.io/kernel-params", &"a".repeat(1025)),
            ("vmlet.io/machine", "pc"),
            ("vmlet.io/machine", "microvm"),
            ("vmlet.io/machine", ""),
            ("VirtletLibvirtCPUSetting", ""),
            ("VirtletLibvirtCPUSetting", "mode: turbo"),
            ("VirtletLibvirtCPUSetting", "topology: {sockets: 2}"),
            ("VirtletLibvirtCPUSetting", "model: {value: 'Nehalem,+avx'}"),
            (
                "VirtletLibvirtCPUSetting",
                "model: x\nfeatures: [{policy: want, name: vmx}]",
            ),
        ] {
            let err = parse(&[(key, bad)]).unwrap_err();
            assert!(
                matches!(err, Error::InvalidAnnotation { .. }),
                "{key}={bad:?}: {err}"
            );
            assert!(err.to_string().contains(key), "{key}={bad:?}: {err}");
        }
    }

    #[test]
    fn unknown_keys_of_ours_are_refused() {
        for key in ["vmlet.io/cpus", "VirtletNoSuchKey"] {
            let err = parse(&[(key, "2")]).unwrap_err();
            assert!(matches!(err, Error::UnknownAnnotation { .. }), "{err}");
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn keys_off_the_allowlist_are_refused_by_name() {
        let allowed: Vec<String> = DEFAULT_ALLOWED.iter().map(|s| s.to_string()).collect();
        for key in [
            "vmlet.io/kernel-params",
            "vmlet.io/cpu-model",
            "vmlet.io/machine",
            "VirtletCPUModel",
            "VirtletLibvirtCPUSetting",
        ] {
            let err = parse_with(&[(key, "q35")], &allowed).unwrap_err();
            assert!(
                matches!(&err, Error::AnnotationNotAllowed { key: k } if k == key),
                "{err}"
            );
            assert!(err.to_string().contains(key), "{err}");
        }
        assert!(parse_with(&[("vmlet.io/vcpus", "2")], &allowed).is_ok());
        assert!(parse_with(&[("vmlet.io/vcpus", "2")], &[]).is_err());
    }

    proptest! {
        #[test]
        fn vcpus_round_trip(n in 1u32..=u32::MAX) {
            let a = parse(&[("vmlet.io/vcpus", &n.to_string())]).unwrap();
            prop_assert_eq!(a.vcpus, Some(n));
        }

        #[test]
        fn memory_round_trips_in_mi_and_gi(mi in 1u64..=(1 << 30), gi in 1u64..=(1 << 20)) {
            let a = parse(&[("vmlet.io/memory", &format!("{mi}Mi"))]).unwrap();
            prop_assert_eq!(a.memory_mib, Some(mi));
            let a = parse(&[("vmlet.io/memory", &format!("{gi}Gi"))]).unwrap();
            prop_assert_eq!(a.memory_mib, Some(gi * 1024));
        }

        #[test]
        fn cpu_model_names_round_trip(name in "[A-Za-z0-9][A-Za-z0-9._-]{0,40}") {
            prop_assume!(name != "host-model" && name != "host-passthrough");
            let a = parse(&[("vmlet.io/cpu-model", &name)]).unwrap();
            prop_assert_eq!(a.cpu_model, Some(CpuModel::Named(name)));
        }

        #[test]
        fn kernel_params_round_trip(words in proptest::collection::vec("[a-z][a-z0-9_]{0,8}(=[a-z0-9,.]{1,8})?", 1..8)) {
            prop_assume!(words.iter().all(|w| {
                let name = w.split('=').next().unwrap();
                name != "console" && name != "panic"
            }));
            let value = words.join(" ");
            let a = parse(&[("vmlet.io/kernel-params", &value)]).unwrap();
            prop_assert_eq!(a.kernel_params, Some(value));
        }

        #[test]
        fn libvirt_cpu_settings_round_trip(
            model in "[A-Za-z][A-Za-z0-9._-]{0,30}",
            features in proptest::collection::vec(("(force|require|optional|disable|forbid)", "[a-z][a-z0-9._-]{0,15}"), 0..5),
        ) {
            prop_assume!(!["null", "Null", "NULL"].contains(&model.as_str()));
            let mut yaml = format!("match: exact\nmodel:\n  value: {model}\n  fallback: forbid\n");
            if !features.is_empty() {
                yaml.push_str("features:\n");
                for (policy, name) in &features {
                    yaml.push_str(&format!("- policy: {policy}\n  name: {name}\n"));
                }
            }
            let a = parse(&[("VirtletLibvirtCPUSetting", &yaml)]).unwrap();
            let Some(CpuModel::Libvirt(s)) = a.cpu_model else { panic!() };
            prop_assert_eq!(s.model.map(|m| m.name), Some(model));
            let got: Vec<(String, String)> = s.features.into_iter().map(|f| (f.policy, f.name)).collect();
            prop_assert_eq!(got, features);
        }

        /// Whatever the value, parsing ends in a value or an error that names the key.
        #[test]
        fn any_value_is_parsed_or_named(key_index in 0..ANNOTATION_KEYS.len(), value in ".{0,80}") {
            let key = ANNOTATION_KEYS[key_index].0;
            if let Err(err) = parse(&[(key, &value)]) {
                prop_assert!(err.to_string().contains(key), "{}", err);
            }
        }
    }
}
