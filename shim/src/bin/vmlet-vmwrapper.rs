//! `vmlet-vmwrapper`: the domain's `<emulator>`. libvirt runs it for capability probes
//! (no vmlet environment: it simply executes QEMU) and for the domain, whose `<qemu:env>`
//! names the QEMU binary and, for a pod with a network, the shim's tap socket: then it
//! fetches the tap fds and appends their `-netdev`/`-device` arguments before it executes
//! QEMU. A lone `--help` or `--version` is its own (see [`vmlet_shim::cli::wrapper_command`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use vmlet_shim::cli::{answer_help_or_version, wrapper_command};
use vmlet_shim::host::taps::{fetch, qemu_args, TAP_SOCKET_ENV};
use vmlet_shim::vmm::vm_spec::QEMU_ENV;

/// QEMU used when the domain names none (libvirt's capability probes).
const DEFAULT_QEMU: &str = "/usr/bin/qemu-system-x86_64";

fn main() {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if answer_help_or_version(wrapper_command(), &args) {
        return;
    }
    let qemu = std::env::var(QEMU_ENV).unwrap_or_else(|_| DEFAULT_QEMU.into());
    if let Some(socket) = std::env::var_os(TAP_SOCKET_ENV) {
        match fetch(&PathBuf::from(&socket)) {
            Ok((taps, fds)) => args.extend(qemu_args(&taps, &fds).into_iter().map(OsString::from)),
            Err(e) => {
                eprintln!(
                    "vmlet-vmwrapper: taps from {}: {}",
                    PathBuf::from(socket).display(),
                    e.message()
                );
                std::process::exit(1);
            }
        }
    }
    let error = std::process::Command::new(&qemu).args(args).exec();
    eprintln!("vmlet-vmwrapper: exec {qemu}: {error}");
    std::process::exit(127);
}
