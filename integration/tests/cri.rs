//! Kubernetes pods through containerd's CRI plugin with runtime handler `vmlet`: the CNI
//! (bridge + host-local) network the plugin set up reaches the VM. containerd runs in the
//! stack's node network namespace, so the CNI bridge lives there. Run by `make test`.

use std::time::{Duration, Instant};

use vmlet_integration::cri::Cri;
use vmlet_integration::{unique_id, Stack};

/// The gateway of the stack's CNI network (scripts/stack).
const GATEWAY: &str = "10.215.0.1";

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn cri_pod_gets_its_cni_address_inside_the_vm() {
    let s = Stack::from_env().expect("the vmlet stack");
    let mut cri = Cri::connect(&s.containerd).await.unwrap();
    let logs = std::env::temp_dir().join(unique_id("vmlet-cri-logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let name = unique_id("cri");
    let config = Cri::pod_config(&name, &unique_id("uid"), &logs.to_string_lossy());
    let pod = cri.run_pod(&config, "vmlet").await.unwrap();
    let ip = cri.pod_ip(&pod).await.unwrap();

    let script = format!(
        "ip addr; ping -c 1 -W 5 {GATEWAY} >/dev/null && echo GATEWAY-OK; echo DONE; sleep 1000"
    );
    let container = cri
        .create_and_start(&pod, &config, "c1", &s.image, &["sh", "-c", &script])
        .await
        .unwrap();
    let log = logs.join("c1.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("DONE") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    cri.remove_container(&container, 2).await.unwrap();
    cri.remove_pod(&pod).await.unwrap();
    std::fs::remove_dir_all(&logs).unwrap();
    assert!(
        text.contains(&format!("{ip}/")),
        "the CNI address {ip} is not in the guest:\n{text}"
    );
    assert!(
        text.contains("GATEWAY-OK"),
        "the bridge gateway is not reachable:\n{text}"
    );
    assert_eq!(
        s.vmlet_domains().unwrap(),
        Vec::<String>::new(),
        "the pod's VM is left"
    );
}
