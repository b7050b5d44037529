//! The last steps of every container process (a container's init or an exec): session and
//! controlling terminal, limits, capabilities and identity, no_new_privs, environment,
//! working directory, seccomp, then execve.

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
