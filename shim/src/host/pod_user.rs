//! Each pod's own uid: what its QEMU runs as and what owns the files and sockets QEMU opens,
//! so that nothing of one pod is open to another pod's QEMU (which runs a guest's attacker's
//! code at worst).
//!
//! The uids come from the node's `pod_users` range. A pod claims one as it boots: a file
//! `<state_dir>/.pod-users/<uid>` naming the pod, made under a lock, and recorded in the
//! pod's journal ([`crate::host::undo::Made::PodUser`]) before anything is given to it;
//! the teardown gives it back last, after everything that ran as it has ended. A claim
//! whose pod has no state directory any more (its shim died between the two) is free again,
//! and so no uid is lost; a uid that some process still runs as is never claimed.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vmlet_config::NodeConfig;

use crate::Error;

/// The directory of claims under the state directory.
pub const CLAIMS_DIR: &str = ".pod-users";
/// The lock every claim is made under.
pub const LOCK_FILE: &str = ".lock";
/// Where the next claim starts looking (an index into the range).
pub const NEXT_FILE: &str = ".next";
/// How long a boot waits for another shim's claim.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// A claim's most bytes (a pod id).
const CLAIM_MAX: u64 = 256;

/// A pod's QEMU's credentials: its own uid and the node's QEMU user's primary group (device
/// nodes such as `/dev/kvm` are that group's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl PodUser {
    /// Gives `path` to the pod's user (the group stays root's: the group is the node's).
    pub fn give(&self, path: &Path) -> Result<(), Error> {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(0))
            .map_err(|e| Error::io(format!("chown {}", path.display()), e))
    }

    /// Gives the open `file` (at `path`, for errors) to the pod's user.
    pub fn give_file(&self, file: &std::fs::File, path: &Path) -> Result<(), Error> {
        std::os::unix::fs::fchown(file, Some(self.uid), Some(0))
            .map_err(|e| Error::io(format!("chown {}", path.display()), e))
    }

    /// Makes the socket or file at `path` the pod's QEMU's alone: mode 0600 (whatever the
    /// umask gave it), owned by the pod's user.
    pub fn give_private(&self, path: &Path) -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod {}", path.display()), e))?;
        self.give(path)
    }
}

impl PodUser {
    /// The node's `qemu_user` itself: what a QEMU outside any pod runs as (the tests' lone
    /// QEMU, a stand-in for a claimed uid).
    pub fn shared(config: &NodeConfig) -> Result<PodUser, Error> {
        let (uid, gid, groups) = qemu_user(config)?;
        Ok(PodUser { uid, gid, groups })
    }
}

/// The config's `qemu_user`: its uid, its primary group and its groups.
fn qemu_user(config: &NodeConfig) -> Result<(u32, u32, Vec<u32>), Error> {
    let name = &config.qemu_user;
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| Error::io(format!("look up user {name}"), e.into()))?
        .ok_or_else(|| {
            Error::Config(vmlet_config::Error::InvalidConfig {
                key: "qemu_user",
                reason: format!("no user {name} on this host"),
            })
        })?;
    let c_name = std::ffi::CString::new(name.as_str())
        .map_err(|_| Error::Internal(format!("user name {name:?}")))?;
    let groups = nix::unistd::getgrouplist(&c_name, user.gid)
        .map_err(|e| Error::io(format!("groups of {name}"), e.into()))?;
    Ok((
        user.uid.as_raw(),
        user.gid.as_raw(),
        groups.iter().map(|g| g.as_raw()).collect(),
    ))
}

