//! The last steps of every container process (a container's init or an exec): session and
//! controlling terminal, limits, capabilities and identity, no_new_privs, environment (with
//! HOME from the container's /etc/passwd when it names none, as runc sets it), working
//! directory, seccomp, then execve.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::{setgid, setgroups, setsid, setuid, Gid, Uid};

use crate::init_spec::ProcessSpec;

/// Becomes the process `spec` describes. Returns only with the reason it could not.
pub fn become_process(spec: &ProcessSpec) -> String {
    if let Err(e) = setsid() {
        return format!("setsid: {e}");
    }
    if spec.terminal {
        // SAFETY: TIOCSCTTY takes an int argument; fd 0 is the terminal the agent opened.
        if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } != 0 {
            return format!(
                "make the terminal controlling: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    for limit in &spec.rlimits {
        let rlim = libc::rlimit {
            rlim_cur: limit.soft,
            rlim_max: limit.hard,
        };
        // SAFETY: setrlimit reads a valid rlimit struct; the kernel refuses an unknown
        // resource number with EINVAL.
        if unsafe { libc::setrlimit(limit.resource as _, &rlim) } != 0 {
            return format!(
                "setrlimit({}): {}",
                limit.resource,
                std::io::Error::last_os_error()
            );
        }
    }
    // Without no_new_privileges a filter needs CAP_SYS_ADMIN: before the capabilities go.
    if let Some(filter) = spec.seccomp.as_ref().filter(|_| !spec.no_new_privileges) {
        if let Err(e) = crate::privileges::install_seccomp(filter) {
            return e;
        }
    }
    if let Some(caps) = &spec.capabilities {
        if let Err(e) = crate::privileges::before_identity(caps) {
            return e;
        }
    }
    // Read as the container's root, before the identity changes (as runc does).
    let home = names_no_home(&spec.env).then(|| home_of(spec.uid));
    let gids: Vec<Gid> = spec
        .additional_gids
        .iter()
        .map(|g| Gid::from_raw(*g))
        .collect();
    if let Err(e) = setgroups(&gids) {
        return format!("setgroups: {e}");
    }
    if let Err(e) = setgid(Gid::from_raw(spec.gid)) {
        return format!("setgid {}: {e}", spec.gid);
    }
    if let Err(e) = setuid(Uid::from_raw(spec.uid)) {
        return format!("setuid {}: {e}", spec.uid);
    }
    if let Some(caps) = &spec.capabilities {
        if let Err(e) = crate::privileges::after_identity(caps) {
            return e;
        }
    }
    if spec.no_new_privileges {
        if let Err(e) = crate::privileges::no_new_privileges() {
            return e;
        }
    }
    let Some(program) = spec.args.first() else {
        return "no process args".into();
    };
    if CString::new(program.as_str()).is_err() {
        return format!("bad program name {program:?}");
    }
    let mut command = Command::new(program);
    command.args(&spec.args[1..]).env_clear();
    for pair in &spec.env {
        let (key, value) = pair.split_once('=').unwrap_or((pair.as_str(), ""));
        command.env(key, value);
    }
    if let Some(home) = &home {
        command.env("HOME", home);
    }
    if !spec.cwd.is_empty() {
        if let Err(e) = std::env::set_current_dir(&spec.cwd) {
            return format!("chdir {:?}: {e}", spec.cwd);
        }
    }
    // Under no_new_privileges the filter goes in last, so that it sees only execve.
    if let Some(filter) = spec.seccomp.as_ref().filter(|_| spec.no_new_privileges) {
        if let Err(e) = crate::privileges::install_seccomp(filter) {
            return e;
        }
    }
    let error = command.exec();
    format!("exec {program:?}: {error}")
}

/// The largest /etc/passwd read for a home directory.
const MAX_PASSWD_BYTES: u64 = 1024 * 1024;

fn names_no_home(env: &[String]) -> bool {
    !env.iter().any(|pair| pair.starts_with("HOME="))
}

/// The home directory a process gets when its environment names none, as runc gives it:
/// the one the container's /etc/passwd gives its uid, or `/`. The file is opened without
/// blocking (a FIFO there would hang the start), read only if regular, and at most 1 MiB.
fn home_of(uid: u32) -> String {
    read_passwd()
        .and_then(|passwd| passwd_home(&passwd, uid))
        .unwrap_or_else(|| "/".into())
}

fn read_passwd() -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/etc/passwd")
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_PASSWD_BYTES).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The home field of `uid`'s first line in a passwd file, if it has one.
fn passwd_home(passwd: &str, uid: u32) -> Option<String> {
    let uid = uid.to_string();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() >= 7 && fields[2] == uid)
        .map(|fields| fields[5].to_string())
        .filter(|home| !home.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                          nobody:x:65534:65534:nobody:/home:/bin/false\n\
                          broken:x:7\n\
                          empty:x:1000:1000:::/bin/sh\n";

    #[test]
    fn a_uid_gets_the_home_its_passwd_line_names() {
        assert_eq!(passwd_home(PASSWD, 0).as_deref(), Some("/root"));
        assert_eq!(passwd_home(PASSWD, 65534).as_deref(), Some("/home"));
    }

    #[test]
    fn a_home_the_environment_names_is_kept() {
        let env = |pairs: &[&str]| pairs.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert!(names_no_home(&env(&["PATH=/bin", "HOMEDIR=/x"])));
        assert!(!names_no_home(&env(&["PATH=/bin", "HOME=/elsewhere"])));
        assert!(!names_no_home(&env(&["HOME="])));
    }

    #[test]
    fn a_uid_without_a_usable_line_gets_none() {
        assert_eq!(passwd_home(PASSWD, 7), None);
        assert_eq!(passwd_home(PASSWD, 1000), None);
        assert_eq!(passwd_home(PASSWD, 4242), None);
        assert_eq!(passwd_home("", 0), None);
    }
}
