//! A container process's privileges, applied as runc applies them: the bounding set is
//! dropped before the identity changes (with `PR_SET_KEEPCAPS`, so the permitted set
//! survives `setuid`), then the effective, permitted and inheritable sets are set
//! (`capset`), the ambient set raised, and `no_new_privileges` set last before `execve`;
//! the seccomp filter goes in right before `execve` under `no_new_privileges`, else before
//! the capabilities drop (installing one without it takes CAP_SYS_ADMIN).
//! Runs single-threaded in the container's init or exec process, before it executes.

use crate::init_spec::{CapabilitySpec, SeccompSpec};

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// The highest capability number the guest kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Before the identity changes: drops every capability not in the bounding set and keeps
/// the permitted set across `setuid`.
pub fn before_identity(caps: &CapabilitySpec) -> Result<(), String> {
    for cap in 0..=last_cap() {
        if caps.bounding.contains(&cap) {
            continue;
        }
        // SAFETY: prctl with PR_CAPBSET_DROP takes a capability number.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(os_error(&format!(
                "drop capability {cap} from the bounding set"
            )));
        }
    }
    // SAFETY: prctl with PR_SET_KEEPCAPS takes 0 or 1.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
        return Err(os_error("keep capabilities"));
    }
    Ok(())
}

fn words(set: &[u32]) -> [u32; 2] {
    let mut w = [0u32; 2];
    for &cap in set.iter().filter(|c| **c < 64) {
        w[(cap / 32) as usize] |= 1 << (cap % 32);
    }
    w
}

/// After the identity changed: the effective, permitted, inheritable and ambient sets.
pub fn after_identity(caps: &CapabilitySpec) -> Result<(), String> {
    let (e, p, i) = (
        words(&caps.effective),
        words(&caps.permitted),
        words(&caps.inheritable),
    );
    let mut data = [CapData::default(); 2];
    for (k, d) in data.iter_mut().enumerate() {
        *d = CapData {
            effective: e[k],
            permitted: p[k],
            inheritable: i[k],
        };
    }
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads a version-3 header and two data structs, both valid here.
    if unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) } != 0 {
        return Err(os_error("set capabilities"));
    }
    // SAFETY: prctl PR_CAP_AMBIENT with CLEAR_ALL takes no further arguments.
    let cleared = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if cleared != 0 {
        return Err(os_error("clear the ambient capabilities"));
    }
    for &cap in &caps.ambient {
        // SAFETY: prctl PR_CAP_AMBIENT_RAISE takes a capability number. A capability
        // not both permitted and inheritable cannot be ambient: skipped, as runc does.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
    }
    Ok(())
}

/// `no_new_privileges`: no execve may grant what the process does not have (setuid bits,
/// file capabilities).
pub fn no_new_privileges() -> Result<(), String> {
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes 1.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os_error("set no_new_privs"));
    }
    Ok(())
}

/// Installs a compiled seccomp filter on the calling thread (the helper is single-threaded).
/// Without `no_new_privileges` this needs CAP_SYS_ADMIN, so the caller installs it before
/// the capabilities drop, as runc does.
pub fn install_seccomp(filter: &SeccompSpec) -> Result<(), String> {
    if filter.program.is_empty() || !filter.program.len().is_multiple_of(8) {
        return Err(format!(
            "seccomp program of {} bytes is not a list of instructions",
            filter.program.len()
        ));
    }
    let mut insns: Vec<libc::sock_filter> = filter
        .program
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let prog = libc::sock_fprog {
        len: u16::try_from(insns.len()).map_err(|_| "seccomp program too long".to_string())?,
        filter: insns.as_mut_ptr(),
    };
    // SAFETY: seccomp(SECCOMP_SET_MODE_FILTER) reads `prog`, which points at `insns`, alive
    // for the call; the kernel checks the program itself.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            filter.flags as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        )
    };
    if ret != 0 {
        return Err(os_error("install the seccomp filter"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_become_two_words() {
        assert_eq!(words(&[]), [0, 0]);
        assert_eq!(words(&[0, 5, 31]), [0x8000_0021, 0]);
        assert_eq!(words(&[32, 40]), [0, 0x101]);
        assert_eq!(words(&[99]), [0, 0], "out of range: ignored");
    }
}