/// Claims a free uid of the node's range for `pod_id` (whose state directory exists) and
/// records it with `record` before returning it.
pub async fn claim(
    config: &NodeConfig,
    pod_id: &str,
    record: impl FnOnce(u32) -> Result<(), Error>,
) -> Result<PodUser, Error> {
    let (_, gid, _) = qemu_user(config)?;
    let dir = claims_dir(&config.state_dir);
    crate::host::pod_paths::make_private_dir(&dir)?;
    let _lock = crate::host::file_lock::exclusive(&dir.join(LOCK_FILE), LOCK_WAIT).await?;
    let running = uids_running();
    let range = config.pod_users;
    let start = read_next(&dir, range.count).unwrap_or_else(|| start_in(pod_id, range.count));
    for i in 0..range.count {
        let index = (start + i) % range.count;
        let uid = range.first_uid + index;
        if running.contains(&uid) {
            continue;
        }
        let path = dir.join(uid.to_string());
        match claimant(&path)? {
            None => {}
            Some(other) if stale(&config.state_dir, &other) => {
                log::info!("pod {pod_id}: uid {uid} was pod {other}'s, which is gone");
            }
            Some(_) => continue,
        }
        record(uid)?;
        write_file(&dir, &path, pod_id)?;
        // The next claim starts past this one: a uid is taken again only after every
        // other of the range, so that what a pod's QEMU may have left (its files) meets a
        // later pod as late as can be.
        write_file(
            &dir,
            &dir.join(NEXT_FILE),
            &((index + 1) % range.count).to_string(),
        )?;
        // The primary group alone (the device nodes'), none of the user's others.
        return Ok(PodUser {
            uid,
            gid,
            groups: vec![gid],
        });
    }
    Err(Error::ResourceExhausted(format!(
        "every uid of pod_users ({} from {}) is some pod's or runs a process",
        range.count, range.first_uid
    )))
}

/// Gives back `uid`, claimed by the pod whose state directory is `pod_dir`: its claim is
/// removed if it still names that pod.
pub fn release(pod_dir: &Path, uid: u32) -> Result<(), Error> {
    let (Some(state_dir), Some(pod_id)) = (pod_dir.parent(), pod_dir.file_name()) else {
        return Ok(());
    };
    let path = claims_dir(state_dir).join(uid.to_string());
    match claimant(&path)? {
        Some(claimant) if claimant.as_str() == pod_id.to_string_lossy() => {
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

fn claims_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(CLAIMS_DIR)
}

/// The pod a claim names (none: no claim).
fn claimant(path: &Path) -> Result<Option<String>, Error> {
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let mut text = String::new();
    (&mut file)
        .take(CLAIM_MAX)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    Ok(Some(text.trim().to_owned()))
}

/// Whether the pod a claim names is gone: its state directory is not there (a claim is
/// made after the directory and given back before it is removed).
fn stale(state_dir: &Path, pod_id: &str) -> bool {
    let plain = !pod_id.is_empty() && !pod_id.contains('/') && pod_id != "." && pod_id != "..";
    !plain || !state_dir.join(pod_id).is_dir()
}

/// Where the next claim starts in a range of `count` (none: not written yet, or not a
/// number of the range).
fn read_next(dir: &Path, count: u32) -> Option<u32> {
    claimant(&dir.join(NEXT_FILE))
        .ok()
        .flatten()
        .and_then(|text| text.parse::<u32>().ok())
        .filter(|next| *next < count)
}

/// Writes `text` to `path` in the claims' `dir` whole (a temporary file renamed over it).
fn write_file(dir: &Path, path: &Path, text: &str) -> Result<(), Error> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let temp = dir.join(format!(".{name}.new"));
    let _ = std::fs::remove_file(&temp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&temp, path))
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// Where the node's first claim starts looking in a range of `count`: spread by the pod's id.
fn start_in(pod_id: &str, count: u32) -> u32 {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(pod_id.as_bytes());
    u32::from_be_bytes([hash[0], hash[1], hash[2], hash[3]]) % count
}

/// The real and effective uids of every process of the node.
fn uids_running() -> std::collections::HashSet<u32> {
    statuses().flat_map(|(_, status)| ids(&status)).collect()
}

/// The processes (not zombies) any of whose user ids (real, effective, saved, file system)
/// is `uid`.
pub fn processes_of(uid: u32) -> Vec<u32> {
    statuses()
        .filter(|(_, status)| ids(status).contains(&uid) && !is_zombie(status))
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether `pid` is a process (not a zombie) one of whose user ids is `uid`.
pub fn runs_as(pid: u32, uid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| ids(&status).contains(&uid) && !is_zombie(&status))
}

/// Whether `pid` is a process (not a zombie) all of whose user ids (real, effective, saved,
/// file system) are `uid`: what only that user (or root) can make of its own processes.
pub fn runs_only_as(pid: u32, uid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        let ids = ids(&status);
        !ids.is_empty() && ids.iter().all(|id| *id == uid) && !is_zombie(&status)
    })
}

/// Each process's PID and its `/proc/PID/status`.
fn statuses() -> impl Iterator<Item = (u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            Some((
                pid,
                std::fs::read_to_string(entry.path().join("status")).ok()?,
            ))
        })
}

