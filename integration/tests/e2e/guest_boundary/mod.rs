//! The guest is untrusted. Exploit tests of the host side of the pod's share: a compromised
//! guest (the agent's `share-in-containers` fault gives a privileged container the agent's
//! whole view of the share) plants what it can; containers with binds are then added and
//! removed and the pod deleted. Host canaries outside the state directory (a file, a
//! directory, a mount) must come through unchanged. And a guest that ignores SIGKILL still
//! has its pod killed. Run by `make test`.

use crate::support::{stack, text};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmlet_integration::{unique_id, ConfigSwap, Stack};

mod cgroups;
mod share;

/// The stack's node config with the guest kernel parameters `params` (how the node's
/// admin, and only the admin, switches on the agent's test faults).
fn with_guest_kernel_params(params: &str) -> ConfigSwap {
    ConfigSwap::edited(|original| {
        assert!(original.contains("[guest]\n"), "{original}");
        let line = format!("[guest]\nkernel_params = \"{params}\"\n");
        original.replacen("[guest]\n", &line, 1)
    })
}

/// How long the shim gives the guest to report a SIGKILL of the pod (the shim's
/// `KILL_GRACE`), and the margin for destroying the VM and seeing QEMU's end.
const KILL_GRACE: Duration = Duration::from_secs(5);

const KILL_MARGIN: Duration = Duration::from_secs(15);

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_guest_that_ignores_sigkill_is_ended() {
    let s = stack();
    let _stubborn = with_guest_kernel_params("vmlet.fault=ignore-signals");
    let pod = unique_id("stubborn");
    s.run_detached(&pod, &["sleep", "1000"]).unwrap();
    let killed = Instant::now();
    let kill = s
        .ctr_output(&["task", "kill", "-s", "SIGKILL", &pod])
        .unwrap();
    assert!(kill.status.success(), "{}", text(&kill.stderr));
    s.wait_status(&pod, "STOPPED", KILL_GRACE + KILL_MARGIN)
        .unwrap();
    let took = killed.elapsed();
    println!(
        "guest ignoring SIGKILL -> task STOPPED in {} ms",
        took.as_millis()
    );
    assert!(
        took >= KILL_GRACE,
        "the guest did obey after {took:?}: the fault is off"
    );
    let delete = s.ctr_output(&["task", "delete", &pod]).unwrap();
    assert!(
        text(&delete.stderr).contains("137") || delete.status.code() == Some(137),
        "ctr task delete reports 137: {} {:?}",
        text(&delete.stderr),
        delete.status
    );
    let rm = s.ctr_output(&["container", "rm", &pod]).unwrap();
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let domain = format!("vmlet-{pod}");
    assert!(!s.vmlet_domains().unwrap().contains(&domain), "domain left");
    assert_eq!(s.pod_processes(&pod), Vec::new(), "processes left");
    assert!(!Path::new(&s.dir).join("state").join(&pod).exists());
}

/// [`Stack::run_detached_with`] for a task of the CRI kind `kind` (`sandbox` or
/// `container`) in the pod whose sandbox is `pod`, annotated as the CRI plugin does.
fn run_in_pod(
    s: &Stack,
    id: &str,
    kind: &str,
    pod: &str,
    extra: &[&str],
    command: &[&str],
) -> anyhow::Result<()> {
    let kind = format!("io.kubernetes.cri.container-type={kind}");
    let sandbox = format!("io.kubernetes.cri.sandbox-id={pod}");
    let mut args = vec![
        "--annotation",
        kind.as_str(),
        "--annotation",
        sandbox.as_str(),
    ];
    args.extend_from_slice(extra);
    s.run_detached_with(id, &args, command)
}
