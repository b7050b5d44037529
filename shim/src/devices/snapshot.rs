//! A running VM's state saved to a file ([`save`]), and a new VM's state loaded from one
//! ([`load`]), over vmlet's QMP monitor: the two halves of a template start. The file
//! travels as a descriptor (`add-fd`, then `file:/dev/fdset/N`), so QEMU opens no host path
//! and needs no rule for one. QEMU's `mapped-ram` format puts each page of guest RAM at a
//! fixed offset of the file: the file is as large as the guest's RAM but sparse (a booted
//! 256 MiB guest of the lean kernel: 31 MiB on disk), and a load reads only the pages the
//! file holds.
//!
//! QEMU opens an fdset's descriptor only with the access mode it was opened with: a save
//! takes a write-only descriptor, a load a read-only one.

use std::os::fd::OwnedFd;
use std::time::Duration;

use serde_json::{json, Value};

use crate::devices::qmp::Qmp;
use crate::Error;

/// The migration capabilities both halves set: the same on both sides, or the load
/// misreads the file.
fn capabilities() -> Value {
    json!({"capabilities": [
        {"capability": "mapped-ram", "state": true},
        {"capability": "events", "state": true},
    ]})
}

/// Stops the VM and saves its state into `file` (write-only, empty), within `deadline`.
/// The VM stays paused, also when the save failed (a save that took too long is cancelled
/// first, so that it cannot complete later and pause the VM again).
pub async fn save(qmp: &Qmp, file: OwnedFd, deadline: Duration) -> Result<(), Error> {
    qmp.execute("stop", json!({}), Vec::new()).await?;
    qmp.execute("migrate-set-capabilities", capabilities(), Vec::new())
        .await?;
    let ended = with_fdset(qmp, file, "save", |uri| async move {
        let ended = migrate(qmp, "migrate", json!({ "uri": uri }), deadline).await;
        if ended.is_err() {
            cancel(qmp).await;
        }
        ended
    })
    .await?;
    match ended {
        Ended::Completed => Ok(()),
        Ended::Failed(reason) => Err(Error::Internal(format!("migrate: {reason}"))),
    }
}

/// What a load left.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// The VM runs the loaded state.
    Running,
    /// QEMU refused the file, for this reason (the VM has nothing to run).
    Refused(String),
}

/// Loads the state in `file` (read-only) into a VM that QEMU started with
/// `-incoming defer`, then runs it, within `deadline`. QEMU is told not to exit when it
/// refuses the file, so that it can say why.
pub async fn load(qmp: &Qmp, file: OwnedFd, deadline: Duration) -> Result<Loaded, Error> {
    qmp.execute("migrate-set-capabilities", capabilities(), Vec::new())
        .await?;
    let ended = with_fdset(qmp, file, "load", |uri| async move {
        let args = json!({ "uri": uri, "exit-on-error": false });
        migrate(qmp, "migrate-incoming", args, deadline).await
    })
    .await?;
    match ended {
        Ended::Completed => {
            qmp.execute("cont", json!({}), Vec::new()).await?;
            Ok(Loaded::Running)
        }
        Ended::Failed(reason) => Ok(Loaded::Refused(reason)),
    }
}

/// Hands `file` to QEMU as an fdset, runs `f` with its `file:` URI, and removes the fdset
/// again (QEMU keeps its own duplicate while it uses it).
async fn with_fdset<T, F, Fut>(qmp: &Qmp, file: OwnedFd, what: &str, f: F) -> Result<T, Error>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let added = qmp
        .execute(
            "add-fd",
            json!({"opaque": format!("vmlet {what}")}),
            vec![file],
        )
        .await?;
    let fdset = added["fdset-id"]
        .as_u64()
        .ok_or_else(|| Error::Internal(format!("add-fd answered {added} (no fdset-id)")))?;
    let result = f(format!("file:/dev/fdset/{fdset},offset=0")).await;
    if let Err(e) = qmp
        .execute("remove-fd", json!({"fdset-id": fdset}), Vec::new())
        .await
    {
        log::warn!("{what}: {}", e.message());
    }
    result
}

/// How a migration ended.
enum Ended {
    Completed,
    /// QEMU's reason.
    Failed(String),
}

/// Runs `command` (`migrate` or `migrate-incoming`) with `args` and waits until QEMU says
/// the migration ended; an error is QEMU's silence or end, not a failed migration.
async fn migrate(
    qmp: &Qmp,
    command: &str,
    args: Value,
    deadline: Duration,
) -> Result<Ended, Error> {
    let mut events = qmp.subscribe();
    qmp.execute(command, args, Vec::new()).await?;
    events
        .wait_for("MIGRATION", |d| ended(&d["status"]), deadline)
        .await?;
    let state = qmp.execute("query-migrate", json!({}), Vec::new()).await?;
    Ok(match state["status"].as_str() {
        Some("completed") => Ended::Completed,
        _ => Ended::Failed(format!(
            "{command}: {}",
            state["error-desc"]
                .as_str()
                .map_or_else(|| format!("QEMU says {state}"), str::to_owned)
        )),
    })
}

/// How long a cancelled save may take to end.
const CANCEL_DEADLINE: Duration = Duration::from_secs(5);

