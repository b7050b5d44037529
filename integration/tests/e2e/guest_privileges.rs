//! Inside the guest, defence in depth as runc gives it: a container process has the spec's
//! capabilities, `no_new_privileges`, masked and read-only paths, and runs under the spec's
//! seccomp profile (compiled by the shim, installed by the agent), execs included; through
//! `ctr` and through CRI (where `no_new_privileges` is off, so the filter goes in before the
//! capabilities drop). Run by `make test`.

use crate::support::{stack, text};
use vmlet_integration::unique_id;

/// The default capability set containerd gives a container (CAP_CHOWN, DAC_OVERRIDE,
/// FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT,
/// MKNOD, AUDIT_WRITE, SETFCAP): no CAP_SYS_ADMIN.
const DEFAULT_CAPS: &str = "00000000a80425fb";

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn containers_get_the_specs_privileges_and_paths() {
    let s = stack();
    // What a root container may do in the guest: no more than the spec gives it.
    let probe = "grep -E '^(CapBnd|CapEff|CapPrm|NoNewPrivs)' /proc/self/status; \
                 mkdir -p /mnt/t; mount -t tmpfs probe /mnt/t 2>/dev/null && echo MOUNTED; \
                 echo KEYS $(stat -c %t:%T /proc/keys); \
                 echo x 2>/dev/null > /proc/sys/kernel/domainname && echo WROTE_PROC_SYS; \
                 [ -c /dev/vsock ] && [ -c /dev/ttyS0 ] && echo GUEST_DEVICES; \
                 echo probed";
    let out = s
        .run(&unique_id("caps"), &[], &["sh", "-c", probe])
        .unwrap();
    let said = text(&out.stdout);
    assert!(said.contains("probed"), "{said}{}", text(&out.stderr));
    for set in ["CapBnd", "CapEff", "CapPrm"] {
        let line = format!("{set}:\t{DEFAULT_CAPS}");
        assert!(said.contains(&line), "{set} is not the spec's:\n{said}");
    }
    assert!(
        said.contains("NoNewPrivs:\t1"),
        "no_new_privileges:\n{said}"
    );
    assert!(
        !said.contains("MOUNTED"),
        "a default container mounted:\n{said}"
    );
    assert!(
        said.contains("KEYS 1:3"),
        "/proc/keys (a masked path) is not masked:\n{said}"
    );
    assert!(
        !said.contains("WROTE_PROC_SYS"),
        "/proc/sys is writable:\n{said}"
    );
    assert!(
        !said.contains("GUEST_DEVICES"),
        "a default container has the guest's devices:\n{said}"
    );

    // Privileged, as runc makes one: every capability, mounts work, /proc and /sys are not
    // masked or read-only, and every device of the guest (as runc gives the host's).
    let out = s
        .run(
            &unique_id("privcaps"),
            &["--privileged"],
            &["sh", "-c", probe],
        )
        .unwrap();
    let said = text(&out.stdout);
    // containerd lists every capability its host has (this host has no CAP_SYS_RESOURCE).
    let effective = said
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:\t"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no CapEff:\n{said}"));
    const CAP_SYS_ADMIN: u32 = 21;
    assert!(effective & (1 << CAP_SYS_ADMIN) != 0, "{said}");
    assert!(
        effective.count_ones() > 30,
        "a privileged container's set:\n{said}"
    );
    assert!(
        said.contains("MOUNTED"),
        "a privileged container cannot mount:\n{said}"
    );
    assert!(
        !said.contains("KCORE 1:3") && said.contains("WROTE_PROC_SYS"),
        "a privileged container's /proc is masked or read-only:\n{said}"
    );
    assert!(
        said.contains("GUEST_DEVICES"),
        "a privileged container lacks the guest's devices:\n{said}"
    );
}

/// A profile that allows everything but making directories (EACCES instead of EPERM, so
/// the refusal is the filter's) and `chmod` to mode 0777 (a condition on an argument).
const PROFILE: &str = r#"{
  "defaultAction": "SCMP_ACT_ALLOW",
  "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
  "syscalls": [
    {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
    {"names": ["chmod"], "action": "SCMP_ACT_ERRNO",
     "args": [{"index": 1, "value": 511, "op": "SCMP_CMP_EQ"}]},
    {"names": ["fchmodat"], "action": "SCMP_ACT_ERRNO",
     "args": [{"index": 2, "value": 511, "op": "SCMP_CMP_EQ"}]}
  ]
}"#;

const PROBE: &str = "grep -E '^(Seccomp|NoNewPrivs)' /proc/self/status; \
                     mkdir /tmp/d 2>&1; touch /tmp/f; chmod 755 /tmp/f && echo CHMOD_755; \
                     chmod 777 /tmp/f 2>&1; echo probed";

