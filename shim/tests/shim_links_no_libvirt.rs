//! The shim (one per pod, alive as long as its pod) must not map libvirt's libraries: its
//! libvirt calls go through `vmlet-libvirt`. The shim crate does not depend on `virt`; this
//! checks the binary too (a dependency that brought libvirt in would show here).

#[test]
fn the_shim_binary_needs_no_libvirt() {
    let shim = env!("CARGO_BIN_EXE_containerd-shim-vmlet-v2");
    let out = std::process::Command::new("ldd")
        .arg(shim)
        .output()
        .unwrap();
    let libraries = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ldd {shim}: {libraries}");
    assert!(!libraries.contains("libvirt"), "{libraries}");
}
