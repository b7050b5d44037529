//! The `launcher` line of the check: what starts the node's pods' QEMU, why
//! ([`vmlet_shim::vmm::launcher_choice`]), and what would keep a pod from starting.

use vmlet_config::NodeConfig;
use vmlet_shim::host::qemu_apparmor::{NodeLsm, PROFILE_PREFIX};
use vmlet_shim::vmm::launcher_choice::{choose_with, Choice, NodeFacts};

use super::{Finding, HostFacts, Verdict};

/// The launcher the node's pods get, by the facts.
pub fn choice(config: &NodeConfig, facts: &HostFacts) -> Choice {
    choose_with(config, || NodeFacts {
        lsm: facts.lsm,
        apparmor_parser: facts.apparmor_parser,
    })
}

/// Which launcher the node's pods get, and why a pod of vmlet's guest would not start.
pub fn launcher(config: &NodeConfig, facts: &HostFacts) -> Finding {
    let choice = choice(config, facts);
    let finding = |verdict, text: String| Finding {
        verdict,
        subject: "launcher",
        text,
    };
    if !choice.direct {
        return finding(
            Verdict::Ok,
            format!(
                "libvirt: each pod's QEMU is a domain libvirt starts and confines ({})",
                choice.why
            ),
        );
    }
    let parser = config.helpers.apparmor_parser.display();
    match facts.lsm {
        NodeLsm::SelinuxEnforcing => finding(
            Verdict::Fail,
            format!(
                "direct ({}), but SELinux enforces on this node and vmlet has no SELinux \
                 labels of its own for QEMU: a pod of vmlet's guest is refused; use launcher = \
                 \"libvirt\" or \"auto\"",
                choice.why
            ),
        ),
        NodeLsm::AppArmor if !facts.apparmor_parser => finding(
            Verdict::Fail,
            format!(
                "direct ({}), but AppArmor is on and helpers.apparmor_parser ({parser}) is \
                 missing: the shim loads each pod's QEMU profile with it (Debian's apparmor \
                 package)",
                choice.why
            ),
        ),
        lsm => {
            let profile = match lsm {
                NodeLsm::AppArmor => {
                    format!(" under {PROFILE_PREFIX}POD, loaded with {parser}")
                }
                _ => String::new(),
            };
            finding(
                Verdict::Ok,
                format!(
                    "direct: the shim starts each pod's QEMU itself{profile}, a VM image's \
                     too ({}); a CPU model libvirt expands still starts through libvirt",
                    choice.why
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmlet_config::Launcher;

    #[test]
    fn the_line_says_the_launcher_why_and_what_keeps_a_direct_pod_from_starting() {
        let mut facts = super::super::assess::tests::facts();
        let config = |launcher| NodeConfig {
            launcher,
            ..Default::default()
        };
        let libvirt = launcher(&config(Launcher::Libvirt), &facts);
        assert_eq!(libvirt.verdict, Verdict::Ok);
        assert!(libvirt.text.starts_with("libvirt"), "{}", libvirt.text);
        for (chosen, lsm, parser, verdict, says) in [
            (
                Launcher::Direct,
                NodeLsm::None,
                false,
                Verdict::Ok,
                "direct: ",
            ),
            (
                Launcher::Direct,
                NodeLsm::AppArmor,
                true,
                Verdict::Ok,
                "vmlet-qemu-POD",
            ),
            (
                Launcher::Direct,
                NodeLsm::AppArmor,
                false,
                Verdict::Fail,
                "apparmor_parser",
            ),
            (
                Launcher::Direct,
                NodeLsm::SelinuxEnforcing,
                true,
                Verdict::Fail,
                "SELinux",
            ),
            (
                Launcher::Auto,
                NodeLsm::None,
                false,
                Verdict::Ok,
                "direct: ",
            ),
            (
                Launcher::Auto,
                NodeLsm::AppArmor,
                true,
                Verdict::Ok,
                "vmlet-qemu-POD",
            ),
            (
                Launcher::Auto,
                NodeLsm::AppArmor,
                false,
                Verdict::Ok,
                "libvirt: ",
            ),
            (
                Launcher::Auto,
                NodeLsm::SelinuxEnforcing,
                true,
                Verdict::Ok,
                "libvirt: ",
            ),
        ] {
            facts.lsm = lsm;
            facts.apparmor_parser = parser;
            let line = launcher(&config(chosen), &facts);
            assert_eq!(line.verdict, verdict, "{chosen:?} {lsm:?}: {}", line.text);
            assert!(line.text.contains(says), "{says:?} in {}", line.text);
        }
    }
}
