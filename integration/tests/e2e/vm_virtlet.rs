//! End to end: a pod written for Virtlet runs on vmlet as it is (docs/vm-mode.md, "From
//! Virtlet"): CRI Proxy's `kubernetes.io/target-runtime: virtlet.cloud` makes it a VM-mode
//! pod, its image is named `virtlet.cloud/...`, and Virtlet's annotations keep their
//! meaning: vCPUs and disk driver, SSH keys and user, cloud-init user-data and meta-data,
//! and the config drive of `VirtletCloudInitImageType: configdrive`, from which the guest
//! takes its identity and the pod's address. The RuntimeClass handler stands where CRI
//! Proxy stood. Run by `make test`.

use crate::support::{stack, PodUnderTest};
use crate::vm_mode::{marker_in, vm_image};
use vmlet_integration::cri::Cri;
use vmlet_integration::{bounded, Stack};

/// The test image under a name of Virtlet's, in the CRI plugin's namespace.
const VIRTLET_IMAGE: &str = "virtlet.cloud/debian-vm:12";

/// What the guest prints: its host name, cloud-init's instance id, the device of the
/// volume labelled `config-2`, eth0's address and how it got it (a DHCP lease, or the
/// config drive's network data), how many lines of the environment file name the
/// container's variable, its CPUs and how many authorized_keys files hold the pod's key.
const USER_DATA: &str = r#"runcmd:
  - echo "vmlet-marker $(hostname) $(cat /var/lib/cloud/data/instance-id) $(blkid -L config-2 || echo no-config-drive) $(ip -4 -o addr show eth0 | awk '{print $4}') $(test -s /var/lib/dhcp/dhclient.eth0.leases && echo by-dhcp || echo by-seed) env=$(grep -c VIRTLET_POD_VAR /etc/cloud/environment) cpus=$(nproc) keys=$(cat /home/*/.ssh/authorized_keys /root/.ssh/authorized_keys 2>/dev/null | grep -c AAAAC3NzaC1lZDI1NTE5AAAAIG1vbGV0)"
"#;

/// `ctr -n k8s.io images ARGS` on the stack's containerd.
fn images(s: &Stack, args: &[&str]) -> std::process::Output {
    bounded::output(
        std::process::Command::new("ctr")
            .args(["-a", &s.containerd, "-n", "k8s.io", "images"])
            .args(args),
    )
    .unwrap()
}

/// The test image's `virtlet.cloud/` name, removed when dropped (also when the test fails).
struct VirtletTag<'a>(&'a Stack);

impl<'a> VirtletTag<'a> {
    fn new(s: &'a Stack) -> Self {
        let tagged = images(s, &["tag", "--force", &vm_image(), VIRTLET_IMAGE]);
        assert!(tagged.status.success(), "{tagged:?}");
        VirtletTag(s)
    }
}

impl Drop for VirtletTag<'_> {
    fn drop(&mut self) {
        let _ = bounded::output(
            std::process::Command::new("ctr")
                .args(["-a", &self.0.containerd, "-n", "k8s.io", "images", "rm"])
                .arg(VIRTLET_IMAGE),
        );
    }
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_virtlet_pod_spec_runs_unchanged_from_a_config_drive() {
    let s = stack();
    let _tag = VirtletTag::new(&s);
    let mut p = PodUnderTest::start_with(&s, |c| {
        for (key, value) in [
            ("kubernetes.io/target-runtime", "virtlet.cloud"),
            ("VirtletVCPUCount", "1"),
            ("VirtletDiskDriver", "virtio"),
            (
                "VirtletSSHKeys",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG1vbGV0 me@localhost\n",
            ),
            ("VirtletSSHUser", "debian"),
            ("VirtletCloudInitImageType", "configdrive"),
            ("VirtletCloudInitMetaData", "instance-id: foobar\n"),
            ("VirtletCloudInitUserData", USER_DATA),
        ] {
            c.annotations.insert(key.into(), value.into());
        }
    })
    .await;
    let name = p.config.metadata.as_ref().unwrap().name.clone();
    let ip = p.cri.pod_ip(&p.pod).await.unwrap();
    let mut container = Cri::container_config(&p.config, "vm", VIRTLET_IMAGE, &[], 0);
    container.envs = vec![k8s_cri::v1::KeyValue {
        key: "VIRTLET_POD_VAR".into(),
        value: "1".into(),
    }];
    let (pod, config) = (p.pod.clone(), p.config.clone());
    let c = p
        .cri
        .create_and_start_config(&pod, &config, container)
        .await;
    let marker = match &c {
        Ok(_) => Some(marker_in(&p.logs.join("vm.log"), &name, "configdrive").await),
        Err(_) => None,
    };
    let c = c.unwrap();
    p.finish(&[&c]).await;
    let marker = marker.unwrap();
    assert!(
        marker.contains(&format!("vmlet-marker {name} foobar /dev/vd")),
        "the host name, the meta-data's instance id and the config drive: {marker}"
    );
    assert!(
        marker.contains(&format!(" {ip}/")) && marker.contains(" by-seed "),
        "the pod's address from the config drive's network_data.json: {marker}"
    );
    // The key is the default user's (and root's, behind cloud-init's "log in as" stop).
    let keys: u32 = marker
        .rsplit(" keys=")
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        marker.contains(" env=1 cpus=1 keys=") && keys >= 1,
        "the container's environment, VirtletVCPUCount, VirtletSSHKeys: {marker}"
    );
}
