//! `vmlet-image` answers `--help` and `--version`, and names a wrong flag.

use std::process::Command;

#[test]
fn vmlet_image_answers_help_and_version() {
    let image = env!("CARGO_BIN_EXE_vmlet-image");
    let out = Command::new(image).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("build"));
    let out = Command::new(image).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("vmlet-image {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(image)
        .args([
            "build",
            "--out",
            "/nonexistent",
            "--kernel",
            "lean",
            "--kernel-deb",
            "k.deb",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kernel-deb"));
}
