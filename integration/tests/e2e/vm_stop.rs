//! End to end: stopping a VM-mode CRI pod's VM (docs/vm-mode.md, "The lifecycle"). The
//! stop presses the ACPI power button and gives the guest the grace period the stop
//! carries (kubelet's `terminationGracePeriodSeconds`): a guest whose shutdown takes
//! seconds finishes it and the container exits 0; a grace period shorter than the
//! shutdown ends QEMU at its end (137). Run by `make test`.

use std::time::{Duration, Instant};

use crate::support::stack;
use crate::vm_mode::{marker_in, vm_image, vm_pod};

/// A guest whose shutdown takes five seconds, then says so on the console.
const USER_DATA: &str = r#"write_files:
  - path: /etc/systemd/system/vmlet-slow-stop.service
    content: |
      [Unit]
      Description=vmlet test: a shutdown that takes five seconds
      [Service]
      Type=oneshot
      RemainAfterExit=yes
      ExecStart=/bin/true
      ExecStop=/bin/sh -c 'sleep 5; echo vmlet-stopped-cleanly > /dev/ttyS0'
runcmd:
  - systemctl daemon-reload && systemctl start vmlet-slow-stop.service
  - echo "vmlet-marker $(hostname) $(systemctl is-active vmlet-slow-stop.service)"
"#;

/// Boots the slow-stopping guest, stops it with `grace` seconds, and returns the exit
/// code, how long the stop took and the console.
async fn stop_with_grace(grace: i64) -> (i32, Duration, String) {
    let s = stack();
    let mut p = vm_pod(&s, USER_DATA, &[]).await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let c = p.container("vm", &vm_image(), &[], 0).await;
    let log = p.logs.join("vm.log");
    let marker = marker_in(&log, &name, "v2").await;
    assert!(marker.trim_end().ends_with(" active"), "{marker}");
    let started = Instant::now();
    p.cri.stop_container(&c, grace).await.unwrap();
    let took = started.elapsed();
    let status = p.cri.container_status(&c).await.unwrap();
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    p.finish(&[&c]).await;
    (status.exit_code, took, console)
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn the_stop_gives_the_guest_its_grace_period_then_ends_qemu() {
    let (code, took, console) = stop_with_grace(60).await;
    assert_eq!(
        code, 0,
        "the guest powered itself off; the console:\n{console}"
    );
    assert!(
        console.contains("vmlet-stopped-cleanly") && took >= Duration::from_secs(5),
        "the shutdown ran whole ({took:?}); the console:\n{console}"
    );
    let (code, took, console) = stop_with_grace(2).await;
    assert_eq!(code, 137, "QEMU ended at the grace period's end");
    assert!(
        !console.contains("vmlet-stopped-cleanly") && took < Duration::from_secs(5),
        "the shutdown was cut short ({took:?}); the console:\n{console}"
    );
}