/// The user ids of a `/proc/PID/status`.
fn ids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|ids| {
            ids.split_whitespace()
                .filter_map(|u| u.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn is_zombie(status: &str) -> bool {
    status.lines().any(|l| l.starts_with("State:\tZ"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `shim delete` takes for a live shim is a process all of whose user ids are
    /// root's: one that is only non-dumpable (its `/proc` entry root's) is not.
    #[test]
    fn a_process_runs_only_as_a_user_when_all_its_ids_are_that_users() {
        let me = nix::unistd::getuid().as_raw();
        assert!(runs_only_as(std::process::id(), me));
        assert!(!runs_only_as(std::process::id(), me.wrapping_add(1)));
        assert!(!runs_only_as(0, 0), "no process has PID 0");
    }

    fn config(state_dir: &Path, first_uid: u32, count: u32) -> NodeConfig {
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .unwrap()
            .unwrap();
        NodeConfig {
            state_dir: state_dir.to_owned(),
            qemu_user: me.name,
            pod_users: vmlet_config::PodUsersConfig { first_uid, count },
            ..NodeConfig::default()
        }
    }

    fn pod_dir(config: &NodeConfig, pod_id: &str) -> PathBuf {
        let dir = config.state_dir.join(pod_id);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn pods_get_uids_of_their_own_recorded_first_and_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), 3_000_000_000, 2);
        let (a, b) = (pod_dir(&config, "a"), pod_dir(&config, "b"));
        let mut recorded = Vec::new();
        let user_a = claim(&config, "a", |uid| {
            recorded.push(uid);
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(recorded, [user_a.uid]);
        assert!(config.pod_users.holds(user_a.uid));
        let user_b = claim(&config, "b", |_| Ok(())).await.unwrap();
        assert_ne!(user_a.uid, user_b.uid);
        let err = claim(&config, "c", |_| Ok(())).await.unwrap_err();
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
        // Another pod's release leaves a's claim; a's own gives it back.
        release(&b, user_a.uid).unwrap();
        assert!(claim(&config, "c", |_| Ok(())).await.is_err());
        release(&a, user_a.uid).unwrap();
        let user_c = claim(&config, "c", |_| Ok(())).await.unwrap();
        assert_eq!(user_c.uid, user_a.uid);
    }

    #[tokio::test]
    async fn a_claim_whose_pod_is_gone_is_free_and_a_failed_record_claims_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), 3_000_000_000, 1);
        let gone = pod_dir(&config, "gone");
        claim(&config, "gone", |_| Ok(())).await.unwrap();
        std::fs::remove_dir(&gone).unwrap();
        pod_dir(&config, "next");
        let err = claim(&config, "next", |_| {
            Err(Error::Internal("no record".into()))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
        // The old claim still names "gone" (nothing was written for "next").
        let path = claims_dir(dir.path()).join("3000000000");
        assert_eq!(claimant(&path).unwrap().as_deref(), Some("gone"));
        claim(&config, "next", |_| Ok(())).await.unwrap();
        assert_eq!(claimant(&path).unwrap().as_deref(), Some("next"));
    }

    #[tokio::test]
    async fn a_uid_given_back_is_taken_again_only_after_the_rest_of_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), 3_000_000_000, 3);
        let mut seen = Vec::new();
        for pod in ["a", "b", "c", "d"] {
            let pod_dir = pod_dir(&config, pod);
            let user = claim(&config, pod, |_| Ok(())).await.unwrap();
            release(&pod_dir, user.uid).unwrap();
            seen.push(user.uid);
        }
        // Each given back at once, yet the next pod takes the next uid, round the range.
        assert_eq!(seen[3], seen[0]);
        let mut first_three = seen[..3].to_vec();
        first_three.dedup();
        assert_eq!(first_three.len(), 3, "{seen:?}");
    }

    #[tokio::test]
    async fn a_uid_a_process_runs_as_is_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        // This test's own uid (root's 0 is below any range a config allows, but the claim
        // takes what it is given).
        let me = nix::unistd::getuid().as_raw();
        let config = config(dir.path(), me, 1);
        pod_dir(&config, "p");
        let err = claim(&config, "p", |_| Ok(())).await.unwrap_err();
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_claims_directory_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), 3_000_000_000, 1);
        pod_dir(&config, "p");
        let claims = claims_dir(dir.path());
        std::fs::create_dir(&claims).unwrap();
        std::fs::set_permissions(&claims, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = claim(&config, "p", |_| Ok(())).await.unwrap_err();
        assert!(err.message().contains(".pod-users"), "{err:?}");
    }
}
