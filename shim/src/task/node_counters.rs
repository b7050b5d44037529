//! The node's counters of every pod start (`vmletctl metrics`): the boot times of the VMs
//! the node's shims booted, as a histogram, and the creates that failed, by the error's
//! code. Each shim adds its pod's to one file in the state directory ([`FILE`], under a lock
//! with a deadline); they count from the state directory's start (a tmpfs: the node's boot),
//! as a process's counters count from its start. Each update also publishes a copy for the
//! metrics group ([`crate::task::metrics_dir`]).
//!
//! A shim that cannot count says so in its log and goes on: counting never fails a create.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The counters' file in the state directory (no pod's: a file, not a directory).
pub const FILE: &str = ".node-counters.json";
/// The lock its updates take, beside it.
pub const LOCK: &str = ".node-counters.lock";
/// Where an update is written before it replaces [`FILE`].
pub const TMP: &str = ".node-counters.json.tmp";
/// How long a shim waits for another's update.
const LOCK_DEADLINE: Duration = Duration::from_secs(2);
/// The largest file read (the reasons are the error codes: a few dozen bytes each).
const LIMIT: u64 = 64 << 10;

/// The boot histogram's upper bounds, in seconds: vmlet's guest boots in well under a
/// second under KVM and in a few under TCG; a VM image's boot (cloud-init included) takes
/// tens of seconds.
pub const BOOT_BUCKETS: &[f64] = &[0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0];

/// The file's layout this version writes: a shim of an older one leaves a newer file alone
/// (it would drop what it does not know), and says so.
pub const VERSION: u32 = 1;

/// What the node counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCounters {
    #[serde(default)]
    pub version: u32,
    /// Boots at or under each of [`BOOT_BUCKETS`] (not cumulative here).
    #[serde(default)]
    pub boot_buckets: Vec<u64>,
    /// Boots over the last bound.
    #[serde(default)]
    pub boot_over: u64,
    #[serde(default)]
    pub boot_sum_seconds: f64,
    /// Failed creates, by the error's code (`invalid_argument`, `deadline_exceeded`...).
    #[serde(default)]
    pub create_failures: BTreeMap<String, u64>,
}

impl NodeCounters {
    /// Every boot counted.
    pub fn boots(&self) -> u64 {
        self.boot_buckets.iter().sum::<u64>() + self.boot_over
    }

    fn add_boot(&mut self, took: Duration) {
        let seconds = took.as_secs_f64();
        self.boot_buckets.resize(BOOT_BUCKETS.len(), 0);
        match BOOT_BUCKETS.iter().position(|&le| seconds <= le) {
            Some(i) => self.boot_buckets[i] += 1,
            None => self.boot_over += 1,
        }
        self.boot_sum_seconds += seconds;
    }

    /// The counters in `state_dir` (zero where there are none yet).
    pub fn load(state_dir: &Path) -> Result<Self, String> {
        Self::load_file(&state_dir.join(FILE))
    }

    fn load_file(path: &Path) -> Result<Self, String> {
        let text = match crate::host::pod_record::read_private(path, LIMIT) {
            Ok(None) => return Ok(Self::default()),
            Ok(Some(text)) => text,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let counters: Self =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if counters.version > VERSION {
            return Err(format!(
                "{}: counters of version {}, newer than this vmlet's ({VERSION})",
                path.display(),
                counters.version
            ));
        }
        Ok(counters)
    }

    async fn update(state_dir: &Path, change: impl FnOnce(&mut Self)) -> Result<(), Error> {
        let _lock = crate::host::file_lock::exclusive(&state_dir.join(LOCK), LOCK_DEADLINE).await?;
        let mut counters = Self::load(state_dir).map_err(Error::Internal)?;
        change(&mut counters);
        counters.version = VERSION;
        let json = serde_json::to_vec(&counters).map_err(|e| Error::Internal(e.to_string()))?;
        let tmp = state_dir.join(TMP);
        crate::host::pod_record::write_private(&tmp, &json)
            .map_err(|e| Error::io("write the node's counters", e))?;
        std::fs::rename(&tmp, state_dir.join(FILE))
            .map_err(|e| Error::io("save the node's counters", e))?;
        // For `vmletctl metrics` as the metrics group's user.
        crate::task::metrics_dir::publish(state_dir, crate::task::metrics_dir::COUNTERS, &json)
    }

    /// The counters as published for the metrics group ([`crate::task::metrics_dir`]): zero
    /// where there are none yet.
    pub fn load_published(state_dir: &Path) -> Result<Self, String> {
        Self::load_file(
            &crate::task::metrics_dir::path(state_dir).join(crate::task::metrics_dir::COUNTERS),
        )
    }
}

/// Counts a VM that booted in `took`.
pub async fn count_boot(state_dir: &Path, took: Duration) {
    if let Err(e) = NodeCounters::update(state_dir, |c| c.add_boot(took)).await {
        log::warn!("boot not counted: {}", e.message());
    }
}

/// Counts a create that failed with `error`.
pub async fn count_failure(state_dir: &Path, error: &Error) {
    let reason = format!("{:?}", error.code()).to_ascii_lowercase();
    let counted = NodeCounters::update(state_dir, |c| {
        *c.create_failures.entry(reason).or_default() += 1;
    });
    if let Err(e) = counted.await {
        log::warn!("failed create not counted: {}", e.message());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn boots_fall_in_their_bucket_and_failures_count_by_code() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(NodeCounters::load(dir.path()).unwrap().boots(), 0);
        for ms in [100, 250, 1500, 200_000] {
            count_boot(dir.path(), Duration::from_millis(ms)).await;
        }
        count_failure(dir.path(), &Error::InvalidArgument("x".into())).await;
        count_failure(dir.path(), &Error::InvalidArgument("y".into())).await;
        count_failure(dir.path(), &Error::Timeout("z".into())).await;
        let c = NodeCounters::load(dir.path()).unwrap();
        assert_eq!(c.boots(), 4);
        assert_eq!(c.boot_buckets[0], 2, "0.1 s and 0.25 s: at or under 0.25");
        assert_eq!(c.boot_buckets[3], 1, "1.5 s: under 2");
        assert_eq!(c.boot_over, 1);
        assert!((c.boot_sum_seconds - 201.85).abs() < 1e-9);
        assert_eq!(c.create_failures["invalid_argument"], 2);
        assert_eq!(c.create_failures["deadline_exceeded"], 1);
    }

    #[tokio::test]
    async fn a_newer_versions_file_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let newer = r#"{"version": 2, "boot_buckets": [5], "something_new": 1}"#;
        std::fs::write(dir.path().join(FILE), newer).unwrap();
        count_boot(dir.path(), Duration::from_secs(1)).await;
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE)).unwrap(),
            newer
        );
        let err = NodeCounters::load(dir.path()).unwrap_err();
        assert!(err.contains("newer than this vmlet's"), "{err}");
    }

    #[tokio::test]
    async fn a_broken_file_is_not_counted_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        count_boot(dir.path(), Duration::from_secs(1)).await;
        assert_eq!(std::fs::read_to_string(dir.path().join(FILE)).unwrap(), "{");
        assert!(NodeCounters::load(dir.path()).is_err());
    }
}
