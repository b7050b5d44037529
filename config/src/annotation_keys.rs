//! The annotations vmlet knows: each key (vmlet's under `vmlet.io/`, Virtlet's names where
//! they mean the same) and what it sets, and the ones a node allows when its config names
//! none. [`crate::annotations`] parses their values.

/// Every vmlet annotation starts with this prefix.
pub const ANNOTATION_PREFIX: &str = "vmlet.io/";
/// Virtlet's annotations start with this prefix (no domain).
pub const VIRTLET_PREFIX: &str = "Virtlet";
/// CRI Proxy's annotation that sent a pod to Virtlet; with [`VIRTLET_RUNTIME`] it makes the
/// pod a VM-mode one, any other value is not vmlet's.
pub const TARGET_RUNTIME_KEY: &str = "kubernetes.io/target-runtime";
/// Virtlet's runtime name, and the prefix of its image names (`virtlet.cloud/cirros`).
pub const VIRTLET_RUNTIME: &str = "virtlet.cloud";

/// What an annotation sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnnotationKey {
    /// A whole number of vCPUs, at least 1.
    Vcpus,
    /// A memory quantity (`512Mi`, `1Gi`).
    Memory,
    /// The guest CPU model: a libvirt model name, `host-model` or `host-passthrough`.
    CpuModel,
    /// How block devices are attached: `virtio`, `scsi` or `nvme`.
    DiskDriver,
    /// Extra guest kernel parameters.
    KernelParams,
    /// The QEMU machine type (a q35 one).
    Machine,
    /// libvirt's `<cpu>` as YAML (Virtlet's expert setting; sets the CPU like `CpuModel`).
    LibvirtCpuSetting,
    /// What the container's image is: `container` or `vm` (a carrier of a VM disk image).
    ImageType,
    /// The size a VM-mode pod's root disk grows to (a quantity: `4Gi`).
    RootVolumeSize,
    /// The name of the block volume a VM-mode pod's root lives on (persistent root): the
    /// last part of one of the container's `devicePath`s.
    RootVolume,
    /// cloud-init user-data for a VM-mode pod (a YAML mapping, cloud-config).
    CloudInitUserData,
    /// SSH public keys for a VM-mode pod, one per line.
    SshKeys,
    /// Whether a VM-mode pod's cloud-init seed carries a network-config: `v2` (the
    /// default) or `none` (the image configures its network by DHCP, which vmlet answers).
    CloudInitNetworkConfig,
    /// The firmware that boots a VM-mode pod's disk: `bios` (SeaBIOS, the default) or
    /// `uefi` (OVMF).
    Firmware,
    /// A YAML mapping of cloud-init meta-data keys, set over vmlet's (`instance-id`,
    /// `local-hostname`).
    CloudInitMetaData,
    /// `true`: the pod's user-data keys replace vmlet's instead of being merged with them.
    CloudInitUserDataOverwrite,
    /// The whole user-data as the pod wrote it (a script), instead of a cloud-config.
    CloudInitUserDataScript,
    /// The seed's data source: `nocloud` (the default) or `configdrive`.
    CloudInitImageType,
    /// `true`: the seed has no network-config, the image asks DHCP (Virtlet's spelling of
    /// `vmlet.io/cloud-init-network-config: none`).
    ForceDhcpNetworkConfig,
    /// The user `virtletctl ssh` logs in as: accepted, nothing in the VM changes.
    SshUser,
    /// `true`: Virtlet's 9p mounts chowned; vmlet makes no 9p mounts, so `true` is refused.
    Chown9pfsMounts,
    /// Virtlet's annotations that name a Kubernetes object to read (a ConfigMap or a
    /// Secret): always refused, a runtime holds no credentials for the API server.
    KubernetesObject,
    /// [`TARGET_RUNTIME_KEY`]: `virtlet.cloud` makes the pod a VM-mode one.
    TargetRuntime,
}

impl AnnotationKey {
    /// The setting a key decides: two keys deciding one setting must agree.
    pub(crate) fn setting(self) -> AnnotationKey {
        match self {
            AnnotationKey::LibvirtCpuSetting => AnnotationKey::CpuModel,
            other => other,
        }
    }
}

