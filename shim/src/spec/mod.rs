//! OCI spec -> what vmlet does with it; the shim reads the spec nowhere else. The pod's
//! side ([`pod`]: its role, network namespace, the namespaces a container shares, the
//! limits that size the VM), the container's ([`container`]: the agent's create request,
//! processes, resources, binds, and the kubelet's memory emptyDirs that become the guest's
//! tmpfs: [`pod_volume`]), the rest a create reads ([`bundle`]), the block devices
//! ([`devices`]), the host hooks ([`hooks`]), capabilities and seccomp. The shim checks the
//! spec and keeps only what the guest uses.

pub(crate) mod bundle;
pub mod capabilities;
mod container;
pub(crate) mod devices;
pub mod hooks;
mod pod;
mod pod_volume;
pub mod seccomp;

pub use container::*;
pub use pod::*;

#[cfg(test)]
mod fixtures {
    use oci_spec::runtime::Spec;

    pub fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    pub const BASE: &str = r#"{
        "ociVersion": "1.0.2",
        "process": {"args": ["sh", "-c", "exit 7"], "env": ["PATH=/bin"], "cwd": "/",
                    "user": {"uid": 1000, "gid": 100, "additionalGids": [10]},
                    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 512}]},
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "box",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]}]
    }"#;
}
