//! Removing what a pod made, from its state file's journal ([`crate::host::undo`]): the
//! one teardown that a shim's delete, a failed boot, `shim delete` after a dead shim and
//! `vmletctl gc` share. It uses the pod's record and the VM manager, nothing of the running
//! shim.

use vmlet_config::NodeConfig;

use crate::host::share;
use crate::host::state::PodState;
use crate::host::undo::Made;
use crate::vmm::VmManager;
use crate::Error;

/// Undoes `state`'s journal: the VM first (the domain, or QEMU started without libvirt),
/// then the rest, the last made first; then removes the directory, and gives the pod's uid
/// back when nothing failed. Goes on past failures and reports the first, but stops at
/// once, keeping the directory and its journal, when the VM could not be removed (libvirt
/// down): what the VM still uses stays for a later teardown (`shim delete`, `vmletctl gc`,
/// or the task's delete again) to remove, the VM first.
pub fn teardown(vmm: &dyn VmManager, state: &PodState) -> Result<(), Error> {
    undo_journal(vmm, state, true)
}

/// [`teardown`] of a create that failed: goes on past a VM that could not be removed too,
/// as nothing would retry it (the pod has no task to delete, and containerd's one `shim
/// delete` may meet libvirt as it is); the domain, marked as vmlet's, is what `vmletctl
/// gc` finds then.
pub fn teardown_failed_create(vmm: &dyn VmManager, state: &PodState) -> Result<(), Error> {
    undo_journal(vmm, state, false)
}

fn undo_journal(vmm: &dyn VmManager, state: &PodState, keep_for_the_vm: bool) -> Result<(), Error> {
    let mut first: Option<Error> = None;
    let note = |first: &mut Option<Error>, r: Result<(), Error>| {
        if let Err(e) = r {
            log::warn!("teardown: {}", e.message());
            first.get_or_insert(e);
        }
    };
    let (vm, rest): (Vec<&Made>, Vec<&Made>) = state
        .made
        .iter()
        .partition(|m| matches!(m, Made::Domain(_) | Made::Qemu(_)));
    let (users, rest): (Vec<&Made>, Vec<&Made>) = rest
        .into_iter()
        .partition(|m| matches!(m, Made::PodUser(_)));
    for made in vm {
        match made.undo(vmm, &state.dir) {
            Err(e) if keep_for_the_vm => {
                log::warn!("teardown: {}", e.message());
                return Err(e.within(&format!(
                    "the pod's VM was not removed; {} and its journal are kept for the next try",
                    state.dir.display()
                )));
            }
            result => note(&mut first, result),
        }
    }
    for made in rest.into_iter().rev() {
        note(&mut first, made.undo(vmm, &state.dir));
    }
    // The pod's figures socket, which a killed shim leaves in the metrics directory.
    if let (Some(state_dir), Some(pod_id)) = (state.dir.parent(), state.dir.file_name()) {
        let socket = crate::task::metrics_dir::socket(state_dir, &pod_id.to_string_lossy());
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => note(
                &mut first,
                Err(Error::io(format!("remove {}", socket.display()), e)),
            ),
            _ => {}
        }
    }
    // Whatever the state file did not list (it was lost): nothing may stop the removal.
    if state.dir.exists() {
        note(&mut first, share::unmount_below(&state.dir));
        note(&mut first, share::remove_pod_dir(&state.dir));
    }
    // The pod's uid goes back last, and only once everything of the pod is gone: a file
    // left (libvirt gives what it relabelled back to the uid it found) would be open to
    // the next pod given it. Kept, the claim goes when the pod's directory does.
    if first.is_none() {
        for made in &users {
            note(&mut first, made.undo(vmm, &state.dir));
        }
    }
    // Nothing of the pod is left: the lock's file goes too (held until the state's last
    // copy is dropped).
    if first.is_none() {
        note(&mut first, state.lock.remove_file());
    } else if !users.is_empty() {
        log::warn!(
            "teardown: {}'s uid stays claimed while something of the pod is left",
            state.dir.display()
        );
    }
    first.map_or(Ok(()), Err)
}

/// Whether `pid` is the running shim of `pod_id` (checked by its command line, so that a
/// recycled PID is never taken for it).
pub fn live_shim(pid: u32, pod_id: &str) -> bool {
    shim_namespace(pid, pod_id).is_some()
}

