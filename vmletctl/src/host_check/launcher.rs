//! The `launcher` line of the check: what starts the node's pods' QEMU, and what confines
//! it there.

use vmlet_config::{Launcher, NodeConfig};
use vmlet_shim::host::qemu_apparmor::NodeLsm;

use super::{Finding, HostFacts, Verdict};

/// Which launcher the node's pods get, and why a pod of vmlet's guest would not start.
pub fn launcher(config: &NodeConfig, facts: &HostFacts) -> Finding {
    let finding = |verdict, text: String| Finding {
        verdict,
        subject: "launcher",
        text,
    };
    if config.launcher == Launcher::Libvirt {
        return finding(
            Verdict::Ok,
            "libvirt (launcher = \"libvirt\"): each pod's QEMU is a domain libvirt starts and \
             confines"
                .into(),
        );
    }
    let libvirt_still = "a VM image, or a CPU model libvirt expands, still starts through libvirt";
    match facts.lsm {
        NodeLsm::SelinuxEnforcing => finding(
            Verdict::Fail,
            "direct (launcher = \"direct\"), but SELinux enforces on this node and vmlet has no \
             SELinux labels of its own for QEMU: a pod of vmlet's guest is refused; use \
             launcher = \"libvirt\""
                .into(),
        ),
        NodeLsm::AppArmor if !facts.apparmor_parser => finding(
            Verdict::Fail,
            format!(
                "direct (launcher = \"direct\"), but AppArmor is on and helpers.apparmor_parser \
                 ({}) is missing: the shim loads each pod's QEMU profile with it (Debian's \
                 apparmor package)",
                config.helpers.apparmor_parser.display()
            ),
        ),
        NodeLsm::AppArmor => finding(
            Verdict::Ok,
            format!(
                "direct (launcher = \"direct\"): the shim starts each pod's QEMU itself, under \
                 an AppArmor profile of the pod's own ({}POD, loaded with {}); {libvirt_still}",
                vmlet_shim::host::qemu_apparmor::PROFILE_PREFIX,
                config.helpers.apparmor_parser.display()
            ),
        ),
        NodeLsm::None => finding(
            Verdict::Ok,
            format!(
                "direct (launcher = \"direct\"): the shim starts each pod's QEMU itself (no \
                 AppArmor or SELinux on this node: QEMU is confined by its own uid, mount \
                 namespace and seccomp); {libvirt_still}"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_the_launcher_and_what_keeps_a_direct_pod_from_starting() {
        let mut facts = super::super::assess::tests::facts();
        let direct = NodeConfig {
            launcher: Launcher::Direct,
            ..Default::default()
        };
        let libvirt = launcher(&NodeConfig::default(), &facts);
        assert_eq!(libvirt.verdict, Verdict::Ok);
        assert!(libvirt.text.starts_with("libvirt"), "{}", libvirt.text);
        for (lsm, parser, verdict, says) in [
            (NodeLsm::None, false, Verdict::Ok, "no AppArmor or SELinux"),
            (NodeLsm::AppArmor, true, Verdict::Ok, "vmlet-qemu-POD"),
            (NodeLsm::AppArmor, false, Verdict::Fail, "apparmor_parser"),
            (NodeLsm::SelinuxEnforcing, true, Verdict::Fail, "SELinux"),
        ] {
            facts.lsm = lsm;
            facts.apparmor_parser = parser;
            let line = launcher(&direct, &facts);
            assert_eq!(line.verdict, verdict, "{lsm:?}: {}", line.text);
            assert!(line.text.starts_with("direct"), "{}", line.text);
            assert!(line.text.contains(says), "{says:?} in {}", line.text);
        }
    }
}
