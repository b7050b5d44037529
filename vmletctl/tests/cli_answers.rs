//! `vmletctl` answers `--help` and `--version`, prints completions, and names what is wrong
//! with a pod id it is given.

use std::process::Command;

#[test]
fn vmletctl_answers_help_and_version() {
    let ctl = env!("CARGO_BIN_EXE_vmletctl");
    let out = Command::new(ctl).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
    let out = Command::new(ctl).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("vmletctl {}\n", env!("CARGO_PKG_VERSION"))
    );
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
    assert!(
        err.contains("pod \"../etc\": expected a pod id or NAMESPACE/NAME"),
        "{err}"
    );
    let err = console_error("..etc");
    assert!(err.contains("pod id \"..etc\""), "{err}");
    let err = console_error("default/nopod");
    assert!(err.contains("no pod default/nopod on this node"), "{err}");
    let err = console_error("nopod");
    assert!(err.contains("no console log"), "{err}");
    let out = Command::new(ctl).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    std::fs::remove_dir_all(&dir).unwrap();
}