/// The containerd namespace of `pid`, when `pid` is the running shim of `pod_id`
/// (containerd starts each with `-namespace NS -id ID`, as root); an empty one where its
/// command line names none. A process any of whose user ids is not root's is never taken
/// for a shim, whatever its command line says.
fn shim_namespace(pid: u32, pod_id: &str) -> Option<String> {
    if !crate::host::pod_user::runs_only_as(pid, 0) {
        return None;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let flag = |name: &[u8]| args.windows(2).find(|w| w[0] == name).map(|w| w[1]);
    let is_shim = args
        .first()
        .is_some_and(|a| a.ends_with(b"containerd-shim-vmlet-v2"))
        && args
            .windows(2)
            .any(|w| w[0] == b"-id" && w[1] == pod_id.as_bytes());
    is_shim.then(|| String::from_utf8_lossy(flag(b"-namespace").unwrap_or_default()).into_owned())
}

/// The live shim `state` names, other than this process: its PID and its containerd
/// namespace (empty where its command line names none).
pub fn serving_shim(state: &PodState) -> Option<(u32, String)> {
    let pid = state.shim_pid.filter(|p| *p != std::process::id())?;
    Some((pid, shim_namespace(pid, &state.shim_id())?))
}

/// The live shim `state` names, when its containerd namespace is not `namespace`: vmlet
/// names a pod by its id alone, so the same id in a second namespace finds the first one's
/// pod (its create is refused: the state directory exists), and that namespace's cleanup
/// must leave it alone.
fn shim_of_another_namespace(state: &PodState, namespace: &str) -> Option<(u32, String)> {
    serving_shim(state).filter(|(_, theirs)| !theirs.is_empty() && theirs != namespace)
}

/// How long `shim delete` waits for the pod's lock: its shim, killed, lets go at once. Well
/// inside containerd's own deadline for the cleanup (`io.containerd.timeout.shim.cleanup`,
/// 5 s), so that the teardown gets the rest; a pod a `vmletctl gc` is removing meanwhile is
/// left to it (the delete fails with a timeout that says so).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// `shim delete` in containerd namespace `namespace`: containerd's cleanup after the shim
/// is gone. Leaves alone a pod whose live shim is another namespace's (the same id there);
/// else stops a shim containerd gave up on, takes the pod's lock, then removes whatever the
/// pod's state file lists.
pub fn cleanup_after_shim(
    config: &NodeConfig,
    vmm: &dyn VmManager,
    namespace: &str,
    pod_id: &str,
) -> Result<(), Error> {
    let dir = crate::host::pod_paths::PodPaths::new(&config.state_dir, pod_id).dir;
    if !dir.exists() {
        return Ok(());
    }
    if let Ok(state) = PodState::load(&dir) {
        if let Some((pid, theirs)) = shim_of_another_namespace(&state, namespace) {
            log::warn!(
                "pod {pod_id}: served by shim {pid} of containerd namespace {theirs}, not {namespace}: the cleanup of {namespace}/{pod_id} leaves it alone"
            );
            return Ok(());
        }
        stop_given_up_shim(&state, pod_id);
    }
    let lock = crate::host::pod_lock::take_blocking(&config.state_dir, pod_id, LOCK_WAIT)?;
    cleanup_locked(
        config,
        vmm,
        pod_id,
        crate::host::pod_lock::HeldLock::new(lock),
    )
}

/// Kills the shim `state` names if it still runs (containerd gave up on it: nothing will
/// talk to it again).
fn stop_given_up_shim(state: &PodState, pod_id: &str) {
    if let Some(pid) = state.shim_pid.filter(|p| *p != std::process::id()) {
        if live_shim(pid, &state.shim_id()) {
            log::warn!("pod {pod_id}: stopping its shim {pid}, which containerd gave up on");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Removes whatever pod `pod_id`'s state file lists (what any pod of that id may have left,
/// where it has none), with the pod's `lock` held ([`crate::host::pod_lock`]): read after
/// the lock is taken, so that it is what the pod's last holder left.
pub fn cleanup_locked(
    config: &NodeConfig,
    vmm: &dyn VmManager,
    pod_id: &str,
    lock: crate::host::pod_lock::HeldLock,
) -> Result<(), Error> {
    let dir = crate::host::pod_paths::PodPaths::new(&config.state_dir, pod_id).dir;
    if !dir.exists() {
        return lock.remove_file();
    }
    // Without its state file, what any pod of that id may have left outside its directory.
    let state = PodState::load(&dir).unwrap_or_else(|_| PodState {
        dir: dir.clone(),
        made: vec![
            Made::DiskDir(crate::host::pod_paths::disk_dir(
                &config.vm_images.disk_dir,
                pod_id,
            )),
            Made::Domain(crate::host::pod_paths::domain_name(pod_id)),
        ]
        .into_iter()
        .chain(crate::host::qemu_apparmor::left_by(pod_id))
        .collect(),
        ..Default::default()
    });
    let state = PodState { lock, ..state };
    teardown(vmm, &state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teardown_removes_domain_and_dir() {
        let dir = std::env::temp_dir().join(format!("vmlet-teardown-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("share")).unwrap();
        let vmm = crate::vmm::FakeVmm::default();
        vmm.start(&crate::vmm::StartDomain::named("vmlet-p", "p"))
            .unwrap();
        let state = PodState {
            dir: dir.clone(),
            made: vec![Made::Domain("vmlet-p".into())],
            ..Default::default()
        };
        teardown(&vmm, &state).unwrap();
        assert!(vmm.running.lock().unwrap().is_empty());
        assert!(!dir.exists());
    }

    #[test]
    fn teardown_goes_on_past_a_failed_undo_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let pod_dir = dir.path().join("p");
        std::fs::create_dir(&pod_dir).unwrap();
        let vmm = crate::vmm::FakeVmm::default();
        vmm.start(&crate::vmm::StartDomain::named("vmlet-p", "p"))
            .unwrap();
        let state = PodState {
            dir: pod_dir.clone(),
            // Undone last: a mount outside the pod's directory is refused.
            made: vec![Made::Mount("/etc".into()), Made::Domain("vmlet-p".into())],
            ..Default::default()
        };
        // What a killed shim left in the metrics directory.
        let socket = crate::task::metrics_dir::socket(dir.path(), "p");
        std::fs::create_dir(socket.parent().unwrap()).unwrap();
        std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let err = teardown(&vmm, &state).unwrap_err();
        assert!(err.message().contains("not unmounting /etc"), "{err:?}");
        assert!(vmm.running.lock().unwrap().is_empty());
        assert!(!pod_dir.exists());
        assert!(!socket.exists());
    }

    /// The pod's uid goes back only when nothing failed; its claim is the pod id's in
    /// `<state>/.pod-users/<uid>`.
    #[test]
    fn a_pods_uid_goes_back_only_when_all_of_the_pod_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let claims = dir.path().join(crate::host::pod_user::CLAIMS_DIR);
        std::fs::create_dir(&claims).unwrap();
        let vmm = crate::vmm::FakeVmm::default();
        for (pod, made, given_back) in [
            ("clean", vec![Made::PodUser(7)], true),
            (
                "failed",
                vec![Made::PodUser(8), Made::Mount("/etc".into())],
                false,
            ),
        ] {
            let pod_dir = dir.path().join(pod);
            std::fs::create_dir(&pod_dir).unwrap();
            let uid = match made[0] {
                Made::PodUser(uid) => uid,
                _ => unreachable!(),
            };
            std::fs::write(claims.join(uid.to_string()), pod).unwrap();
            let lock = crate::host::pod_lock::try_take(dir.path(), pod)
                .unwrap()
                .unwrap();
            let state = PodState {
                dir: pod_dir.clone(),
                made,
                lock: crate::host::pod_lock::HeldLock::new(lock),
                ..Default::default()
            };
            assert_eq!(teardown(&vmm, &state).is_ok(), given_back, "{pod}");
            assert_eq!(!claims.join(uid.to_string()).exists(), given_back, "{pod}");
            // The lock's file goes with the uid: what is left is removed under it later.
            let lock_file = crate::host::pod_lock::path(dir.path(), pod);
            assert_eq!(!lock_file.exists(), given_back, "{pod}");
        }
    }

    #[test]
    fn a_vm_not_removed_keeps_the_pods_directory_and_journal() {
        let dir = tempfile::tempdir().unwrap();
        let pod_dir = dir.path().join("p");
        std::fs::create_dir(&pod_dir).unwrap();
        let share = pod_dir.join("share");
        std::fs::create_dir(&share).unwrap();
        // libvirt down: the domain's removal fails.
        struct Down;
        impl VmManager for Down {
            fn kvm_usable(&self, _: &str, _: &str) -> bool {
                false
            }
            fn start(&self, _: &crate::vmm::StartDomain) -> Result<(), Error> {
                unreachable!()
            }
            fn remove(&self, name: &str) -> Result<(), Error> {
                Err(Error::Libvirt(format!("remove {name}: libvirt is down")))
            }
            fn live_xml(&self, _: &str) -> Result<String, Error> {
                unreachable!()
            }
            fn is_active(&self, _: &str) -> Result<bool, Error> {
                unreachable!()
            }
            fn vmlet_domains(&self) -> Result<Vec<crate::vmm::VmletDomain>, Error> {
                unreachable!()
            }
            fn qemu_pid_file(&self, _: &str) -> Result<std::path::PathBuf, Error> {
                unreachable!()
            }
        }
        let lock = crate::host::pod_lock::try_take(dir.path(), "p")
            .unwrap()
            .unwrap();
        let state = PodState {
            dir: pod_dir.clone(),
            made: vec![Made::Domain("vmlet-p".into())],
            lock: crate::host::pod_lock::HeldLock::new(lock),
            ..Default::default()
        };
        state.save().unwrap();
        let err = teardown(&Down, &state).unwrap_err();
        assert!(err.message().contains("libvirt is down"), "{err:?}");
        assert!(err.message().contains("kept"), "{err:?}");
        assert!(share.is_dir(), "nothing else undone");
        assert_eq!(PodState::load(&pod_dir).unwrap().made, state.made);
        assert!(crate::host::pod_lock::path(dir.path(), "p").exists());
        // libvirt back: the next teardown removes it all.
        let vmm = crate::vmm::FakeVmm::default();
        teardown(&vmm, &state).unwrap();
        assert!(!pod_dir.exists());
        // A failed create's teardown goes on past it: nothing would try again.
        std::fs::create_dir_all(&share).unwrap();
        let err = teardown_failed_create(&Down, &state).unwrap_err();
        assert!(err.message().contains("libvirt is down"), "{err:?}");
        assert!(!pod_dir.exists());
    }

    #[test]
    fn shim_delete_waits_for_the_pods_lock() {
        let dir = tempfile::tempdir().unwrap();
        let config = NodeConfig {
            state_dir: dir.path().to_owned(),
            ..Default::default()
        };
        let pod_dir = dir.path().join("p");
        std::fs::create_dir(&pod_dir).unwrap();
        PodState {
            dir: pod_dir.clone(),
            ..Default::default()
        }
        .save()
        .unwrap();
        let held = crate::host::pod_lock::try_take(dir.path(), "p")
            .unwrap()
            .unwrap();
        let started = std::time::Instant::now();
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(held);
        });
        cleanup_after_shim(&config, &crate::vmm::FakeVmm::default(), "default", "p").unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(200));
        letting_go.join().unwrap();
        assert!(!pod_dir.exists());
        assert!(!crate::host::pod_lock::path(dir.path(), "p").exists());
    }

    #[test]
    fn a_qemu_started_without_libvirt_is_ended_by_the_teardown() {
        let dir = tempfile::tempdir().unwrap();
        let pod_dir = dir.path().join("p");
        std::fs::create_dir(&pod_dir).unwrap();
        let mut qemu = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let state = PodState {
            dir: pod_dir.clone(),
            made: vec![
                Made::Mount("/etc".into()),
                Made::Qemu(crate::host::undo::ProcessId::of(qemu.id(), "QEMU").unwrap()),
                Made::Mount(pod_dir.join("share")),
            ],
            ..Default::default()
        };
        // The mount outside the pod's directory fails; QEMU is gone all the same.
        teardown(&crate::vmm::FakeVmm::default(), &state).unwrap_err();
        assert!(qemu.try_wait().is_err(), "QEMU was killed and collected");
        assert!(!pod_dir.exists());
    }

    #[test]
    fn a_pid_is_a_shim_only_by_its_command_line() {
        assert!(!live_shim(std::process::id(), "x"));
        assert!(!live_shim(0, "x"));
    }
}