fn assert_filtered(said: &str) {
    assert!(said.contains("probed"), "{said}");
    assert!(said.contains("Seccomp:\t2"), "no filter:\n{said}");
    assert!(
        said.contains("Permission denied"),
        "mkdir was not refused with the profile's errno:\n{said}"
    );
    assert!(said.contains("CHMOD_755"), "{said}");
    assert!(
        said.contains("Operation not permitted"),
        "chmod 777 was not refused:\n{said}"
    );
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn the_specs_seccomp_profile_filters_the_container_and_its_execs() {
    let s = stack();
    let dir = std::env::temp_dir().join(unique_id("vmlet-seccomp"));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("profile.json");
    std::fs::write(&profile, PROFILE).unwrap();
    let id = unique_id("seccomp");
    s.run_detached_with(
        &id,
        &["--seccomp", "--seccomp-profile", &profile.to_string_lossy()],
        &[
            "sh",
            "-c",
            &format!("{{ {PROBE}; }} >/tmp/probe; sleep 1000"),
        ],
    )
    .unwrap();
    let read = |exec: &str, command: &str| {
        let out = s
            .ctr_output(&["task", "exec", "--exec-id", exec, &id, "sh", "-c", command])
            .unwrap();
        text(&out.stdout) + &text(&out.stderr)
    };
    let mut init = String::new();
    for _ in 0..50 {
        init = read(&unique_id("cat"), "cat /tmp/probe");
        if init.contains("probed") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    println!("container under the profile:\n{init}");
    assert_filtered(&init);
    let exec = read("probe", PROBE);
    println!("exec under the profile:\n{exec}");
    assert_filtered(&exec);
    s.kill_and_remove(&id).unwrap();

    // containerd's default profile: unshare is for CAP_SYS_ADMIN only.
    let out = s
        .run(
            &unique_id("default-seccomp"),
            &["--seccomp"],
            &[
                "sh",
                "-c",
                "grep ^Seccomp: /proc/self/status; unshare -U true 2>&1; echo probed",
            ],
        )
        .unwrap();
    let said = text(&out.stdout);
    println!("default profile:\n{said}");
    assert!(said.contains("Seccomp:\t2"), "{said}");
    assert!(said.contains("Operation not permitted"), "{said}");
    // Without a profile, no filter.
    let out = s
        .run(
            &unique_id("no-seccomp"),
            &[],
            &["grep", "^Seccomp:", "/proc/self/status"],
        )
        .unwrap();
    assert!(
        text(&out.stdout).contains("Seccomp:\t0"),
        "{}",
        text(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
#[ignore = "needs the vmlet stack: make test"]
async fn a_cri_container_runs_under_the_runtime_default_profile() {
    use k8s_cri::v1::{security_profile::ProfileType, SecurityProfile};
    use vmlet_integration::cri::Cri;

    let s = stack();
    let mut cri = Cri::connect(&s.containerd).await.unwrap();
    let logs = std::env::temp_dir().join(unique_id("vmlet-seccomp-logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let config = Cri::pod_config(
        &unique_id("seccomp-pod"),
        &unique_id("uid"),
        &logs.to_string_lossy(),
    );
    let pod = cri.run_pod(&config, "vmlet").await.unwrap();
    let mut container = Cri::container_config(&config, "filtered", &s.image, &["sleep", "1000"], 0);
    let context = container
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .unwrap();
    context.seccomp = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        ..Default::default()
    });
    let id = cri
        .create_and_start_config(&pod, &config, container)
        .await
        .unwrap();
    let out = cri
        .exec_sync(
            &id,
            &["sh", "-c", "grep -E '^(Seccomp|NoNewPrivs)' /proc/self/status; unshare -U true 2>&1; echo probed"],
            30,
        )
        .await
        .unwrap();
    let said = text(&out.stdout) + &text(&out.stderr);
    println!("CRI RuntimeDefault:\n{said}");
    assert!(said.contains("probed"), "{said}");
    assert!(said.contains("NoNewPrivs:\t0"), "{said}");
    assert!(said.contains("Seccomp:\t2"), "{said}");
    assert!(said.contains("Operation not permitted"), "{said}");
    cri.remove_pod(&pod).await.unwrap();
    let _ = std::fs::remove_dir_all(&logs);
}

/// The spec's paths are resolved beneath the container's rootfs, as runc resolves them: a
/// volume whose destination goes through the image's `/vmlet-root-link -> /` lands in the
/// container's own `/etc` (where the container sees it), not in the guest's (where the
/// agent would otherwise make its mount point and mount it).
#[test]
#[ignore = "needs the vmlet stack: make test"]
fn spec_paths_through_the_images_links_stay_in_the_rootfs() {
    let s = stack();
    let volume = std::path::PathBuf::from(&s.dir).join(unique_id("linkvol"));
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::write(volume.join("canary"), "through-the-link\n").unwrap();
    let mount = format!(
        "type=bind,src={},dst=/vmlet-root-link/etc/vmlet-through-link,options=rbind:ro",
        volume.display()
    );
    let out = s
        .run(
            &unique_id("links"),
            &["--mount", &mount],
            &[
                "sh",
                "-c",
                "cat /etc/vmlet-through-link/canary; cat /proc/self/mountinfo",
            ],
        )
        .unwrap();
    std::fs::remove_dir_all(&volume).unwrap();
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.starts_with("through-the-link\n"),
        "the volume is not at the container's /etc/vmlet-through-link:\n{said}"
    );
    assert!(
        said.contains(" /etc/vmlet-through-link "),
        "mounted elsewhere:\n{said}"
    );
}
