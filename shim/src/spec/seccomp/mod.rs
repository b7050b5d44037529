//! The spec's `linux.seccomp`, compiled on the host into the classic BPF program the agent
//! installs in the guest right before a container process executes (pure Rust: the static
//! agent links no libseccomp). As runc does: system call names this kernel's table does not
//! know are skipped, conditions on one argument index repeated in a rule are alternatives
//! (one rule each), `errnoRet` defaults to EPERM. The guest is x86_64: calls of another
//! architecture (i386 `int 0x80`, x32) get ENOSYS whatever the profile says.
//! `SCMP_ACT_NOTIFY` (a seccomp agent on a listener socket) is refused: nothing on the host
//! can serve a guest's notifications.

mod bpf;
mod syscalls_x86_64;

use std::collections::BTreeMap;

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompFilterFlag, LinuxSeccompOperator,
    LinuxSyscall,
};

use crate::Error;
use bpf::{Condition, Op, Rule};

/// `SECCOMP_RET_*`.
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0x0000_0000;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_TRACE: u32 = 0x7ff0_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_DATA: u32 = 0xffff;
/// `SECCOMP_FILTER_FLAG_*`.
const FLAG_TSYNC: u32 = 1;
const FLAG_LOG: u32 = 2;
const FLAG_SPEC_ALLOW: u32 = 4;

/// What the agent installs: `struct sock_filter` bytes and `seccomp(2)` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub program: Vec<u8>,
    pub flags: u32,
}

/// The actions [`compile`] honours (`SCMP_ACT_NOTIFY` it refuses), for `-info`.
pub const SUPPORTED_ACTIONS: &[&str] = &[
    "SCMP_ACT_KILL",
    "SCMP_ACT_KILL_THREAD",
    "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_TRAP",
    "SCMP_ACT_ERRNO",
    "SCMP_ACT_TRACE",
    "SCMP_ACT_LOG",
    "SCMP_ACT_ALLOW",
];
/// The argument comparisons [`compile`] honours, for `-info`.
pub const SUPPORTED_OPERATORS: &[&str] = &[
    "SCMP_CMP_NE",
    "SCMP_CMP_LT",
    "SCMP_CMP_LE",
    "SCMP_CMP_EQ",
    "SCMP_CMP_GE",
    "SCMP_CMP_GT",
    "SCMP_CMP_MASKED_EQ",
];
/// The filter flags [`compile`] passes on, for `-info`.
pub const SUPPORTED_FLAGS: &[&str] = &[
    "SECCOMP_FILTER_FLAG_TSYNC",
    "SECCOMP_FILTER_FLAG_LOG",
    "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
];

fn invalid(what: String) -> Error {
    Error::InvalidArgument(format!("linux.seccomp: {what}"))
}

/// The system call number of `name` on x86_64.
pub fn syscall_number(name: &str) -> Option<u32> {
    let table = syscalls_x86_64::SYSCALLS;
    table
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .map(|i| table[i].1)
}

fn action(action: LinuxSeccompAction, errno: Option<u32>) -> Result<u32, Error> {
    let data = errno.unwrap_or(libc::EPERM as u32) & RET_DATA;
    Ok(match action {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => RET_KILL_THREAD,
        LinuxSeccompAction::ScmpActKillProcess => RET_KILL_PROCESS,
        LinuxSeccompAction::ScmpActTrap => RET_TRAP,
        LinuxSeccompAction::ScmpActErrno => RET_ERRNO | data,
        LinuxSeccompAction::ScmpActTrace => RET_TRACE | data,
        LinuxSeccompAction::ScmpActLog => RET_LOG,
        LinuxSeccompAction::ScmpActAllow => RET_ALLOW,
        LinuxSeccompAction::ScmpActNotify => {
            return Err(Error::Unimplemented(
                "linux.seccomp: SCMP_ACT_NOTIFY (no seccomp agent can serve a VM's guest)".into(),
            ))
        }
    })
}

