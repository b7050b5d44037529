//! Outside a guest, `vmlet-agent` answers `--help` and `--version` instead of starting.

use std::process::Command;

#[test]
fn the_agent_answers_help_and_version() {
    let agent = env!("CARGO_BIN_EXE_vmlet-agent");
    let out = Command::new(agent).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: vmlet-agent"));
    let out = Command::new(agent).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("vmlet-agent {}\n", env!("CARGO_PKG_VERSION"))
    );
}
