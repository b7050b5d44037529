//! Growing a pod's VM to hold its containers' memory limits.
//!
//! containerd 1.7 and 2.x tell the sandbox the sum of its containers' limits (the VM is
//! booted that big, [`vmlet_config::VmShape`]); 1.6 does not, and a container's limit can
//! be raised later (UpdateContainerResources). So a VM that may grow boots with a virtio-mem
//! device whose region reaches the node's `guest.max_memory_mib`, none of it plugged, and
//! [`PodMemory`] decides, for each container created or updated, whether the pod's limits
//! plus the node's overhead still fit; when they do not, [`plug`] asks the guest (through
//! vmlet's QMP monitor) to plug enough of the region, and waits, with a deadline, until it
//! has. The guest onlines the new memory itself (`memhp_default_state=online`).
//!
//! The VM does not shrink when a container goes: its limit is forgotten, so the next one
//! fits in what is left. A VM sized by `vmlet.io/memory` keeps that size: a container
//! whose limit, with the pod's others, exceeds it is refused, naming the numbers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::devices::qmp::Qmp;
use crate::Error;

/// virtio-mem's block size: what is plugged is a multiple of it. 4 MiB, not QEMU's x86
/// default of 2: Linux 6.1's driver plugs sub-blocks of at least `MAX_ORDER` pages (4 MiB on
/// x86) whatever the device's block, so a request between two of its steps is never
/// reached (the guest plugged 4 of 6 MiB asked, and the update waited out its deadline).
pub const BLOCK_MIB: u64 = 4;
/// The device's id in QEMU (libvirt's user alias).
pub const DEVICE_ID: &str = "ua-vmlet-mem";
/// How long the guest may take to plug what was asked.
pub const PLUG_TIMEOUT: Duration = Duration::from_secs(20);

/// The virtio-mem region a VM booted with `boot_mib` gets under the node's `max_mib`
/// (0: it cannot grow).
pub fn region_mib(boot_mib: u64, max_mib: u64) -> u64 {
    max_mib.saturating_sub(boot_mib) / BLOCK_MIB * BLOCK_MIB
}

/// How a pod's VM holds its containers' memory limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMemory {
    pub boot_mib: u64,
    pub region_mib: u64,
    pub plugged_mib: u64,
    /// The node's `guest.overhead_memory_mib`: the guest's own share beside the limits.
    pub overhead_mib: u64,
    /// Sized by `vmlet.io/memory`: the VM keeps that size.
    pub fixed: bool,
    /// Each container's memory limit in MiB (containers without one are not listed).
    limits: HashMap<String, u64>,
}

/// What [`PodMemory::fit`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// The VM holds the limits as it is.
    Fits,
    /// Plug the region up to `plugged_mib` (in all).
    Grow { plugged_mib: u64 },
}

impl PodMemory {
    pub fn new(boot_mib: u64, region_mib: u64, overhead_mib: u64, fixed: bool) -> Self {
        Self {
            boot_mib,
            region_mib,
            plugged_mib: 0,
            overhead_mib,
            fixed,
            limits: HashMap::new(),
        }
    }

    /// The VM's memory now.
    pub fn total_mib(&self) -> u64 {
        self.boot_mib + self.plugged_mib
    }

    /// What the pod's limits need when `container_id`'s limit is `limit_mib` (replacing
    /// what it had), with the overhead.
    fn needed_mib(&self, container_id: &str, limit_mib: Option<u64>) -> u64 {
        let others: u64 = self
            .limits
            .iter()
            .filter(|(id, _)| id.as_str() != container_id)
            .map(|(_, mib)| *mib)
            .sum();
        self.overhead_mib
            .saturating_add(others)
            .saturating_add(limit_mib.unwrap_or(0))
    }

