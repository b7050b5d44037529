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
/// The VM stays paused.
pub async fn save(qmp: &Qmp, file: OwnedFd, deadline: Duration) -> Result<(), Error> {
    qmp.execute("stop", json!({}), Vec::new()).await?;
    qmp.execute("migrate-set-capabilities", capabilities(), Vec::new())
        .await?;
    with_fdset(qmp, file, "save", |uri| async move {
        migrate(qmp, "migrate", uri, deadline).await
    })
    .await
}

/// Loads the state in `file` (read-only) into a VM that QEMU started with
/// `-incoming defer`, then runs it, within `deadline`.
pub async fn load(qmp: &Qmp, file: OwnedFd, deadline: Duration) -> Result<(), Error> {
    qmp.execute("migrate-set-capabilities", capabilities(), Vec::new())
        .await?;
    with_fdset(qmp, file, "load", |uri| async move {
        migrate(qmp, "migrate-incoming", uri, deadline).await
    })
    .await?;
    qmp.execute("cont", json!({}), Vec::new()).await?;
    Ok(())
}

/// Hands `file` to QEMU as an fdset, runs `f` with its `file:` URI, and removes the fdset
/// again (QEMU keeps its own duplicate while it uses it).
async fn with_fdset<F, Fut>(qmp: &Qmp, file: OwnedFd, what: &str, f: F) -> Result<(), Error>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
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

/// Runs `command` (`migrate` or `migrate-incoming`) to `uri` and waits until QEMU says it
/// completed; a failure carries QEMU's reason.
async fn migrate(qmp: &Qmp, command: &str, uri: String, deadline: Duration) -> Result<(), Error> {
    let mut events = qmp.subscribe();
    qmp.execute(command, json!({"uri": uri}), Vec::new())
        .await?;
    events
        .wait_for("MIGRATION", |d| ended(&d["status"]), deadline)
        .await?;
    let state = qmp.execute("query-migrate", json!({}), Vec::new()).await?;
    match state["status"].as_str() {
        Some("completed") => Ok(()),
        _ => Err(Error::Internal(format!(
            "{command}: {}",
            state["error-desc"]
                .as_str()
                .map_or_else(|| format!("QEMU says {state}"), str::to_owned)
        ))),
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
    async fn a_failed_load_says_why_and_does_not_run_the_vm() {
        let (stream, server) = fake_qemu(qemu_migrating_to("failed", "Unable to read RAM"));
        let qmp = Qmp::handshake(stream).await.unwrap();
        let err = load(&qmp, file(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            err.message()
                .contains("migrate-incoming: Unable to read RAM"),
            "{err}"
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
        load(&qmp, file(), Duration::from_secs(5)).await.unwrap();
        drop(qmp);
        let seen = finished(server).await;
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
