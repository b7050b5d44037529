//! Typed configuration for vmlet.
//!
//! Two inputs decide what a pod's VM looks like:
//! - the node config file ([`NodeConfig`]), owned by the operator: TOML at
//!   [`DEFAULT_CONFIG_PATH`] or at the path in [`CONFIG_ENV`], every key optional with a
//!   documented default, unknown keys refused;
//! - the pod's annotations ([`PodAnnotations`]) under `vmlet.io/` (and Virtlet's names where
//!   they mean the same), parsed once from one table of keys into typed values; only those
//!   the node's allowlist names may be used.
//!
//! [`VmShape::resolve`] combines both. Every error names the key (and value) that was wrong.
#![forbid(unsafe_code)]

mod annotation_keys;
mod annotation_values;
mod annotations;
mod cpu_setting;
mod error;
mod helper_paths;
mod node;
mod quantity;
mod shape;
mod vm_choices;

pub use annotation_keys::{
    AnnotationKey, ANNOTATION_KEYS, ANNOTATION_PREFIX, DEFAULT_ALLOWED, TARGET_RUNTIME_KEY,
    VIRTLET_PREFIX, VIRTLET_RUNTIME,
};
pub use annotation_values::{user_data_kind, USER_DATA_KINDS};
pub use annotations::PodAnnotations;
pub use cpu_setting::{CpuFeature, CpuSetting, CpuSettingModel};
pub use error::Error;
pub use helper_paths::HelperPaths;
pub use node::{
    Accel, AnnotationsConfig, GuestConfig, Launcher, NodeConfig, PodUsersConfig, VmImagesConfig,
    VsockTransport, CONFIG_ENV, DEFAULT_CONFIG_PATH, DEFAULT_METRICS_GID,
};
pub use quantity::parse_memory_mib;
pub use shape::{PodLimits, ShapeSource, VmOptions, VmShape};
pub use vm_choices::{CloudInitNetwork, CpuModel, DiskDriver, Firmware, ImageType, SeedSource};
