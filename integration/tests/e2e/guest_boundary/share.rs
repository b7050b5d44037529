//! The shared directory under a root guest that attacks it: nothing it writes steers a host
//! path operation; the pod's state stays private.

use super::*;

/// Where the `share-in-containers` fault puts the guest's view of the share.
const SHARE: &str = "/.vmlet-share";

/// Host files and a mount the guest would like to reach, and how they looked before.
struct Canaries {
    root: PathBuf,
    dir: PathBuf,
    file: PathBuf,
    mount: PathBuf,
    /// A read-write and a read-only volume given to the pod's containers.
    rw_volume: PathBuf,
    ro_volume: PathBuf,
    before: Vec<(PathBuf, Vec<u8>)>,
}

impl Canaries {
    fn new() -> Self {
        // Outside the stack's directory (the state dir is below it) and off /tmp's tmpfs.
        let root = PathBuf::from("/var/tmp").join(unique_id("vmlet-canaries"));
        let mut c = Canaries {
            dir: root.join("dir"),
            file: root.join("file"),
            mount: root.join("mount"),
            rw_volume: root.join("rw-volume"),
            ro_volume: root.join("ro-volume"),
            root,
            before: Vec::new(),
        };
        for d in [&c.dir, &c.mount, &c.rw_volume, &c.ro_volume] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(c.dir.join("keep"), b"canary directory\n").unwrap();
        std::fs::write(&c.file, b"canary file\n").unwrap();
        std::fs::write(c.ro_volume.join("keep"), b"read-only volume\n").unwrap();
        std::fs::write(c.rw_volume.join("keep"), b"read-write volume\n").unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "vmlet-canary"])
            .arg(&c.mount)
            .status()
            .unwrap();
        assert!(mounted.success(), "mount the canary tmpfs");
        std::fs::write(c.mount.join("keep"), b"canary mount\n").unwrap();
        c.before = snapshot(&c.root);
        c
    }

    fn is_mounted(&self) -> bool {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let point = self.mount.to_string_lossy().into_owned();
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(point.as_str()))
    }
}

impl Drop for Canaries {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Every path below `root` (symlinks not followed) with the file's bytes, or the link's
/// target, sorted.
fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if meta.is_dir() {
                todo.push(path.clone());
                b"<dir>".to_vec()
            } else {
                std::fs::read(&path).unwrap()
            };
            out.push((path, content));
        }
    }
    out.sort();
    out
}

/// What guest root tries through the agent's view of the share (`/m`). Each attempt prints
/// `planted: WHAT` when it worked; the pod's own rootfs (`$POD/rootfs`) and the read-write
/// volume are the guest's to write and get links to the canaries, which the host must not
/// follow.
fn attack_script(pod: &str, c: &Canaries, rw: &str, ro: &str, late: &str) -> String {
    let (dir, file, mount) = (c.dir.display(), c.file.display(), c.mount.display());
    format!(
        r#"
ln -s {SHARE} /m || exit 3
ls /m/ | grep -qx {pod} || {{ echo "the share does not show the pod: $(ls /m/)"; exit 4; }}
try() {{ what=$1; shift; "$@" 2>/dev/null && echo "planted: $what"; }}
try "symlink as a new container's directory" ln -s {dir} /m/evil
try "directory at the share's top" mkdir /m/evil2
try "symlink as the next container's directory" ln -s {dir} /m/{late}
try "file at the share's top" sh -c 'echo x > /m/evil3'
try "rename of the pod's directory" mv /m/{pod} /m/moved
try "rename of the pod's rootfs" mv /m/{pod}/rootfs /m/{pod}/rootfs2
try "symlink beside the rootfs" ln -s {mount} /m/{pod}/mounts
try "symlink in a container's mounts dir" ln -s {file} /m/{rw}/mounts/9
try "write through a read-only volume" sh -c 'echo pwned > /m/{ro}/mounts/0/keep'
try "remove in a read-only volume" rm /m/{ro}/mounts/0/keep
# The guest's own places: allowed, and the host must not follow them.
ln -s {dir} /m/{pod}/rootfs/escape-dir
ln -s {file} /m/{rw}/mounts/0/escape-file
ln -s {mount} /m/{rw}/mounts/0/escape-mount
echo attacks done
"#
    )
}

/// The attack script run by guest root in `pod` (aimed at the containers `rw`, `ro` and
/// the `late` one to come): nothing says it planted anything where the host works.
fn guest_root_attacks(s: &Stack, pod: &str, canaries: &Canaries, rw: &str, ro: &str, late: &str) {
    let script = attack_script(pod, canaries, rw, ro, late);
    let out = s
        .ctr_output(&[
            "task",
            "exec",
            "--exec-id",
            "attack",
            pod,
            "sh",
            "-c",
            &script,
        ])
        .unwrap();
    let said = text(&out.stdout);
    println!("attack: {said}{}", text(&out.stderr));
    assert!(
        said.contains("attacks done"),
        "the attack did not run: {said}"
    );
    let planted: Vec<&str> = said.lines().filter(|l| l.starts_with("planted")).collect();
    assert_eq!(
        planted,
        Vec::<&str>::new(),
        "the guest wrote where the host works"
    );
}