/// Cancels an outgoing migration and waits (briefly) until QEMU says it ended; a failure is
/// logged (the VM is ended with its pod).
async fn cancel(qmp: &Qmp) {
    let mut events = qmp.subscribe();
    let cancelled = async {
        qmp.execute("migrate_cancel", json!({}), Vec::new()).await?;
        events
            .wait_for("MIGRATION", |d| ended(&d["status"]), CANCEL_DEADLINE)
            .await
    };
    if let Err(e) = cancelled.await {
        log::warn!("cancel the save: {}", e.message());
    }
}

/// Whether a `MIGRATION` event's status is one a migration ends in.
fn ended(status: &Value) -> bool {
    matches!(status.as_str(), Some("completed" | "failed" | "cancelled"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::qmp::tests::{fake_qemu, finished};

    /// A QEMU whose migrations end in `status` (with `desc` as the reason).
    fn qemu_migrating_to(
        status: &'static str,
        desc: &'static str,
    ) -> impl Fn(&Value) -> Vec<Value> + Send + 'static {
        move |c| match c["execute"].as_str().unwrap() {
            "add-fd" => vec![json!({"return": {"fdset-id": 3, "fd": 25}})],
            "migrate" | "migrate-incoming" => vec![
                json!({"return": {}}),
                json!({"event": "MIGRATION", "data": {"status": "setup"}}),
                json!({"event": "MIGRATION", "data": {"status": status}}),
            ],
            "query-migrate" => vec![json!({"return": {"status": status, "error-desc": desc}})],
            _ => vec![json!({"return": {}})],
        }
    }

    fn file() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    fn names(seen: &[(Value, usize)]) -> Vec<String> {
        seen.iter()
            .map(|(c, _)| c["execute"].as_str().unwrap().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_save_stops_the_vm_and_migrates_to_the_file_it_was_handed() {
        let (stream, server) = fake_qemu(qemu_migrating_to("completed", ""));
        let qmp = Qmp::handshake(stream).await.unwrap();
        save(&qmp, file(), Duration::from_secs(5)).await.unwrap();
        drop(qmp);
        let seen = finished(server).await;
        assert_eq!(
            names(&seen[1..]),
            [
                "stop",
                "migrate-set-capabilities",
                "add-fd",
                "migrate",
                "query-migrate",
                "remove-fd"
            ]
        );
        let add_fd = &seen[3];
        assert_eq!(add_fd.1, 1, "the file travels as a descriptor");
        assert_eq!(seen[4].0["arguments"]["uri"], "file:/dev/fdset/3,offset=0");
        assert_eq!(
            seen[2].0["arguments"]["capabilities"][0]["capability"],
            "mapped-ram"
        );
    }

    #[tokio::test]
    async fn a_save_that_does_not_end_in_time_is_cancelled() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "add-fd" => vec![json!({"return": {"fdset-id": 3, "fd": 25}})],
            "migrate_cancel" => vec![
                json!({"return": {}}),
                json!({"event": "MIGRATION", "data": {"status": "cancelled"}}),
            ],
            // "migrate" answers and never ends.
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let err = save(&qmp, file(), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(err.message().contains("MIGRATION"), "{err}");
        drop(qmp);
        let names = names(&finished(server).await);
        assert_eq!(
            names[names.len() - 2..],
            ["migrate_cancel".to_owned(), "remove-fd".to_owned()]
        );
    }

    #[tokio::test]
    async fn a_failed_load_says_why_and_does_not_run_the_vm() {
        let (stream, server) = fake_qemu(qemu_migrating_to("failed", "Unable to read RAM"));
        let qmp = Qmp::handshake(stream).await.unwrap();
        assert_eq!(
            load(&qmp, file(), Duration::from_secs(5)).await.unwrap(),
            Loaded::Refused("migrate-incoming: Unable to read RAM".into())
        );
        drop(qmp);
        let seen = finished(server).await;
        let names = names(&seen);
        assert!(!names.contains(&"cont".to_owned()), "{names:?}");
        assert_eq!(names.last().unwrap(), "remove-fd", "{names:?}");
    }

    #[tokio::test]
    async fn a_load_runs_the_vm_once_it_completed() {
        let (stream, server) = fake_qemu(qemu_migrating_to("completed", ""));
        let qmp = Qmp::handshake(stream).await.unwrap();
        assert_eq!(
            load(&qmp, file(), Duration::from_secs(5)).await.unwrap(),
            Loaded::Running
        );
        drop(qmp);
        let seen = finished(server).await;
        assert_eq!(seen[3].0["arguments"]["exit-on-error"], false);
        assert_eq!(
            names(&seen[1..]),
            [
                "migrate-set-capabilities",
                "add-fd",
                "migrate-incoming",
                "query-migrate",
                "remove-fd",
                "cont"
            ]
        );
    }

    #[test]
    fn a_migration_ends_in_completed_failed_or_cancelled() {
        for status in ["completed", "failed", "cancelled"] {
            assert!(ended(&json!(status)), "{status}");
        }
        for status in ["setup", "active", "device", "pre-switchover"] {
            assert!(!ended(&json!(status)), "{status}");
        }
        assert!(!ended(&Value::Null));
    }
}
