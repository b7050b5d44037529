//! `vmlet-libvirt` links libvirt (the shim does not), answers `--help` and `--version`, and
//! refuses a call without an operation as a usage error.

use std::process::Command;

#[test]
fn the_helper_links_libvirt_and_answers_its_usage() {
    let helper = env!("CARGO_BIN_EXE_vmlet-libvirt");
    let out = Command::new("ldd").arg(helper).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("libvirt.so"));
    let out = Command::new(helper).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
    let out = Command::new(helper).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("vmlet-libvirt {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(helper).arg("qemu:///system").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
}
