//! QEMU as a child of the shim (`launcher = "direct"`, started by
//! `vm/direct_start.rs` with the command line of [`crate::vmm::qemu_command`]), confined as libvirt
//! confines it: before it executes QEMU, the child joins the pod's cgroup, asks for the
//! pod's AppArmor profile at the exec where the node has AppArmor, makes its own view of the
//! node's files ([`crate::host::qemu_view`], after every write to `/proc`, which it leaves
//! read-only), and becomes the pod's own user with the node's QEMU user's groups (`kvm`
//! among them, for `/dev/kvm`), as libvirt makes it. It keeps only the descriptors it is handed (each under
//! its number, which the command line names; every other one is closed at the exec); its stdout and stderr go to a log
//! file of the pod's. It runs in a session of its own, from `/`, with an environment of its
//! own and the OOM score a process starts with (not the shim's, which containerd lowers). It
//! is signalled and awaited through its pidfd ([`crate::host::pidfd`]).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::host::pidfd;
use crate::Error;

/// What the child is confined to.
#[derive(Debug)]
pub struct Confinement {
    /// The node's QEMU user, its group and its supplementary groups.
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// `cgroup.procs` of each hierarchy of the pod's cgroup, opened by the shim for writing.
    pub cgroup_procs: Vec<File>,
    /// The (loaded) AppArmor profile QEMU runs under; none where the node has no AppArmor.
    pub apparmor_profile: Option<String>,
    /// QEMU's own view of the node's files ([`crate::host::qemu_view`]); none: the shim's.
    pub view: Option<crate::host::qemu_view::MountView>,
}

/// Where a process asks for the profile of its next exec (the older name as a fallback).
const APPARMOR_EXEC: [&str; 2] = ["/proc/self/attr/apparmor/exec", "/proc/self/attr/exec"];
/// QEMU's environment: nothing of the shim's.
const ENVIRONMENT: [(&str, &str); 2] = [("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), ("LC_ALL", "C")];

/// A QEMU the shim started. Dropped, it kills its QEMU: no VM outlives its handle by
/// accident (an error's early return, a panic).
#[derive(Debug)]
pub struct QemuProcess {
    pub pid: u32,
    pidfd: OwnedFd,
}

/// Starts `program` with `args`, confined by `confinement`, with `inherit` as its only
/// descriptors beside stdin (`/dev/null`) and stdout and stderr (`log`).
pub fn spawn(
    program: &Path,
    args: &[String],
    inherit: Vec<OwnedFd>,
    confinement: Confinement,
    log: File,
) -> Result<QemuProcess, Error> {
    if confinement.uid == 0 || confinement.gid == 0 {
        return Err(Error::FailedPrecondition(format!(
            "QEMU would run as root (uid {}, gid {}): the node's qemu_user must be another",
            confinement.uid, confinement.gid
        )));
    }
    let Confinement {
        uid,
        gid,
        groups,
        cgroup_procs,
        apparmor_profile,
        view,
    } = confinement;
    // Everything the child uses is made here: between fork and exec it only makes system
    // calls.
    let keep: Vec<RawFd> = inherit.iter().map(AsRawFd::as_raw_fd).collect();
    let cgroups: Vec<RawFd> = cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect();
    let apparmor = match &apparmor_profile {
        Some(profile) => Some(
            CString::new(format!("exec {profile}"))
                .map_err(|_| Error::Internal(format!("AppArmor profile {profile:?}")))?,
        ),
        None => None,
    };
    let apparmor_paths: Vec<CString> = APPARMOR_EXEC
        .iter()
        .map(|p| CString::new(*p).expect("no NUL"))
        .collect();
    let oom_score_adj = oom_score_adj_path();
    let mut command = detached_command(program, log)?;
    command.args(args).envs(ENVIRONMENT);
    // SAFETY: the closure makes only async-signal-safe system calls on data made before
    // the fork, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if !detach(&oom_score_adj) || !join_cgroups(&cgroups) {
                return fail();
            }
            // The request is written before the view, which leaves `/proc` read-only.
            if let Some(request) = &apparmor {
                // The first of the attribute files that opens takes the request.
                let asked = apparmor_paths
                    .iter()
                    .find_map(|path| write_path(path, request.as_bytes()));
                if asked != Some(true) {
                    return fail();
                }
            }
            if view.as_ref().is_some_and(|view| !view.enter()) {
                return fail();
            }
            if libc::getuid() == 0 && libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                return fail();
            }
            if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                return fail();
            }
            if !close_all_but(&keep) {
                return fail();
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| Error::io(format!("start {} confined", program.display()), e))?;
    // The child has its copies (or is gone): the shim's are closed.
    drop(inherit);
    drop(cgroup_procs);
    let pid = child.id();
    // The shim's reaper may collect a QEMU that ended at once before its pidfd is opened,
    // and its PID may be another process's by then: the pidfd is taken for QEMU's only
    // while that PID is still the shim's child.
    match pidfd::open_if_running(pid) {
        Ok(Some(pidfd)) if pidfd::parent(pid) == Some(std::process::id()) => {
            Ok(QemuProcess { pid, pidfd })
        }
        Ok(_) => Err(ended_at_once(program)),
        Err(e) => {
            let _ = child.kill();
            Err(e)
        }
    }
}

