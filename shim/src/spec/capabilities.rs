//! OCI capability names -> the kernel's capability numbers (`linux/capability.h`), for the
//! agent, which applies the sets inside the guest as runc does.

use oci_spec::runtime::{Capabilities as CapSet, LinuxCapabilities};
use vmlet_protocol::agent::Capabilities;

use crate::Error;

/// Every capability, in the kernel's order: the index is its number.
pub const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The kernel's number for a capability name (`CAP_SYS_ADMIN` -> 21).
pub fn number(name: &str) -> Option<u32> {
    NAMES.iter().position(|n| *n == name).map(|i| i as u32)
}

fn numbers(set: &Option<CapSet>, which: &str, what: &str) -> Result<Vec<u32>, Error> {
    let mut out: Vec<u32> = Vec::new();
    for cap in set.iter().flatten() {
        let name = serde_json::to_value(cap)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let n = number(&name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what}: capability {name:?} in its {which} set is not one vmlet knows"
            ))
        })?;
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// The agent's view of a process's capability sets; `what` names the process in errors.
pub fn agent_capabilities(caps: &LinuxCapabilities, what: &str) -> Result<Capabilities, Error> {
    Ok(Capabilities {
        bounding: numbers(caps.bounding(), "bounding", what)?,
        effective: numbers(caps.effective(), "effective", what)?,
        permitted: numbers(caps.permitted(), "permitted", what)?,
        inheritable: numbers(caps.inheritable(), "inheritable", what)?,
        ambient: numbers(caps.ambient(), "ambient", what)?,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_have_the_kernels_numbers() {
        assert_eq!(number("CAP_CHOWN"), Some(0));
        assert_eq!(number("CAP_NET_RAW"), Some(13));
        assert_eq!(number("CAP_SYS_ADMIN"), Some(21));
        assert_eq!(number("CAP_AUDIT_WRITE"), Some(29));
        assert_eq!(number("CAP_CHECKPOINT_RESTORE"), Some(40));
        assert_eq!(number("CAP_NOPE"), None);
    }

    #[test]
    fn every_oci_capability_is_known() {
        // oci-spec's own list (its enum) must map: a spec it parses is never refused here.
        let all: LinuxCapabilities = serde_json::from_str(&format!(
            r#"{{"bounding": {names}, "effective": {names}, "permitted": {names}}}"#,
            names = serde_json::to_string(&NAMES[..]).unwrap()
        ))
        .unwrap();
        let caps = agent_capabilities(&all, "test").unwrap();
        assert_eq!(caps.bounding, (0..41).collect::<Vec<u32>>());
        assert!(caps.ambient.is_empty());
    }

    #[test]
    fn sets_are_translated_one_by_one() {
        let docker: LinuxCapabilities = serde_json::from_str(
            r#"{"bounding": ["CAP_KILL", "CAP_CHOWN"], "effective": ["CAP_KILL"],
                "permitted": ["CAP_KILL"], "ambient": ["CAP_KILL"]}"#,
        )
        .unwrap();
        let caps = agent_capabilities(&docker, "test").unwrap();
        assert_eq!(caps.bounding, [0, 5]);
        assert_eq!((caps.effective, caps.permitted), (vec![5], vec![5]));
        assert!(caps.inheritable.is_empty());
        assert_eq!(caps.ambient, [5]);
    }
}
