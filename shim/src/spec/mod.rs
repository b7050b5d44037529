//! OCI spec -> what vmlet does with it: the pod's side ([`pod`]: its role, network
//! namespace, the namespaces a container shares, the limits that size the VM) and the
//! container's ([`container`]: the agent's create request, processes, resources, binds,
//! and the kubelet's memory emptyDirs that become the guest's tmpfs: [`pod_volume`]).
//! The shim checks the spec and keeps only what the guest uses.

pub mod capabilities;
mod container;
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
