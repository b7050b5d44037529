//! Which launcher starts the pods on this node (of vmlet's guest, and VM images): the
//! config's `launcher`, and for `auto` what the node allows. `auto` starts QEMU without libvirt (the shim's own
//! start, docs/performance.md) wherever vmlet confines it at least as libvirt would: not
//! where the config asks for the kernel's vsock device (its CID is libvirt's to allocate),
//! not where SELinux enforces (libvirt labels each VM; vmlet has no labels of its own),
//! not where AppArmor is on and its parser, with which the shim loads each pod's QEMU
//! profile, is missing. A pod whose VM only libvirt can start (a CPU model libvirt expands)
//! still starts through libvirt under either choice
//! ([`crate::vmm::qemu_command::libvirt_only`]). `vmletctl check` prints the choice and
//! its reason.

use std::path::Path;

use vmlet_config::{Launcher, NodeConfig, VsockTransport};

use crate::host::qemu_apparmor::{self, NodeLsm};

/// What of the node the choice depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    pub lsm: NodeLsm,
    /// Whether `helpers.apparmor_parser` is there.
    pub apparmor_parser: bool,
}

impl NodeFacts {
    /// This node's.
    pub fn of_node(config: &NodeConfig) -> Self {
        Self {
            lsm: qemu_apparmor::node_lsm(),
            apparmor_parser: Path::new(&config.helpers.apparmor_parser).is_file(),
        }
    }
}

/// The launcher the node's pods get, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The shim starts QEMU itself; otherwise libvirt does.
    pub direct: bool,
    pub why: String,
}

/// The choice on this node.
pub fn choose(config: &NodeConfig) -> Choice {
    choose_with(config, || NodeFacts::of_node(config))
}

/// `config` with `launcher = "auto"` turned into what it chooses on this node (logged with
/// why), so that one create reads one answer wherever it asks (the vsock transport, the
/// accelerator, the launch).
pub fn resolved(mut config: NodeConfig) -> NodeConfig {
    if config.launcher == Launcher::Auto {
        let choice = choose(&config);
        log::info!(
            "launcher: {} ({})",
            if choice.direct { "direct" } else { "libvirt" },
            choice.why
        );
        config.launcher = match choice.direct {
            true => Launcher::Direct,
            false => Launcher::Libvirt,
        };
    }
    config
}

/// The choice for `config` on a node with `facts`, asked only for `auto` (the shim resolves
/// `auto` once per create: the calls after that read nothing of the node).
pub fn choose_with(config: &NodeConfig, facts: impl FnOnce() -> NodeFacts) -> Choice {
    match config.launcher {
        Launcher::Libvirt => choice(false, "launcher = \"libvirt\" in the node config"),
        Launcher::Direct => choice(true, "launcher = \"direct\" in the node config"),
        Launcher::Auto if config.vsock == VsockTransport::Vhost => choice(
            false,
            "launcher = \"auto\" and vsock = \"vhost\": the kernel's vsock device wants a CID, \
             which libvirt allocates",
        ),
        Launcher::Auto => on_node(facts()),
    }
}

/// `auto`'s choice on a node with `facts`, vsock not the kernel's.
fn on_node(facts: NodeFacts) -> Choice {
    match facts.lsm {
        NodeLsm::SelinuxEnforcing => choice(
            false,
            "launcher = \"auto\" and SELinux enforces: libvirt labels each VM, and vmlet \
             has no SELinux labels of its own for QEMU",
        ),
        NodeLsm::AppArmor if !facts.apparmor_parser => choice(
            false,
            "launcher = \"auto\", AppArmor is on and helpers.apparmor_parser is missing: \
             the shim could not load a profile for a pod's QEMU",
        ),
        NodeLsm::AppArmor => choice(
            true,
            "launcher = \"auto\": the shim starts QEMU under an AppArmor profile of the \
             pod's own",
        ),
        NodeLsm::None => choice(
            true,
            "launcher = \"auto\": no AppArmor or SELinux on this node; QEMU is confined by \
             its own uid, mount namespace and seccomp",
        ),
    }
}

fn choice(direct: bool, why: &str) -> Choice {
    Choice {
        direct,
        why: why.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_starts_qemu_directly_unless_the_config_or_the_node_needs_libvirt() {
        let config = |launcher, vsock| NodeConfig {
            launcher,
            vsock,
            ..Default::default()
        };
        let facts = |lsm, apparmor_parser| NodeFacts {
            lsm,
            apparmor_parser,
        };
        let plain = facts(NodeLsm::None, false);
        for (launcher, vsock, facts, direct, says) in [
            (
                Launcher::Libvirt,
                VsockTransport::Auto,
                plain,
                false,
                "launcher = \"libvirt\"",
            ),
            (
                Launcher::Direct,
                VsockTransport::Auto,
                plain,
                true,
                "launcher = \"direct\"",
            ),
            (
                Launcher::Auto,
                VsockTransport::Auto,
                plain,
                true,
                "no AppArmor or SELinux",
            ),
            (
                Launcher::Auto,
                VsockTransport::VhostUser,
                plain,
                true,
                "no AppArmor",
            ),
            (Launcher::Auto, VsockTransport::Vhost, plain, false, "CID"),
            (
                Launcher::Auto,
                VsockTransport::Auto,
                facts(NodeLsm::AppArmor, true),
                true,
                "AppArmor profile of the pod's own",
            ),
            (
                Launcher::Auto,
                VsockTransport::Auto,
                facts(NodeLsm::AppArmor, false),
                false,
                "apparmor_parser is missing",
            ),
            (
                Launcher::Auto,
                VsockTransport::Auto,
                facts(NodeLsm::SelinuxEnforcing, true),
                false,
                "SELinux enforces",
            ),
        ] {
            let choice = choose_with(&config(launcher, vsock), || facts);
            assert_eq!(choice.direct, direct, "{launcher:?} {vsock:?} {facts:?}");
            assert!(choice.why.contains(says), "{says:?} in {}", choice.why);
        }
    }
}