    /// Whether the VM holds the pod's limits with `container_id`'s at `limit_mib`, and if
    /// not, how far to grow it. Above what the VM can reach (the node's maximum), it grows
    /// to that maximum and says so in the log, as a pod booted over it is capped.
    pub fn fit(&self, container_id: &str, limit_mib: Option<u64>) -> Result<Fit, Error> {
        let needed = self.needed_mib(container_id, limit_mib);
        if needed <= self.total_mib() {
            return Ok(Fit::Fits);
        }
        if self.fixed {
            // The pod chose the size (it may leave the guest less than the overhead): only
            // limits that add up to more than the whole VM are refused.
            let limits = needed - self.overhead_mib;
            if limits <= self.total_mib() {
                return Ok(Fit::Fits);
            }
            return Err(Error::FailedPrecondition(format!(
                "container {container_id}: its memory limit of {} MiB and the pod's other containers' limits add up to {limits} MiB; the pod's VM has {} MiB, set by vmlet.io/memory",
                limit_mib.unwrap_or(0),
                self.total_mib()
            )));
        }
        let reachable = self.boot_mib + self.region_mib;
        if needed > reachable {
            log::warn!(
                "container {container_id}: the pod's limits need {needed} MiB, above the node's maximum of {reachable} MiB (guest.max_memory_mib); the VM grows to that"
            );
        }
        let plugged = (needed.min(reachable) - self.boot_mib).div_ceil(BLOCK_MIB) * BLOCK_MIB;
        if plugged <= self.plugged_mib {
            return Ok(Fit::Fits);
        }
        Ok(Fit::Grow {
            plugged_mib: plugged.min(self.region_mib),
        })
    }

    /// Records `container_id`'s limit (after [`PodMemory::fit`] and, if it said so, a
    /// successful [`plug`] of `plugged_mib`).
    pub fn commit(&mut self, container_id: &str, limit_mib: Option<u64>, fit: Fit) {
        if let Fit::Grow { plugged_mib } = fit {
            self.plugged_mib = self.plugged_mib.max(plugged_mib);
        }
        match limit_mib {
            Some(mib) => self.limits.insert(container_id.to_owned(), mib),
            None => self.limits.remove(container_id),
        };
    }

    /// Forgets a removed container's limit (the VM keeps its size).
    pub fn release(&mut self, container_id: &str) {
        self.limits.remove(container_id);
    }
}

/// A spec's memory limit in MiB (rounded up); none when unlimited.
pub fn limit_mib(bytes: Option<i64>) -> Option<u64> {
    bytes
        .filter(|b| *b > 0)
        .map(|b| (b as u64).div_ceil(1 << 20))
}