/// `program` with nothing of the shim's: no environment, `/` for its directory, stdin
/// `/dev/null`, stdout and stderr `log`; what [`detach`] and [`close_all_but`] finish
/// between fork and exec.
pub(crate) fn detached_command(program: &Path, log: File) -> Result<Command, Error> {
    let err_log = log
        .try_clone()
        .map_err(|e| Error::io(format!("dup the log of {}", program.display()), e))?;
    let mut command = Command::new(program);
    command
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log);
    Ok(command)
}

/// A helper of the pod's VM (virtiofsd, vhost-device-vsock) as [`detached_command`] makes
/// it, which between fork and exec also makes its files 0600 (umask 077), joins the cgroups
/// whose `cgroup.procs` are `cgroup_procs` (a process it forks is in them too), [`detach`]es
/// and keeps only the descriptors `keep` beside stdio.
pub(crate) fn helper_command(
    program: &Path,
    log: File,
    cgroup_procs: Vec<File>,
    keep: Vec<RawFd>,
) -> Result<Command, Error> {
    let cgroups: Vec<RawFd> = cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect();
    let oom_score_adj = oom_score_adj_path();
    let mut command = detached_command(program, log)?;
    // SAFETY: the closure makes only async-signal-safe system calls on data made before
    // the fork, and allocates nothing. The cgroup files stay open while it runs (it owns
    // them).
    unsafe {
        command.pre_exec(move || {
            let _open = &cgroup_procs;
            libc::umask(0o077);
            if !join_cgroups(&cgroups) || !detach(&oom_score_adj) || !close_all_but(&keep) {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(command)
}

/// `/proc/self/oom_score_adj`, for [`detach`].
pub(crate) fn oom_score_adj_path() -> CString {
    CString::new("/proc/self/oom_score_adj").expect("no NUL")
}

/// Makes the calling process (between fork and exec) a session of its own, with the OOM
/// score a process starts with (`oom_score_adj`, [`oom_score_adj_path`]) and no core dumps
/// (a guest that crashes its QEMU or virtiofsd writes nothing to the node's disk): whether
/// each took.
///
/// # Safety
/// Only what `setsid(2)`, `setrlimit(2)` and [`write_path`] require.
pub(crate) unsafe fn detach(oom_score_adj: &CStr) -> bool {
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    libc::setsid() >= 0
        && write_path(oom_score_adj, b"0") == Some(true)
        && libc::setrlimit(libc::RLIMIT_CORE, &no_core) == 0
}

/// Marks every descriptor but stdio and `keep` to close at the exec, whoever opened it
/// without O_CLOEXEC: whether it took.
///
/// # Safety
/// Only what `close_range(2)` and `fcntl(2)` require.
pub(crate) unsafe fn close_all_but(keep: &[RawFd]) -> bool {
    libc::syscall(
        libc::SYS_close_range,
        3u32,
        u32::MAX,
        libc::CLOSE_RANGE_CLOEXEC,
    ) == 0
        && keep
            .iter()
            .all(|fd| libc::fcntl(*fd, libc::F_SETFD, 0) == 0)
}

/// Moves the calling process into each cgroup whose `cgroup.procs` is open at one of `fds`
/// (with system calls alone, between fork and exec): whether every write took.
///
/// # Safety
/// Only what `write(2)` requires.
pub(crate) unsafe fn join_cgroups(fds: &[RawFd]) -> bool {
    fds.iter()
        .all(|fd| libc::write(*fd, b"0".as_ptr().cast(), 1) == 1)
}

/// Writes `bytes` to the file at `path` with system calls alone (between fork and exec):
/// whether all were written, `None` where the file does not open.
///
/// # Safety
/// Only what `open(2)`, `write(2)` and `close(2)` require.
unsafe fn write_path(path: &CStr, bytes: &[u8]) -> Option<bool> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return None;
    }
    let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    libc::close(fd);
    Some(written == bytes.len() as isize)
}

fn ended_at_once(program: &Path) -> Error {
    Error::FailedPrecondition(format!(
        "{} ended as it started (its log says why)",
        program.display()
    ))
}

impl QemuProcess {
    /// Its PID and start time, for the pod's journal; `None` once it has been reaped (its
    /// PID may be another process's by then).
    pub fn id(&self) -> Option<crate::host::undo::ProcessId> {
        let process = crate::host::undo::ProcessId::of(self.pid, "QEMU")?;
        // Not reaped after its start time was read: the start time was its.
        pidfd::not_reaped(&self.pidfd).then_some(process)
    }

    /// Sends `signal` to it (gone already is no error).
    pub fn signal(&self, signal: i32) -> Result<(), Error> {
        pidfd::signal(&self.pidfd, signal, &format!("QEMU {}", self.pid))
    }

    /// Whether it ends within `within`; once it has, its exit is collected (if the shim's
    /// reaper has not).
    pub async fn ended_within(&self, within: Duration) -> Result<bool, Error> {
        let ended = pidfd::ended_within(&self.pidfd, within).await?;
        if ended {
            pidfd::reap(&self.pidfd);
        }
        Ok(ended)
    }

    /// Kills it and waits up to `within` for its end.
    pub async fn kill(&self, within: Duration) -> Result<(), Error> {
        self.signal(libc::SIGKILL)?;
        match self.ended_within(within).await? {
            true => Ok(()),
            false => Err(Error::Timeout(format!(
                "QEMU {} did not end within {} s of SIGKILL",
                self.pid,
                within.as_secs()
            ))),
        }
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        let _ = self.signal(libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn root() -> bool {
        nix::unistd::getuid().is_root()
    }

    /// The user a test's child becomes: `nobody` where the test runs as root, else the
    /// test's own.
    fn me() -> (u32, u32) {
        match root() {
            true => (65534, 65534),
            false => (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            ),
        }
    }

    /// Confined to the test's user ([`me`]), with `groups`.
    fn as_me(groups: Vec<u32>, cgroup_procs: Vec<File>) -> Confinement {
        let (uid, gid) = me();
        Confinement {
            uid,
            gid,
            groups,
            cgroup_procs,
            apparmor_profile: None,
            view: None,
        }
    }

    /// Runs `script` under `sh` confined by `confinement`, handing it `inherit`; its output.
    async fn run(script: &str, inherit: Vec<OwnedFd>, confinement: Confinement) -> String {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let process = spawn(
            Path::new("/bin/sh"),
            &["-c".to_owned(), script.to_owned()],
            inherit,
            confinement,
            File::create(&log).unwrap(),
        )
        .unwrap();
        assert!(process.ended_within(Duration::from_secs(10)).await.unwrap());
        std::fs::read_to_string(&log).unwrap()
    }

    #[tokio::test]
    async fn the_child_joins_the_cgroup_becomes_the_user_and_keeps_only_what_it_is_handed() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().join("cgroup.procs");
        let (uid, gid) = me();
        let handed = OwnedFd::from(File::open("/dev/null").unwrap());
        let kept = handed.as_raw_fd();
        let not_handed = File::open("/dev/null").unwrap();
        let out = run(
            &format!(
                "id -u; id -g; id -G; test -e /proc/self/fd/{kept} && echo kept; \
                 test -e /proc/self/fd/{} || echo closed; cat /proc/self/oom_score_adj; \
                 pwd; echo \"$PATH\"; test \"$(cut -d' ' -f6 /proc/$$/stat)\" = $$ && echo leader",
                not_handed.as_raw_fd()
            ),
            vec![handed],
            as_me(
                vec![gid, 4242],
                vec![std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(&procs)
                    .unwrap()],
            ),
        )
        .await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[..2], [uid.to_string(), gid.to_string()], "{out}");
        if root() {
            // Exactly the groups asked for, none of the shim's.
            assert_eq!(lines[2], format!("{gid} 4242"), "{out}");
        }
        assert_eq!(
            lines[3..],
            ["kept", "closed", "0", "/", ENVIRONMENT[0].1, "leader"],
            "{out}"
        );
        // The child wrote "0" (itself) into each cgroup's procs.
        let mut written = String::new();
        File::open(&procs)
            .unwrap()
            .read_to_string(&mut written)
            .unwrap();
        assert_eq!(written, "0");
    }

    #[tokio::test]
    async fn a_process_that_does_not_end_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let process = spawn(
            Path::new("/bin/sleep"),
            &["100".to_owned()],
            Vec::new(),
            as_me(Vec::new(), Vec::new()),
            File::create(dir.path().join("log")).unwrap(),
        )
        .unwrap();
        assert!(!process
            .ended_within(Duration::from_millis(50))
            .await
            .unwrap());
        process.kill(Duration::from_secs(5)).await.unwrap();
        process.signal(libc::SIGKILL).unwrap();
    }

    #[test]
    fn qemu_never_runs_as_root() {
        let dir = tempfile::tempdir().unwrap();
        for (uid, gid) in [(0, 65534), (65534, 0)] {
            let err = spawn(
                Path::new("/bin/true"),
                &[],
                Vec::new(),
                Confinement {
                    uid,
                    gid,
                    groups: Vec::new(),
                    cgroup_procs: Vec::new(),
                    apparmor_profile: None,
                    view: None,
                },
                File::create(dir.path().join("log")).unwrap(),
            )
            .unwrap_err();
            assert!(err.message().contains("qemu_user"), "{err}");
        }
    }

    #[tokio::test]
    async fn a_profile_that_cannot_be_asked_for_fails_the_start() {
        let dir = tempfile::tempdir().unwrap();
        if Path::new("/sys/kernel/security/apparmor").exists() {
            eprintln!("skipped: this kernel has AppArmor (check-apparmor covers it)");
            return;
        }
        let err = spawn(
            Path::new("/bin/true"),
            &[],
            Vec::new(),
            Confinement {
                apparmor_profile: Some("vmlet-pod".into()),
                view: None,
                ..as_me(Vec::new(), Vec::new())
            },
            File::create(dir.path().join("log")).unwrap(),
        )
        .unwrap_err();
        assert!(err.message().contains("confined"), "{err}");
    }
}