fn condition(syscall: &str, arg: &oci_spec::runtime::LinuxSeccompArg) -> Result<Condition, Error> {
    let index = u8::try_from(arg.index())
        .ok()
        .filter(|i| *i < 6)
        .ok_or_else(|| invalid(format!("{syscall}: argument index {}", arg.index())))?;
    let (op, value) = match arg.op() {
        LinuxSeccompOperator::ScmpCmpEq => (Op::Eq, arg.value()),
        LinuxSeccompOperator::ScmpCmpNe => (Op::Ne, arg.value()),
        LinuxSeccompOperator::ScmpCmpLt => (Op::Lt, arg.value()),
        LinuxSeccompOperator::ScmpCmpLe => (Op::Le, arg.value()),
        LinuxSeccompOperator::ScmpCmpGt => (Op::Gt, arg.value()),
        LinuxSeccompOperator::ScmpCmpGe => (Op::Ge, arg.value()),
        // OCI (as libseccomp): `value` is the mask, `valueTwo` what the masked arg equals.
        LinuxSeccompOperator::ScmpCmpMaskedEq => (
            Op::MaskedEq(arg.value()),
            arg.value_two().unwrap_or_default(),
        ),
    };
    Ok(Condition {
        arg: index,
        op,
        value,
    })
}