/// Asks QEMU to plug the virtio-mem region up to `plugged_mib` and waits until the guest
/// has, polling the device's `size` (QEMU's, never above what was requested) until
/// `timeout`.
pub async fn plug(qmp: &Qmp, plugged_mib: u64, timeout: Duration) -> Result<(), Error> {
    let path = format!("/machine/peripheral/{DEVICE_ID}");
    let wanted = plugged_mib << 20;
    qmp.execute(
        "qom-set",
        json!({"path": path, "property": "requested-size", "value": wanted}),
        Vec::new(),
    )
    .await?;
    let deadline = Instant::now() + timeout;
    loop {
        let size = qmp
            .execute(
                "qom-get",
                json!({"path": path, "property": "size"}),
                Vec::new(),
            )
            .await?
            .as_u64()
            .ok_or_else(|| Error::Internal("QEMU's virtio-mem size is not a number".into()))?;
        if size >= wanted {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "the guest plugged {} of {plugged_mib} MiB of added memory within {timeout:?}",
                size >> 20
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_reaches_the_node_maximum_in_whole_blocks() {
        assert_eq!(region_mib(256, 16 * 1024), 16 * 1024 - 256);
        assert_eq!(region_mib(255, 1024), 768);
        assert_eq!(region_mib(1024, 1024), 0);
        assert_eq!(region_mib(2048, 1024), 0);
    }

    #[test]
    fn a_container_over_the_boot_size_grows_the_vm_by_what_it_lacks() {
        // containerd 1.6: the sandbox knew no limits and booted 256 MiB.
        let mut pod = PodMemory::new(256, 16128, 128, false);
        assert_eq!(pod.fit("pause", None).unwrap(), Fit::Fits);
        pod.commit("pause", None, Fit::Fits);
        let fit = pod.fit("app", Some(1024)).unwrap();
        assert_eq!(fit, Fit::Grow { plugged_mib: 896 });
        pod.commit("app", Some(1024), fit);
        assert_eq!(pod.total_mib(), 1152);
        // A second container adds its limit; a smaller one fits in the same VM after the
        // first has gone.
        assert_eq!(
            pod.fit("side", Some(101)).unwrap(),
            Fit::Grow { plugged_mib: 1000 }
        );
        pod.release("app");
        assert_eq!(pod.fit("side", Some(101)).unwrap(), Fit::Fits);
    }

    #[test]
    fn what_is_plugged_is_whole_steps_of_the_guests_driver() {
        // A kubelet's resize of a 30 MiB container to 36 MiB in a VM booted for 30 (with
        // 128 of overhead): 6 MiB more are needed, 8 are plugged (6.1's driver never
        // plugs the 6).
        let mut pod = PodMemory::new(158, 15200, 128, false);
        pod.commit("app", Some(30), Fit::Fits);
        assert_eq!(
            pod.fit("app", Some(36)).unwrap(),
            Fit::Grow { plugged_mib: 8 }
        );
        assert_eq!(region_mib(158, 1024), 864);
    }

    #[test]
    fn an_update_replaces_the_containers_limit() {
        let mut pod = PodMemory::new(1152, 15232, 128, false);
        pod.commit("app", Some(1024), Fit::Fits);
        assert_eq!(pod.fit("app", Some(512)).unwrap(), Fit::Fits);
        assert_eq!(
            pod.fit("app", Some(2048)).unwrap(),
            Fit::Grow { plugged_mib: 1024 }
        );
    }

    #[test]
    fn above_the_node_maximum_the_vm_grows_to_it() {
        let pod = PodMemory::new(256, 768, 128, false);
        assert_eq!(
            pod.fit("app", Some(4096)).unwrap(),
            Fit::Grow { plugged_mib: 768 }
        );
        let mut full = pod.clone();
        full.plugged_mib = 768;
        assert_eq!(full.fit("app", Some(4096)).unwrap(), Fit::Fits);
    }

    #[test]
    fn a_vm_sized_by_annotation_refuses_what_does_not_fit_naming_the_numbers() {
        let mut pod = PodMemory::new(512, 0, 128, true);
        assert_eq!(pod.fit("app", Some(384)).unwrap(), Fit::Fits);
        // Less than the overhead left to the guest is the pod's choice.
        assert_eq!(pod.fit("app", Some(500)).unwrap(), Fit::Fits);
        pod.commit("side", Some(200), Fit::Fits);
        let err = pod.fit("app", Some(400)).unwrap_err();
        let message = err.to_string();
        for part in ["app", "400 MiB", "600 MiB", "512 MiB", "vmlet.io/memory"] {
            assert!(message.contains(part), "{message}");
        }
    }

    #[tokio::test]
    async fn plugging_asks_qemu_then_waits_for_the_guest() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let polls = std::sync::Arc::new(AtomicU64::new(0));
        let seen_polls = polls.clone();
        let (stream, server) = crate::devices::qmp::tests::fake_qemu(move |c| {
            match (
                c["execute"].as_str().unwrap(),
                c["arguments"]["property"].as_str(),
            ) {
                ("qom-get", Some("size")) => {
                    // The guest has it all on the third look.
                    let n = seen_polls.fetch_add(1, Ordering::SeqCst);
                    vec![json!({"return": if n < 2 { 100u64 << 20 } else { 896u64 << 20 }})]
                }
                _ => vec![json!({"return": {}})],
            }
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        plug(&qmp, 896, Duration::from_secs(5)).await.unwrap();
        drop(qmp);
        let seen = crate::devices::qmp::tests::finished(server).await;
        assert_eq!(seen[1].0["execute"], "qom-set");
        assert_eq!(
            seen[1].0["arguments"],
            json!({"path": "/machine/peripheral/ua-vmlet-mem", "property": "requested-size", "value": 896u64 << 20})
        );
        assert_eq!(polls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_guest_that_does_not_plug_is_an_error_within_the_deadline() {
        let (stream, _server) =
            crate::devices::qmp::tests::fake_qemu(|c| match c["execute"].as_str() {
                Some("qom-get") => vec![json!({"return": 64u64 << 20})],
                _ => vec![json!({"return": {}})],
            });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let started = Instant::now();
        let err = plug(&qmp, 512, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            err.message().contains("plugged 64 of 512 MiB"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn limits_are_whole_mebibytes_and_unlimited_is_none() {
        assert_eq!(limit_mib(Some(1 << 30)), Some(1024));
        assert_eq!(limit_mib(Some((1 << 20) + 1)), Some(2));
        assert_eq!(limit_mib(Some(-1)), None);
        assert_eq!(limit_mib(Some(0)), None);
        assert_eq!(limit_mib(None), None);
    }
}
