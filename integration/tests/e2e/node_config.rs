//! End to end: a bad node config stops the create with a message naming the key (and line)
//! in ctr's error and in containerd's log, and leaves nothing behind. The test rewrites the
//! stack's config file (`VMLET_CONFIG`, read by the shim at every create) and restores it,
//! also when it fails. Run by `make test`.

use vmlet_integration::{unique_id, ConfigSwap, Stack};

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_bad_node_config_is_named_and_leaves_nothing() {
    let s = Stack::from_env().expect("the vmlet stack");
    let original = std::fs::read_to_string(std::env::var("VMLET_CONFIG").unwrap()).unwrap();
    for (bad, named) in [
        // An unknown key: named with its line.
        (
            format!("{original}\nbogus_key = 1\n"),
            vec!["bogus_key", "line"],
        ),
        // A value out of range.
        (
            original.replace("[guest]", "[guest]\nvcpus = 0"),
            vec!["guest.vcpus", "at least 1"],
        ),
        // An allowlist entry vmlet does not know.
        (
            original.replace("allowed = [", "allowed = [\"vmlet.io/nonsense\", "),
            vec!["annotations.allowed", "vmlet.io/nonsense"],
        ),
    ] {
        assert_ne!(bad, original, "the test's edit did not apply");
        let log_before = s.containerd_log().len();
        let id = unique_id("badcfg");
        let out = {
            let swap = ConfigSwap::with(&bad);
            assert_eq!(swap.original(), original);
            s.run(&id, &[], &["true"]).unwrap()
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a bad config was accepted");
        let log = s.containerd_log();
        let new_log = &log[log_before.min(log.len())..];
        for word in &named {
            assert!(stderr.contains(word), "ctr does not name {word}: {stderr}");
            assert!(
                new_log.contains(word),
                "the log does not name {word}: {new_log}"
            );
        }
        assert!(
            !std::path::Path::new(&format!("{}/state/{id}", s.dir)).exists(),
            "state left behind"
        );
        assert!(!s.has_pod_domain(&id), "domain left");
        let _ = s.ctr_output(&["container", "rm", &id]);
    }
    // The restored config works again.
    let out = s.run(&unique_id("goodcfg"), &[], &["true"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