/// The canary mount is still mounted and nothing of the host changed but the guest's own
/// links in its read-write volume (which show that the attack reached the share).
fn the_host_files_are_as_they_were(canaries: &Canaries) {
    assert!(canaries.is_mounted(), "the canary mount was unmounted");
    let after = snapshot(&canaries.root);
    // The guest did reach the share: its links are in the read-write volume.
    assert!(
        after.iter().any(|(p, _)| p.ends_with("escape-file")),
        "the guest could not write its volume: the attack had no reach"
    );
    let planted_by_guest = |p: &PathBuf| {
        p.starts_with(&canaries.rw_volume)
            && p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("escape-"))
    };
    let changed: Vec<_> = after.iter().filter(|e| !planted_by_guest(&e.0)).collect();
    let before: Vec<_> = canaries.before.iter().collect();
    assert_eq!(changed, before, "host files changed");
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn guest_root_cannot_steer_the_share() {
    let s = stack();
    let _compromised = with_guest_kernel_params("vmlet.fault=share-in-containers");
    let canaries = Canaries::new();
    let pod = unique_id("guestroot");
    let in_pod = format!("io.kubernetes.cri.sandbox-id={pod}");
    run_in_pod(
        &s,
        &pod,
        "sandbox",
        &pod,
        &["--privileged"],
        &["sleep", "1000"],
    )
    .unwrap();

    // Containers joining the pod, with a read-write and a read-only volume.
    let rw = unique_id("rw");
    let ro = unique_id("ro");
    for (id, source, options) in [
        (&rw, &canaries.rw_volume, "rbind:rw"),
        (&ro, &canaries.ro_volume, "rbind:ro"),
    ] {
        let mount = format!(
            "type=bind,src={},dst=/data,options={options}",
            source.display()
        );
        run_in_pod(
            &s,
            id,
            "container",
            &pod,
            &["--mount", &mount],
            &["sleep", "1000"],
        )
        .unwrap();
    }

    let late = unique_id("late");
    guest_root_attacks(&s, &pod, &canaries, &rw, &ro, &late);

    // The container the guest aimed at, added after the plants; then everything removed.
    let out = s
        .run(
            &late,
            &[
                "--annotation",
                "io.kubernetes.cri.container-type=container",
                "--annotation",
                &in_pod,
            ],
            &["true"],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "late container: {}",
        text(&out.stderr)
    );
    for id in [&rw, &ro] {
        s.kill_and_remove(id).unwrap();
    }
    s.kill_and_remove(&pod).unwrap();

    the_host_files_are_as_they_were(&canaries);
    let pod_dir = Path::new(&s.dir).join("state").join(&pod);
    assert!(!pod_dir.exists(), "{} left", pod_dir.display());
}

/// What the guest sees at the top of the share is read-only; the host's state directory
/// for the pod is not readable by other host users.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn the_pods_state_is_private_and_its_binds_nosuid_nodev() {
    let s = stack();
    let pod = unique_id("private");
    s.run_detached_with(&pod, &[], &["sleep", "1000"]).unwrap();
    let pod_dir = Path::new(&s.dir).join("state").join(&pod);
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    };
    assert_eq!(mode(&pod_dir), 0o711, "{}", pod_dir.display());
    assert_eq!(mode(&pod_dir.join("mounts")), 0o700);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let options_of = |point: &Path| -> String {
        let point = point.to_string_lossy().into_owned();
        info.lines()
            .rev()
            .find(|l| l.split(' ').nth(4) == Some(point.as_str()))
            .map(|l| l.split(' ').nth(5).unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("{point} is not mounted:\n{info}"))
    };
    let share = options_of(&pod_dir.join("share"));
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(share.split(',').any(|o| o == flag), "share: {share}");
    }
    let rootfs = options_of(&pod_dir.join("mounts").join(&pod).join("rootfs"));
    for flag in ["nosuid", "nodev"] {
        assert!(rootfs.split(',').any(|o| o == flag), "rootfs: {rootfs}");
    }
    let in_share = options_of(&pod_dir.join("share").join(&pod).join("rootfs"));
    assert!(
        in_share.split(',').any(|o| o == "rw"),
        "rootfs in the share: {in_share}"
    );
    s.kill_and_remove(&pod).unwrap();
    assert!(!pod_dir.exists());
}
