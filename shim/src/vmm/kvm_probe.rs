//! Whether KVM runs a guest on this host, found by booting one.
//!
//! libvirt offering KVM (its domain capabilities) is not enough: where the host is itself a
//! VM with a paravirtual KVM (`kvm_pvm`), QEMU starts on `/dev/kvm` and the guest stops once
//! its kernel sets up long mode (a KVM internal error, then nothing). So under
//! `accel = "auto"` vmlet boots the guest kernel on KVM as its VMs would run it (the config's
//! QEMU, machine type, `-cpu host`), with no root file system, `panic=-1` and `-no-reboot`: the
//! kernel panics and QEMU exits 0, in well under a second where KVM works. Anything else
//! within [`DEADLINE`] means TCG, and the reason is kept.
//!
//! The answer is kept in the state directory for the host's boot (keyed by the boot id and
//! the QEMU, kernel and machine type probed), and one probe runs at a time (a lock file), so
//! a node probes once per boot, not once per pod.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::host::host_command::{self, Finished};

/// How long the probe guest may take to boot to its panic.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// How long a second prober waits for the first one's answer.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);
/// The answer file and its lock, in the state directory.
pub const ANSWER_FILE: &str = "kvm-probe.json";
pub const LOCK_FILE: &str = "kvm-probe.lock";
/// The most of the guest's console (and of an answer file) that is read.
const MAX_READ: u64 = 64 * 1024;
/// What the guest kernel prints when it got to its end.
const PANIC_LINE: &str = "Kernel panic";

/// What a probe was of; an answer holds while these hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeKey {
    pub boot_id: String,
    pub qemu: PathBuf,
    pub qemu_modified: i64,
    pub kernel: PathBuf,
    pub kernel_modified: i64,
    pub machine: String,
}

impl ProbeKey {
    pub fn of(qemu: &Path, kernel: &Path, machine: &str) -> Result<Self, String> {
        let modified = |path: &Path| {
            std::fs::metadata(path)
                .map(|m| m.mtime())
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map_err(|e| format!("the host's boot id: {e}"))?
            .trim()
            .to_owned();
        Ok(ProbeKey {
            boot_id,
            qemu: qemu.to_owned(),
            qemu_modified: modified(qemu)?,
            kernel: kernel.to_owned(),
            kernel_modified: modified(kernel)?,
            machine: machine.to_owned(),
        })
    }
}

/// A probe's answer: how long the guest took to boot to its panic, or why it did not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeAnswer {
    pub key: ProbeKey,
    pub booted_in_ms: Result<u64, String>,
}

/// Whether a guest boots on KVM here (its boot time, or why not): the kept answer when there
/// is one for this boot, QEMU, kernel and machine type, else a probe whose answer is kept in
/// `state_dir` (when given; `vmletctl check` on a node without one probes without keeping).
pub async fn guest_boots_on_kvm(
    qemu: &Path,
    kernel: &Path,
    machine: &str,
    state_dir: Option<&Path>,
) -> Result<Duration, String> {
    let key = ProbeKey::of(qemu, kernel, machine)?;
    let Some(dir) = state_dir else {
        // A directory made new (mode 0700, a random name): nothing a local user planted
        // in the temporary directory is where QEMU writes the probe's console.
        let scratch = tempfile::Builder::new()
            .prefix("vmlet-kvm-probe-")
            .tempdir()
            .map_err(|e| format!("a temporary directory for the KVM probe: {e}"))?;
        let (answer, _) = probe(&key, scratch.path()).await;
        return answer;
    };
    let lock = lock(dir).await?;
    if let Some(kept) = read_answer(dir).filter(|a| a.key == key) {
        drop(lock);
        return kept.booted_in_ms.map(Duration::from_millis);
    }
    let (answer, keep) = probe(&key, dir).await;
    if keep {
        write_answer(
            dir,
            &ProbeAnswer {
                key,
                booted_in_ms: answer
                    .as_ref()
                    .map(|d| d.as_millis() as u64)
                    .map_err(Clone::clone),
            },
        );
    }
    drop(lock);
    answer
}

/// Boots the guest kernel on KVM once; its console goes to a file in `dir`. Also says
/// whether the answer may be kept: not when QEMU was killed (SIGKILL: the OOM killer of a
/// small pod's cgroup says nothing about KVM; QEMU's own abort on KVM is an answer).
async fn probe(key: &ProbeKey, dir: &Path) -> (Result<Duration, String>, bool) {
    boot_to_panic(&key.qemu, &key.kernel, &key.machine, "kvm", dir).await
}

