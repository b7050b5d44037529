//! End to end: an exec in a VM-mode CRI pod (docs/vm-mode.md, "Exec"), as `crictl exec`
//! and an exec probe make it (ExecSync): run by the image's QEMU guest agent, with its
//! stdout, stderr and exit code; in a guest whose agent does not run, refused within
//! seconds with a message that says so. Run by `make test`.

use crate::support::stack;
use crate::vm_mode::{marker_in, vm_image, vm_pod};

const USER_DATA: &str = r#"runcmd:
  - echo "vmlet-marker $(hostname) $(systemctl is-active qemu-guest-agent)"
"#;

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn an_exec_runs_through_the_guest_agent_and_without_one_says_why() {
    let s = stack();
    let mut p = vm_pod(&s, USER_DATA, &[]).await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let c = p.container("vm", &vm_image(), &[], 0).await;
    let marker = marker_in(&p.logs.join("vm.log"), &name, "v2").await;
    let ran = p
        .cri
        .exec_sync(
            &c,
            &["sh", "-c", "hostname; echo to-stderr >&2; exit 3"],
            30,
        )
        .await;
    // The agent stopped (and kept from starting again): the next exec is refused.
    let _ = p
        .cri
        .exec_sync(&c, &["systemctl", "mask", "--now", "qemu-guest-agent"], 30)
        .await;
    let started = std::time::Instant::now();
    let refused = p.cri.exec_sync(&c, &["true"], 60).await;
    let took = started.elapsed();
    p.finish(&[&c]).await;
    assert!(
        marker.trim_end().ends_with(" active"),
        "the image's agent: {marker}"
    );
    let ran = ran.expect("an exec through the guest agent");
    assert_eq!(ran.exit_code, 3);
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), name);
    assert_eq!(String::from_utf8_lossy(&ran.stderr).trim(), "to-stderr");
    let err = format!("{:#}", refused.expect_err("an exec without a guest agent"));
    assert!(
        err.contains("needs qemu-guest-agent running in the image"),
        "{err}"
    );
    // The agent's 5 s to answer the sync, and not much more.
    assert!(
        took < std::time::Duration::from_secs(12),
        "refused after {took:?}"
    );
}
