//! Run after the other end-to-end suites: nothing vmlet started may be left.

use vmlet_integration::Stack;

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn nothing_is_left_behind() {
    let s = Stack::from_env().expect("the vmlet stack");
    assert_eq!(
        s.vmlet_domains().unwrap(),
        Vec::<String>::new(),
        "libvirt domains left"
    );
    assert_eq!(s.stack_processes(), Vec::new(), "processes left");
    assert_eq!(s.state_mounts(), Vec::<String>::new(), "mounts left");
    let state = std::fs::read_dir(format!("{}/state", s.dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert_eq!(state, Vec::<String>::new(), "pod state dirs left");
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    // The stack's own node namespace stays until `scripts/stack down`.
    let node = std::env::var("VMLET_NODE_NETNS").unwrap_or_default();
    let left: Vec<String> = String::from_utf8_lossy(&netns.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| (n.starts_with("vmlet-") && *n != node) || n.starts_with("cni-"))
        .map(str::to_owned)
        .collect();
    assert_eq!(left, Vec::<String>::new(), "network namespaces left");
}
