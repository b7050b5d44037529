//! End to end, under libvirt (`make test`'s libvirt pass): libvirt's daemon down while a
//! pod is deleted. The teardown cannot remove the pod's domain, so the delete fails and
//! keeps the pod's directory and its journal (before, the directory went and with it the
//! record of what the pod still had); the shim then gone (containerd gave up on it),
//! containerd's cleanup after the dead shim removes everything once libvirt is back.

use crate::support::{stack, stack_script, text};
use std::path::Path;
use std::time::Duration;

use vmlet_integration::{libvirt_launcher, unique_id, Stack};

/// Starts the stack's libvirtd again when dropped (a failed assertion too).
struct LibvirtBack<'a>(&'a Stack);

impl Drop for LibvirtBack<'_> {
    fn drop(&mut self) {
        stack_script(self.0, "start-libvirt");
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_delete_while_libvirt_is_down_keeps_the_pods_journal_until_it_is_back() {
    let s = stack();
    let _libvirt = libvirt_launcher();
    let id = unique_id("lvdown");
    s.run_detached(&id, &["sleep", "1000"]).unwrap();
    assert!(s.has_pod_domain(&id));
    let state = format!("{}/state/{id}", s.dir);
    {
        stack_script(&s, "stop-libvirt");
        let _back = LibvirtBack(&s);
        let killed = s
            .ctr_output(&["task", "kill", "-s", "SIGKILL", &id])
            .unwrap();
        assert!(killed.status.success(), "{}", text(&killed.stderr));
        s.wait_status(&id, "STOPPED", Duration::from_secs(30))
            .unwrap();
        let deleted = s.ctr_output(&["task", "delete", &id]).unwrap();
        assert!(
            !deleted.status.success(),
            "the task was deleted while its domain could not be removed"
        );
        assert!(
            text(&deleted.stderr).contains("kept for the next try"),
            "{}",
            text(&deleted.stderr)
        );
        assert!(
            Path::new(&state).join("state.json").is_file(),
            "the pod's journal was not kept"
        );
    }
    // libvirt back, the shim then gone (containerd gave up on it, say): containerd's cleanup
    // after the dead shim (`shim delete`) reads the journal the failed delete kept.
    crate::faults::kill_pod_process(&s, &id, "containerd-shim-vmlet-v2");
    // The task is gone with its shim, or goes now.
    let deleted = s.ctr_output(&["task", "delete", &id]).unwrap();
    assert!(
        deleted.status.success() || text(&deleted.stderr).contains("not found"),
        "{}",
        text(&deleted.stderr)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while Path::new(&state).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod's state is still there 30 s after its shim was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let removed = s.ctr_output(&["container", "rm", &id]).unwrap();
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    crate::faults::assert_nothing_left(&s, &id);
}
