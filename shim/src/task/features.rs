//! `containerd-shim-vmlet-v2 -info`: what the runtime supports, as containerd asks a shim
//! (a `RuntimeInfo` protobuf on stdout, its `features` the OCI runtime-spec "features"
//! document, `features-linux.md`). containerd 2.x's CRI plugin reads it to tell the kubelet
//! what the handler can do: `rro` in `mountOptions` means recursive read-only mounts, `user`
//! in the namespaces with idmapped mounts means user namespaces (vmlet has neither of the
//! latter). Every entry is what the shim and the agent honour; anything else in a spec is
//! refused by name, not ignored.

use std::io::{Read, Write};

use containerd_shim_protos::protobuf::{well_known_types::any::Any, Message, MessageField};
use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};

/// The type URL containerd registers for runtime-spec's `features.Features` (JSON).
const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// containerd writes the runtime's options (a protobuf `Any`) on stdin; vmlet takes none,
/// so they are read (bounded) and dropped.
const MAX_OPTIONS: u64 = 1 << 20;

/// The features document (JSON), as `runc features` prints it.
pub fn features_json() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.2.0",
        "hooks": crate::spec::hooks::SUPPORTED,
        "mountOptions": vmlet_protocol::MOUNT_OPTIONS,
        "linux": {
            // The container's own mount, PID, UTS and IPC namespaces in the guest; its
            // network is the pod VM's. No user namespaces (they need idmapped mounts on
            // the virtio-fs share), no cgroup namespace.
            "namespaces": ["mount", "pid", "uts", "ipc", "network"],
            "capabilities": crate::spec::capabilities::NAMES.as_slice(),
            "cgroup": {"v1": false, "v2": true, "systemd": false, "systemdUser": false, "rdma": false},
            "seccomp": {
                "enabled": true,
                "actions": crate::spec::seccomp::SUPPORTED_ACTIONS,
                "operators": crate::spec::seccomp::SUPPORTED_OPERATORS,
                "archs": ["SCMP_ARCH_X86_64"],
                "knownFlags": crate::spec::seccomp::SUPPORTED_FLAGS,
                "supportedFlags": crate::spec::seccomp::SUPPORTED_FLAGS,
            },
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
            "intelRdt": {"enabled": false},
            "mountExtensions": {"idmap": {"enabled": false}},
        },
    })
}

/// The `RuntimeInfo` message `-info` prints.
pub fn runtime_info() -> RuntimeInfo {
    RuntimeInfo {
        name: crate::task::shim::RUNTIME_ID.to_owned(),
        version: MessageField::some(RuntimeVersion {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        }),
        features: MessageField::some(Any {
            type_url: FEATURES_TYPE_URL.to_owned(),
            value: features_json().to_string().into_bytes(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Answers `-info`: drains the options containerd writes on stdin, prints the message.
pub fn print_info() -> std::io::Result<()> {
    std::io::stdin()
        .lock()
        .take(MAX_OPTIONS)
        .read_to_end(&mut Vec::new())?;
    let bytes = runtime_info()
        .write_to_bytes()
        .map_err(std::io::Error::other)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_the_runtime_spec_document() {
        let info =
            RuntimeInfo::parse_from_bytes(&runtime_info().write_to_bytes().unwrap()).unwrap();
        assert_eq!(info.name, "io.containerd.vmlet.v2");
        assert_eq!(info.features.type_url, FEATURES_TYPE_URL);
        let features: oci_spec::runtime::Features =
            serde_json::from_slice(&info.features.value).unwrap();
        let options = features.mount_options().as_ref().unwrap();
        assert!(options.iter().any(|o| o == "rro"));
        let linux = features.linux().as_ref().unwrap();
        assert!(!linux
            .namespaces()
            .as_ref()
            .unwrap()
            .contains(&oci_spec::runtime::LinuxNamespaceType::User));
        assert_eq!(linux.capabilities().as_ref().unwrap().len(), 41);
        let seccomp = linux.seccomp().as_ref().unwrap();
        assert!(seccomp
            .actions()
            .as_ref()
            .unwrap()
            .contains(&oci_spec::runtime::LinuxSeccompAction::ScmpActErrno));
    }
}
