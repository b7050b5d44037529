//! Every program of the shim crate answers `--help` and `--version` (exit status 0, its
//! name and vmlet's version), and the shim and the emulator wrapper, whose other arguments
//! are containerd's and QEMU's, take the Go spellings too.

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
    for (name, program, go_style) in [
        (
            "containerd-shim-vmlet-v2",
            env!("CARGO_BIN_EXE_containerd-shim-vmlet-v2"),
            true,
        ),
        ("vmletctl", env!("CARGO_BIN_EXE_vmletctl"), false),
        ("vmlet-libvirt", env!("CARGO_BIN_EXE_vmlet-libvirt"), false),
        (
            "vmlet-vmwrapper",
            env!("CARGO_BIN_EXE_vmlet-vmwrapper"),
            true,
        ),
    ] {
        let help = answer(program, "--help");
        assert!(help.contains("Usage:"), "{name} --help: {help}");
        assert_eq!(answer(program, "--version"), format!("{name} {version}\n"));
        if go_style {
            assert!(answer(program, "-help").contains("Usage:"));
            assert_eq!(answer(program, "-v"), format!("{name} {version}\n"));
        }
    }
}

#[test]
fn vmletctl_prints_completions_and_names_a_bad_pod_id() {
    let ctl = env!("CARGO_BIN_EXE_vmletctl");
    let out = Command::new(ctl)
        .args(["completion", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("_vmletctl"));
    let dir = std::env::temp_dir().join(format!("vmlet-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(&config, format!("state_dir = {:?}\n", dir.join("state"))).unwrap();
    // `vmletctl console POD` fails, and its message names why.
    let console_error = |pod: &str| {
        let out = Command::new(ctl)
            .arg("--config")
            .arg(&config)
            .args(["console", pod])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = console_error("../etc");
    assert!(err.contains("pod id \"../etc\""), "{err}");
    let err = console_error("nopod");
    assert!(err.contains("no console log"), "{err}");
    let out = Command::new(ctl).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    std::fs::remove_dir_all(&dir).unwrap();
}
