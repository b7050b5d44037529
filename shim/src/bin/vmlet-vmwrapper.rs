//! `vmlet-vmwrapper`: the domain's `<emulator>`. libvirt runs it for capability probes and
//! for the domain; it executes QEMU with the arguments it was given. (Pod networking will
//! make it fetch tap file descriptors from the shim before it does.)

use std::os::unix::process::CommandExt;

/// QEMU used when the domain names none (libvirt's capability probes run without the
/// domain's environment).
const DEFAULT_QEMU: &str = "/usr/bin/qemu-system-x86_64";

fn main() {
    let qemu = std::env::var("VMLET_QEMU").unwrap_or_else(|_| DEFAULT_QEMU.into());
    let error = std::process::Command::new(&qemu)
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!("vmlet-vmwrapper: exec {qemu}: {error}");
    std::process::exit(127);
}