/// Boots `kernel` with no root file system on `accel` (kvm; tcg for a test of the probe
/// itself) until it panics, which ends QEMU (`-no-reboot`): how long that took, or why it
/// did not happen within [`DEADLINE`]; and whether that answer may be kept.
pub async fn boot_to_panic(
    qemu: &Path,
    kernel: &Path,
    machine: &str,
    accel: &str,
    dir: &Path,
) -> (Result<Duration, String>, bool) {
    let console = dir.join(format!("kvm-probe-{}.console", std::process::id()));
    let _ = std::fs::remove_file(&console);
    let machine = format!("{machine},accel={accel}");
    // The VMs' CPU on KVM is the host's (host-passthrough); TCG has none such.
    let cpu = if accel == "kvm" { "host" } else { "max" };
    let serial = format!("file:{}", console.display());
    let words = [
        "-machine",
        &machine,
        "-cpu",
        cpu,
        "-m",
        "64",
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-serial",
        &serial,
        "-no-reboot",
        "-append",
        "console=ttyS0 panic=-1 loglevel=4 root=/dev/vmlet-kvm-probe",
        "-kernel",
    ];
    let args: Vec<&std::ffi::OsStr> = words
        .iter()
        .map(std::ffi::OsStr::new)
        .chain([kernel.as_os_str()])
        .collect();
    let start = Instant::now();
    let ran = host_command::output(&qemu.to_string_lossy(), &args, DEADLINE, 4096).await;
    let took = start.elapsed();
    let said = crate::guest::console::tail_of(&console, MAX_READ);
    let _ = std::fs::remove_file(&console);
    let last_line = || {
        said.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| crate::guest::guest_text::clean(l.trim(), 160))
            .unwrap_or_else(|| "nothing".into())
    };
    let out = match ran {
        Ok(out) => out,
        Err(e) => return (Err(format!("run {}: {e}", qemu.display())), false),
    };
    let keep = out.finished != Finished::Exited(128 + libc::SIGKILL);
    let answer = match out.finished {
        Finished::Exited(0) if said.contains(PANIC_LINE) => Ok(took),
        Finished::Exited(0) => Err(format!(
            "QEMU ended before the probe guest's kernel got to its end (its console's last line: {})",
            last_line()
        )),
        Finished::Exited(code) => Err(format!(
            "QEMU exited with status {code} booting a probe guest on {}: {}",
            accel.to_uppercase(),
            crate::guest::guest_text::clean(out.stderr_tail.trim(), 300)
        )),
        Finished::TimedOut => Err(format!(
            "a probe guest did not boot on {} within {} s (its console's last line: {})",
            accel.to_uppercase(),
            DEADLINE.as_secs(),
            last_line()
        )),
    };
    (answer, keep)
}

/// The lock one prober holds; waits at most [`LOCK_DEADLINE`] for another's.
async fn lock(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    crate::host::file_lock::exclusive(&dir.join(LOCK_FILE), LOCK_DEADLINE)
        .await
        .map_err(|e| e.message())
}

fn read_answer(dir: &Path) -> Option<ProbeAnswer> {
    let mut text = Vec::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(ANSWER_FILE))
        .ok()?
        .take(MAX_READ)
        .read_to_end(&mut text)
        .ok()?;
    serde_json::from_slice(&text).ok()
}

/// Keeps an answer (a failure to keep it only means the next pod probes again).
fn write_answer(dir: &Path, answer: &ProbeAnswer) {
    let Ok(json) = serde_json::to_vec_pretty(answer) else {
        return;
    };
    let temporary = dir.join(format!("{ANSWER_FILE}.{}", std::process::id()));
    if std::fs::write(&temporary, json).is_err()
        || std::fs::rename(&temporary, dir.join(ANSWER_FILE)).is_err()
    {
        let _ = std::fs::remove_file(&temporary);
        log::warn!("could not keep the KVM probe's answer in {}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ProbeKey {
        ProbeKey {
            boot_id: "b".into(),
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            qemu_modified: 1,
            kernel: "/usr/local/share/vmlet/vmlinux".into(),
            kernel_modified: 2,
            machine: "q35".into(),
        }
    }

    #[tokio::test]
    async fn a_kept_answer_is_used_while_its_key_holds() {
        let dir = tempfile::tempdir().unwrap();
        let answer = ProbeAnswer {
            key: key(),
            booted_in_ms: Err("a probe guest did not boot".into()),
        };
        write_answer(dir.path(), &answer);
        assert_eq!(read_answer(dir.path()), Some(answer));
        // A lock is taken and given back.
        drop(lock(dir.path()).await.unwrap());
        drop(lock(dir.path()).await.unwrap());
    }

    #[test]
    fn a_broken_or_foreign_answer_file_is_no_answer() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ANSWER_FILE), "{not json").unwrap();
        assert_eq!(read_answer(dir.path()), None);
        std::fs::remove_file(dir.path().join(ANSWER_FILE)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(ANSWER_FILE)).unwrap();
        assert_eq!(read_answer(dir.path()), None, "a link is not followed");
    }
}
