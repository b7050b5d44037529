//! Both programs of the shim crate answer `--help` and `--version` (exit status 0, its
//! name and vmlet's version), in the Go spellings too: the shim's and the emulator
//! wrapper's other arguments are containerd's and QEMU's.

use std::process::Command;

fn answer(program: &str, arg: &str) -> String {
    let out = Command::new(program)
        .arg(arg)
        // Neither may reach containerd or QEMU for this.
        .env_remove("TTRPC_ADDRESS")
        .env("VMLET_QEMU", "/nonexistent/qemu")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {arg}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn every_program_answers_help_and_version() {
    let version = env!("CARGO_PKG_VERSION");
    for (name, program) in [
        (
            "containerd-shim-vmlet-v2",
            env!("CARGO_BIN_EXE_containerd-shim-vmlet-v2"),
        ),
        ("vmlet-vmwrapper", env!("CARGO_BIN_EXE_vmlet-vmwrapper")),
    ] {
        let help = answer(program, "--help");
        assert!(help.contains("Usage:"), "{name} --help: {help}");
        assert_eq!(answer(program, "--version"), format!("{name} {version}\n"));
        assert!(answer(program, "-help").contains("Usage:"));
        assert_eq!(answer(program, "-v"), format!("{name} {version}\n"));
    }
}