/// The rules of one `syscalls` entry: all its conditions together, or, when an argument
/// index repeats, one rule per condition.
fn entry_rules(entry: &LinuxSyscall, name: &str) -> Result<Vec<Rule>, Error> {
    let act = action(entry.action(), entry.errno_ret())?;
    let conditions = entry
        .args()
        .iter()
        .flatten()
        .map(|a| condition(name, a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut indexes: Vec<u8> = conditions.iter().map(|c| c.arg).collect();
    indexes.sort_unstable();
    indexes.dedup();
    if indexes.len() == conditions.len() {
        return Ok(vec![Rule {
            conditions,
            action: act,
        }]);
    }
    Ok(conditions
        .into_iter()
        .map(|c| Rule {
            conditions: vec![c],
            action: act,
        })
        .collect())
}

/// Compiles a profile. Errors name what in it cannot be honoured.
pub fn compile(profile: &LinuxSeccomp) -> Result<Compiled, Error> {
    if profile.listener_path().is_some() {
        return Err(Error::Unimplemented(
            "linux.seccomp.listenerPath (no seccomp agent can serve a VM's guest)".into(),
        ));
    }
    if let Some(arches) = profile.architectures().as_ref().filter(|a| !a.is_empty()) {
        if !arches
            .iter()
            .any(|a| matches!(a, Arch::ScmpArchX86_64 | Arch::ScmpArchNative))
        {
            return Err(invalid(format!(
                "architectures {arches:?} do not include the guest's SCMP_ARCH_X86_64"
            )));
        }
    }
    let default = action(profile.default_action(), profile.default_errno_ret())?;
    let mut rules: BTreeMap<u32, Vec<Rule>> = BTreeMap::new();
    let mut unknown = Vec::new();
    for entry in profile.syscalls().iter().flatten() {
        for name in entry.names() {
            match syscall_number(name) {
                Some(nr) => rules
                    .entry(nr)
                    .or_default()
                    .extend(entry_rules(entry, name)?),
                None => unknown.push(name.as_str()),
            }
        }
    }
    if !unknown.is_empty() {
        log::info!("seccomp: skipping system calls x86_64 does not have: {unknown:?}");
    }
    let program =
        bpf::program(&rules, default, RET_ERRNO | libc::ENOSYS as u32).map_err(invalid)?;
    let mut flags = 0;
    for flag in profile.flags().iter().flatten() {
        flags |= match flag {
            LinuxSeccompFilterFlag::SeccompFilterFlagTsync => FLAG_TSYNC,
            LinuxSeccompFilterFlag::SeccompFilterFlagLog => FLAG_LOG,
            LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => FLAG_SPEC_ALLOW,
            // The kernel takes it only with a user-notification listener.
            LinuxSeccompFilterFlag::SeccompFilterFlagWaitKillableRecv => {
                return Err(invalid(
                    "flag SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV needs a seccomp notification listener, which vmlet does not support".into(),
                ))
            }
        };
    }
    Ok(Compiled {
        program: bpf::to_bytes(&program),
        flags,
    })
}

#[cfg(test)]
mod tests {
    use super::bpf::interpreter::run;
    use super::bpf::{Insn, AUDIT_ARCH_X86_64};
    use super::*;

    fn profile(json: &str) -> LinuxSeccomp {
        serde_json::from_str(json).unwrap()
    }

    fn insns(bytes: &[u8]) -> Vec<Insn> {
        bytes
            .chunks(8)
            .map(|c| Insn {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect()
    }

    fn nr(name: &str) -> u32 {
        syscall_number(name).unwrap()
    }

    #[test]
    fn the_table_knows_x86_64_numbers() {
        assert_eq!(syscall_number("read"), Some(0));
        assert_eq!(syscall_number("mkdirat"), Some(258));
        assert_eq!(syscall_number("clone3"), Some(435));
        assert_eq!(syscall_number("no_such_call"), None);
    }

    #[test]
    fn a_flag_for_notification_listeners_is_refused_by_name() {
        let p = profile(
            r#"{"defaultAction": "SCMP_ACT_ALLOW",
                "flags": ["SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"]}"#,
        );
        let Err(err) = compile(&p) else {
            panic!("refused");
        };
        assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
        assert!(
            err.message()
                .contains("SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn a_docker_like_profile() {
        let p = profile(
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
                "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
                "flags": ["SECCOMP_FILTER_FLAG_LOG"],
                "syscalls": [
                  {"names": ["read", "write", "not_on_x86_64"], "action": "SCMP_ACT_ALLOW"},
                  {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                   "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
                  {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                   "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]},
                  {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                   "args": [{"index": 0, "value": 2114060288, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
                  {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
                  {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                   "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
                            {"index": 0, "value": 2, "op": "SCMP_CMP_EQ"}]}
                ]}"#,
        );
        let c = compile(&p).unwrap();
        assert_eq!(c.flags, FLAG_LOG);
        let p = insns(&c.program);
        let call = |name: &str, a0: u64| run(&p, AUDIT_ARCH_X86_64, nr(name), [a0, 0, 0, 0, 0, 0]);
        assert_eq!(call("read", 0), RET_ALLOW);
        assert_eq!(call("mkdir", 0), RET_ERRNO | 1);
        assert_eq!(call("personality", 8), RET_ALLOW);
        assert_eq!(call("personality", 9), RET_ERRNO | 1);
        assert_eq!(call("clone", 0x11), RET_ALLOW);
        // CLONE_NEWUSER is in the mask.
        assert_eq!(call("clone", 0x1000_0000), RET_ERRNO | 1);
        assert_eq!(call("clone3", 0), RET_ERRNO | 38);
        assert_eq!(call("socket", 1), RET_ALLOW);
        assert_eq!(call("socket", 2), RET_ALLOW);
        assert_eq!(call("socket", 10), RET_ERRNO | 1);
        assert_eq!(
            run(&p, 0x4000_0003, 0, [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_named() {
        let notify = profile(
            r#"{"defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]}"#,
        );
        let err = compile(&notify).unwrap_err();
        assert!(
            err.message().contains("SCMP_ACT_NOTIFY"),
            "{}",
            err.message()
        );
        let arm = profile(
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_AARCH64"]}"#,
        );
        let err = compile(&arm).unwrap_err();
        assert!(
            err.message().contains("SCMP_ARCH_X86_64"),
            "{}",
            err.message()
        );
        let index = profile(
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"],
                "action": "SCMP_ACT_ERRNO", "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}"#,
        );
        let err = compile(&index).unwrap_err();
        assert!(
            err.message().contains("mkdir: argument index 6"),
            "{}",
            err.message()
        );
    }
}
