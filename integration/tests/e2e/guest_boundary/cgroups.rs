//! The pod's cgroup on the node: every host process of the VM in it, a pod or a container
//! that would not fit refused by name, the host's PIDs told to containerd, and a guest's
//! own cgroups or a decoy virtiofsd steering nothing.

use super::*;

/// The cgroup `pid` is in, per hierarchy line of `/proc/PID/cgroup` (`4:memory:/a/b`).
fn cgroups_of(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Processes of the stack whose command line contains every one of `needles`.
fn pids_of(s: &Stack, needles: &[&str]) -> Vec<u32> {
    s.stack_processes()
        .into_iter()
        .filter(|(_, c)| needles.iter().all(|n| c.contains(n)))
        .map(|(p, _)| p)
        .collect()
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_cri_pods_vm_runs_in_the_pods_cgroup() {
    let s = stack();
    let mut cri = vmlet_integration::cri::Cri::connect(&s.containerd)
        .await
        .unwrap();
    let parent = format!("/vmlet-e2e/pod-{}", unique_id("uid"));
    let (config, logs) = pod_config_under(&parent, "cgpod");
    let pod = cri.run_pod(&config, "vmlet").await.unwrap();
    let cgroup = format!("{parent}/{pod}");

    let state = format!("{}/state/{pod}/", s.dir);
    let qemu = pids_of(&s, &["qemu-system", &format!("guest=vmlet-{pod},")]);
    // libvirt names the share as `-o source=SHARE` (9, 10) or `--shared-dir SHARE` (11).
    let virtiofsd = pids_of(&s, &["virtiofsd", &format!("{state}share")]);
    let vsock = pids_of(&s, &["vhost-device-vsock", &state]);
    let mut placed = Vec::new();
    for (what, pids) in [
        ("QEMU", &qemu),
        ("virtiofsd", &virtiofsd),
        ("vhost-device-vsock", &vsock),
    ] {
        assert!(!pids.is_empty(), "no {what} for pod {pod}");
        for pid in pids.iter() {
            let lines = cgroups_of(*pid);
            let memory = lines
                .iter()
                .find(|l| l.contains(":memory:") || l.starts_with("0::"));
            placed.push((what, *pid, memory.cloned().unwrap_or_default()));
            for line in &lines {
                assert!(
                    line.ends_with(&format!(":{cgroup}")),
                    "{what} ({pid}) is not in the pod's cgroup {cgroup}: {line}"
                );
            }
        }
    }
    println!("pod cgroup {cgroup}: {placed:?}");
    // The pod's memory usage includes the VM's (v1 memory controller here, v2 elsewhere):
    // what the guest fills after the pod started shows in the pod's cgroup.
    let usage = || {
        ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
            .iter()
            .find_map(|root| {
                let base = format!("{root}{cgroup}");
                std::fs::read_to_string(format!("{base}/memory.usage_in_bytes"))
                    .or_else(|_| std::fs::read_to_string(format!("{base}/memory.current")))
                    .ok()
            })
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("the pod cgroup's memory usage")
    };
    let before = usage();
    // 48 MiB into the container's /dev/shm, a tmpfs in the guest's memory.
    let fill = "head -c 50331648 /dev/zero > /dev/shm/fill && echo filled && sleep 1000";
    cri.create_and_start(&pod, &config, "fill", &s.image, &["sh", "-c", fill])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut after = usage();
    while after < before + (40 << 20) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        after = usage();
    }
    println!(
        "pod cgroup memory usage: {} MiB, then {} MiB with 48 MiB filled in the guest",
        before >> 20,
        after >> 20
    );
    assert!(
        after >= before + (40 << 20),
        "the VM's memory is not counted: {before} bytes, then {after} with 48 MiB filled"
    );

    cri.remove_pod(&pod).await.unwrap();
    let _ = std::fs::remove_dir_all(&logs);
    for root in vmlet_shim::host::pod_cgroup::hierarchies() {
        let left = format!("{}{cgroup}", root.display());
        assert!(!Path::new(&left).exists(), "{left} is left");
    }
    remove_pod_cgroups(&parent);
}

/// A CRI pod's config whose sandbox goes below the cgroup `parent` (as kubelet's cgroupfs
/// driver names a pod's cgroup; containerd puts the sandbox in `<parent>/<sandbox id>`),
/// and its new log directory, which the caller removes.
fn pod_config_under(parent: &str, name: &str) -> (k8s_cri::v1::PodSandboxConfig, PathBuf) {
    let logs = std::env::temp_dir().join(unique_id(&format!("vmlet-{name}-logs")));
    std::fs::create_dir_all(&logs).unwrap();
    let mut config = vmlet_integration::cri::Cri::pod_config(
        &unique_id(name),
        &unique_id("uid"),
        &logs.to_string_lossy(),
    );
    config.linux.as_mut().unwrap().cgroup_parent = parent.to_owned();
    (config, logs)
}

/// Removes a test's pod cgroup `parent` (kubelet's on a node), what is below it (the
/// sandbox's, if containerd or the shim made one) and `/vmlet-e2e`, in every hierarchy.
fn remove_pod_cgroups(parent: &str) {
    for root in vmlet_shim::host::pod_cgroup::hierarchies() {
        let root = root.display();
        for dir in std::fs::read_dir(format!("{root}{parent}"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if dir.path().is_dir() {
                let _ = std::fs::remove_dir(dir.path());
            }
        }
        let _ = std::fs::remove_dir(format!("{root}{parent}"));
        let _ = std::fs::remove_dir(format!("{root}/vmlet-e2e"));
    }
}

/// Limits the memory of the cgroup `path` (made in the memory hierarchy: v1's controller,
/// or v2's with the controller enabled down to it) to `bytes`, as a kubelet sizes a pod's.
fn limit_memory(path: &str, bytes: u64) {
    let relative = path.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/memory");
    let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
        let dir = v1.join(relative);
        std::fs::create_dir_all(&dir).unwrap();
        (dir, "memory.limit_in_bytes")
    } else {
        let mut dir = PathBuf::from("/sys/fs/cgroup");
        for part in Path::new(relative).components() {
            std::fs::write(dir.join("cgroup.subtree_control"), "+memory").unwrap();
            dir.push(part);
            std::fs::create_dir_all(&dir).unwrap();
        }
        (dir, "memory.max")
    };
    std::fs::write(dir.join(file), bytes.to_string()).unwrap();
}

/// A pod whose cgroup cannot hold its VM (a kubelet's pod with a memory limit and no
/// RuntimeClass overhead, as with vmlet as containerd's default handler) is refused before
/// a VM starts, naming the sizes and the remedy, instead of QEMU being OOM-killed on the
/// node; nothing of it is left.
#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_pod_whose_cgroup_cannot_hold_its_vm_is_refused_by_name() {
    let s = stack();
    let mut cri = vmlet_integration::cri::Cri::connect(&s.containerd)
        .await
        .unwrap();
    let parent = format!("/vmlet-e2e/pod-{}", unique_id("small"));
    limit_memory(&parent, 64 << 20);
    let state = Path::new(&s.dir).join("state");
    let entries = || -> Vec<_> {
        let mut names: Vec<_> = std::fs::read_dir(&state)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        names
    };
    let before = (entries(), s.vmlet_domains().unwrap());
    let (config, logs) = pod_config_under(&parent, "smallpod");
    let refused = cri.run_pod(&config, "vmlet").await;
    let message = format!("{:#}", refused.as_ref().map(|_| ()).unwrap_err());
    println!("refused: {message}");
    for part in ["allows 64 MiB", "RuntimeClass", "overhead.podFixed"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert_eq!(
        (entries(), s.vmlet_domains().unwrap()),
        before,
        "the refused pod left state or a domain"
    );
    let _ = std::fs::remove_dir_all(&logs);
    remove_pod_cgroups(&parent);
}

/// A container whose memory limit would grow its pod's VM past what the pod's cgroup allows
/// (a kubelet raises the pod's cgroup before it raises a container's limit) is refused,
/// naming the sizes, instead of QEMU growing into the node's OOM killer; the VM keeps its
/// size and the pod's other containers run on.
#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_container_limit_that_would_outgrow_the_pods_cgroup_is_refused_by_name() {
    let s = stack();
    let mut cri = vmlet_integration::cri::Cri::connect(&s.containerd)
        .await
        .unwrap();
    let parent = format!("/vmlet-e2e/pod-{}", unique_id("grow"));
    // Room for the node's default VM (256 MiB), not for one grown to a 1 GiB container.
    limit_memory(&parent, 512 << 20);
    let (config, logs) = pod_config_under(&parent, "growpod");
    let pod = cri.run_pod(&config, "vmlet").await.unwrap();
    let sleep = ["sleep", "1000"];
    let refused = cri
        .create_and_start_limited(&pod, &config, "big", &s.image, &sleep, 1 << 30)
        .await;
    let small = cri
        .create_and_start_limited(&pod, &config, "small", &s.image, &sleep, 64 << 20)
        .await;
    let meminfo = match &small {
        Ok(id) => cri.exec_sync(id, &["cat", "/proc/meminfo"], 30).await.ok(),
        Err(_) => None,
    };
    cri.remove_pod(&pod).await.unwrap();
    let _ = std::fs::remove_dir_all(&logs);
    remove_pod_cgroups(&parent);

    let message = format!("{:#}", refused.as_ref().map(|_| ()).unwrap_err());
    println!("refused: {message}");
    for part in ["allows 512 MiB", "RuntimeClass", "overhead.podFixed"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    small.expect("a container that fits the VM starts after the refusal");
    let meminfo = text(&meminfo.expect("/proc/meminfo of the pod's guest").stdout);
    let total_mib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("MemTotal")
        / 1024;
    assert!(
        total_mib < 512,
        "the guest has {total_mib} MiB: it grew past its pod's cgroup"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn containerd_is_told_host_pids_not_the_guests() {
    let s = stack();
    let pod = unique_id("hostpid");
    // Processes in the guest with PIDs that are the host's init and a host process.
    s.run_detached(
        &pod,
        &["sh", "-c", "sleep 1000 & sleep 1001 & exec sleep 1002"],
    )
    .unwrap();
    let qemu = pids_of(&s, &["qemu-system", &format!("guest=vmlet-{pod},")]);
    let listed = s.ctr_output(&["task", "ls"]).unwrap();
    let pid = text(&listed.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pod.as_str()))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_default();
    // `ctr task ps` (containerd's Pids, what `nerdctl top` looks up on the host).
    let ps = s.ctr_output(&["task", "ps", &pod]).unwrap();
    let ps_pids: Vec<String> = text(&ps.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    s.kill_and_remove(&pod).unwrap();
    assert_eq!(qemu.len(), 1, "one QEMU for {pod}");
    assert_eq!(pid, qemu[0].to_string(), "the task's PID is not its QEMU's");
    assert!(ps.status.success(), "ctr task ps: {}", text(&ps.stderr));
    assert_eq!(
        ps_pids,
        vec![qemu[0].to_string()],
        "ctr task ps shows PIDs other than the pod's QEMU's:\n{}",
        text(&ps.stdout)
    );
}

/// Starts a process that looks like the virtiofsd of the share `share` by its command line
/// (`exec -a virtiofsd ... -o source=SHARE`), as `uid` (none: as root), which lives until
/// it is killed (a shell reading its stdin, a pipe of the test's: no child is left to hold
/// the test's output).
fn decoy_virtiofsd(share: &str, uid: Option<u32>) -> std::process::Child {
    let mut command = std::process::Command::new("setpriv");
    if let Some(uid) = uid {
        command.args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
        ]);
    }
    command
        .args([
            "bash",
            "-c",
            "exec -a virtiofsd bash -c 'read -r _' virtiofsd --fd=3 -o \"source=$1\"",
            "decoy",
            share,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start a decoy virtiofsd")
}

/// A local user's decoy virtiofsd (its command line names the pod's share before the pod
/// boots: a ctr pod's id is known beforehand) is not taken for the pod's: it stays in its
/// own cgroup, the pod's own virtiofsd joins the pod's cgroup, and the pod runs on once
/// the decoys are gone. Root's decoy (another executable) is not taken either.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_decoy_virtiofsd_is_neither_moved_nor_fatal() {
    let s = stack();
    let pod = unique_id("decoy");
    let parent = format!("/vmlet-e2e/{pod}");
    let share = format!("{}/state/{pod}/share", s.dir);
    let mut decoys = [
        decoy_virtiofsd(&share, Some(65534)),
        decoy_virtiofsd(&share, None),
    ];
    // The decoys are running (their command lines set) before the pod starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    let decoy_pids: Vec<u32> = decoys.iter().map(|d| d.id()).collect();
    while pids_of(&s, &["virtiofsd", &share]).len() < 2 {
        assert!(Instant::now() < deadline, "the decoys did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before: Vec<Vec<String>> = decoy_pids.iter().map(|p| cgroups_of(*p)).collect();

    let started = s.run_detached_with(&pod, &["--cgroup", &parent], &["sleep", "1000"]);
    let real: Vec<u32> = pids_of(&s, &["virtiofsd", &share])
        .into_iter()
        .filter(|p| !decoy_pids.contains(p))
        .collect();
    let after: Vec<Vec<String>> = decoy_pids.iter().map(|p| cgroups_of(*p)).collect();
    let real_cgroups: Vec<Vec<String>> = real.iter().map(|p| cgroups_of(*p)).collect();
    for decoy in decoys.iter_mut() {
        let _ = decoy.kill();
        let _ = decoy.wait();
    }
    let answer = started
        .as_ref()
        .ok()
        .map(|()| s.ctr_output(&["task", "exec", "--exec-id", "after", &pod, "echo", "alive"]));
    let _ = s.kill_and_remove(&pod);
    remove_pod_cgroups(&parent);

    started.expect("the pod boots beside the decoys");
    assert_eq!(before, after, "a decoy virtiofsd was moved");
    for (decoy, lines) in decoy_pids.iter().zip(&after) {
        assert!(
            lines.iter().all(|l| !l.contains(&parent)),
            "decoy {decoy} is in the pod's cgroup: {lines:?}"
        );
    }
    println!("decoys {decoy_pids:?} stayed in {after:?}; the pod's virtiofsd {real:?} is in {real_cgroups:?}");
    assert!(
        !real.is_empty(),
        "no virtiofsd of the pod's besides the decoys"
    );
    for lines in &real_cgroups {
        for line in lines {
            assert!(
                line.ends_with(&parent),
                "the pod's virtiofsd is not in the pod's cgroup {parent}: {line}"
            );
        }
    }
    let answer = answer.unwrap().unwrap();
    assert_eq!(
        text(&answer.stdout).trim(),
        "alive",
        "the pod does not answer after the decoys ended: {}",
        text(&answer.stderr)
    );
}

/// A privileged container that moves its processes into a cgroup of its own below its
/// container's, and enables controllers there (so its container's cgroup may hold no
/// process): an exec joins its init's cgroup, as runc puts it, and removing the container
/// ends what runs below and removes those cgroups too, the pod going on.
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn a_container_that_makes_cgroups_of_its_own_is_still_execd_and_removed_whole() {
    let s = stack();
    let pod = unique_id("cgtree");
    run_in_pod(&s, &pod, "sandbox", &pod, &[], &["sleep", "1000"]).unwrap();
    let nested = unique_id("nested");
    // The cgroup2 it mounts is its own cgroup (its cgroup namespace's root). Enabling a
    // controller fails while a process is there (the test's probe, an exec): tried again.
    let script = "mkdir /tmp/cg && mount -t cgroup2 none /tmp/cg && mkdir /tmp/cg/leaf && \
                  echo $$ > /tmp/cg/leaf/cgroup.procs && \
                  until echo +pids 2>/dev/null > /tmp/cg/cgroup.subtree_control; do sleep 0.1; done && \
                  touch /tmp/moved; sleep 1000 & exec sleep 1001";
    let started = run_in_pod(
        &s,
        &nested,
        "container",
        &pod,
        &["--privileged"],
        &["sh", "-c", script],
    );
    let exec = |exec_id: &str, command: &[&str]| {
        let mut args = vec!["task", "exec", "--exec-id", exec_id, nested.as_str()];
        args.extend_from_slice(command);
        s.ctr_output(&args).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.is_ok()
        && !exec("probe", &["test", "-e", "/tmp/moved"])
            .status
            .success()
    {
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let moved = started
        .as_ref()
        .ok()
        .map(|()| exec("where", &["cat", "/proc/self/cgroup"]));
    let removed = s.kill_and_remove(&nested);
    let console_log = Path::new(&s.dir)
        .join("state")
        .join(&pod)
        .join("log/console.log");
    let console = std::fs::read_to_string(&console_log).unwrap_or_default();
    let after = s.ctr_output(&["task", "exec", "--exec-id", "after", &pod, "true"]);
    let _ = s.kill_and_remove(&pod);

    started.expect("the container starts");
    let moved = moved.unwrap();
    assert_eq!(
        text(&moved.stdout).trim(),
        "0::/leaf",
        "the exec is not in its init's cgroup: {}",
        text(&moved.stderr)
    );
    removed.expect("the container is removed");
    let warned: Vec<&str> = console
        .lines()
        .filter(|l| l.contains(&format!("container {nested}:")))
        .collect();
    assert!(
        warned.is_empty(),
        "the agent could not remove it: {warned:?}"
    );
    assert!(
        after.unwrap().status.success(),
        "the pod does not go on after the container's removal"
    );
}