/// The table of known annotations: the one place a key's name is written.
pub const ANNOTATION_KEYS: &[(&str, AnnotationKey)] = &[
    ("vmlet.io/vcpus", AnnotationKey::Vcpus),
    ("vmlet.io/memory", AnnotationKey::Memory),
    ("vmlet.io/cpu-model", AnnotationKey::CpuModel),
    ("vmlet.io/disk-driver", AnnotationKey::DiskDriver),
    ("vmlet.io/kernel-params", AnnotationKey::KernelParams),
    ("vmlet.io/machine", AnnotationKey::Machine),
    ("VirtletVCPUCount", AnnotationKey::Vcpus),
    ("VirtletDiskDriver", AnnotationKey::DiskDriver),
    ("VirtletCPUModel", AnnotationKey::CpuModel),
    ("VirtletLibvirtCPUSetting", AnnotationKey::LibvirtCpuSetting),
    ("vmlet.io/image-type", AnnotationKey::ImageType),
    ("vmlet.io/root-volume-size", AnnotationKey::RootVolumeSize),
    ("vmlet.io/root-volume", AnnotationKey::RootVolume),
    (
        "vmlet.io/cloud-init-user-data",
        AnnotationKey::CloudInitUserData,
    ),
    ("vmlet.io/ssh-keys", AnnotationKey::SshKeys),
    (
        "vmlet.io/cloud-init-network-config",
        AnnotationKey::CloudInitNetworkConfig,
    ),
    ("vmlet.io/firmware", AnnotationKey::Firmware),
    ("VirtletRootVolumeSize", AnnotationKey::RootVolumeSize),
    ("VirtletCloudInitUserData", AnnotationKey::CloudInitUserData),
    ("VirtletSSHKeys", AnnotationKey::SshKeys),
    (
        "vmlet.io/cloud-init-meta-data",
        AnnotationKey::CloudInitMetaData,
    ),
    ("VirtletCloudInitMetaData", AnnotationKey::CloudInitMetaData),
    (
        "VirtletCloudInitUserDataOverwrite",
        AnnotationKey::CloudInitUserDataOverwrite,
    ),
    (
        "VirtletCloudInitUserDataScript",
        AnnotationKey::CloudInitUserDataScript,
    ),
    (
        "VirtletCloudInitImageType",
        AnnotationKey::CloudInitImageType,
    ),
    (
        "VirtletForceDHCPNetworkConfig",
        AnnotationKey::ForceDhcpNetworkConfig,
    ),
    ("VirtletSSHUser", AnnotationKey::SshUser),
    ("VirtletChown9pfsMounts", AnnotationKey::Chown9pfsMounts),
    ("VirtletSSHKeySource", AnnotationKey::KubernetesObject),
    (
        "VirtletCloudInitUserDataSource",
        AnnotationKey::KubernetesObject,
    ),
    (
        "VirtletCloudInitUserDataSourceKey",
        AnnotationKey::KubernetesObject,
    ),
    (
        "VirtletCloudInitUserDataSourceEncoding",
        AnnotationKey::KubernetesObject,
    ),
    ("VirtletConfigMapAsFiles", AnnotationKey::KubernetesObject),
    (
        "VirtletFilesFromDataSource",
        AnnotationKey::KubernetesObject,
    ),
    (TARGET_RUNTIME_KEY, AnnotationKey::TargetRuntime),
];

/// The annotations a node allows when its config says nothing: the VM's size and disk
/// driver, and a VM-mode pod's choices for what runs inside its own VM (what the image is,
/// its root volume's size, firmware, cloud-init user-data and network-config, SSH keys). Kernel parameters, CPU model
/// and machine type need the operator's consent.
pub const DEFAULT_ALLOWED: &[&str] = &[
    "vmlet.io/vcpus",
    "vmlet.io/memory",
    "vmlet.io/disk-driver",
    "vmlet.io/image-type",
    "vmlet.io/root-volume-size",
    "vmlet.io/root-volume",
    "vmlet.io/cloud-init-user-data",
    "vmlet.io/ssh-keys",
    "vmlet.io/cloud-init-network-config",
    "vmlet.io/firmware",
    "VirtletVCPUCount",
    "VirtletDiskDriver",
    "VirtletRootVolumeSize",
    "VirtletCloudInitUserData",
    "VirtletSSHKeys",
    "vmlet.io/cloud-init-meta-data",
    "VirtletCloudInitMetaData",
    "VirtletCloudInitUserDataOverwrite",
    "VirtletCloudInitUserDataScript",
    "VirtletCloudInitImageType",
    "VirtletForceDHCPNetworkConfig",
    "VirtletSSHUser",
    "VirtletChown9pfsMounts",
    TARGET_RUNTIME_KEY,
];

/// Whether `name` is an annotation vmlet knows.
pub fn is_known(name: &str) -> bool {
    ANNOTATION_KEYS.iter().any(|(known, _)| *known == name)
}
