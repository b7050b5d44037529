//! `make bench-start`: cold start of a vmlet task beside the floor, measured in the same run.
//!
//! - vmlet: median wall time of 5 cold `ctr run --rm --runtime io.containerd.vmlet.v2 IMAGE ID true`;
//! - floor: median of 5 runs of QEMU started directly (no libvirt, no shim) on the same
//!   kernel and initramfs, with its own vhost-device-vsock, until the agent answers a ping,
//!   then powered off through the agent.
//!
//! Prints both, and the ratio; then where the time goes: the median of each phase the shim
//! logged for the vmlet runs (`phases of create|start ...` in containerd's log, see
//! `vmlet_shim::phases`), what is left outside the shim (containerd, ctr, the teardown), and
//! the floor's phases. Nothing is asserted.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmlet_integration::{unique_id, Stack};
use vmlet_protocol::agent::ShutdownRequest;
use vmlet_shim::vm::connect_agent;
use vmlet_shim::vsock::Endpoint;

const RUNS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One cold `ctr run --rm`: its wall time and the task's id.
fn vmlet_once(stack: &Stack) -> anyhow::Result<(Duration, String)> {
    let id = unique_id("bench");
    let start = Instant::now();
    let out = stack.run(&id, &[], &["true"])?;
    if !out.status.success() {
        bail!("ctr run: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((start.elapsed(), id))
}

/// Milliseconds of each phase, by name, one entry per run.
type PhaseRuns = BTreeMap<String, Vec<u64>>;

/// The phases the shim logged for the create and the start of task `id`, from `log`
/// (containerd's, where the shim's log goes): `("create"|"start", phase, ms)`.
fn shim_phases(log: &str, id: &str) -> Vec<(&'static str, String, u64)> {
    let mut found = Vec::new();
    for line in log.lines() {
        let Some((what, phases)) = vmlet_shim::phases::parse(line) else {
            continue;
        };
        let kind = if what == format!("create {id}") {
            "create"
        } else if what == format!("start task {id}") {
            "start"
        } else {
            continue;
        };
        found.extend(phases.into_iter().map(|(p, ms)| (kind, p, ms)));
    }
    found
}

/// "name ms, name ms, ..." of each phase's median, in `order`.
fn medians(runs: &PhaseRuns, order: &[String]) -> String {
    order
        .iter()
        .filter_map(|p| {
            let v = runs.get(p)?;
            let mut v = v.clone();
            v.sort();
            Some(format!("{p} {}", v[v.len() / 2]))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The phases of both kinds in the order the shim logged them (the last run's).
fn print_vmlet_phases(stack: &Stack, runs: &[(Duration, String)]) -> anyhow::Result<()> {
    let log_path = format!("{}/containerd/containerd.log", stack.dir);
    let log = std::fs::read_to_string(&log_path).with_context(|| format!("read {log_path}"))?;
    let mut by_kind: BTreeMap<&str, (PhaseRuns, Vec<String>)> = BTreeMap::new();
    let mut outside = Vec::new();
    for (wall, id) in runs {
        let phases = shim_phases(&log, id);
        if phases.is_empty() {
            bail!("no phases of {id} in {log_path}");
        }
        let mut in_shim = 0;
        for (kind, phase, ms) in phases {
            let (runs, order) = by_kind.entry(kind).or_default();
            if !order.contains(&phase) {
                order.push(phase.clone());
            }
            if phase == "total" {
                in_shim += ms;
            }
            runs.entry(phase).or_default().push(ms);
        }
        outside.push(Duration::from_millis(
            (wall.as_millis() as u64).saturating_sub(in_shim),
        ));
    }
    for (kind, (runs, order)) in &by_kind {
        println!(
            "bench-start: vmlet {kind} phases (median ms): {}",
            medians(runs, order)
        );
    }
    println!(
        "bench-start: vmlet outside the create and start (containerd, ctr, delete and teardown) median {} ms",
        median(outside).as_millis()
    );
    Ok(())
}

/// One floor run: its wall time and its phases (ms).
async fn floor_once(
    guest_dir: &str,
    qemu: &str,
    vsock_bin: &str,
) -> anyhow::Result<(Duration, Vec<(String, u64)>)> {
    let dir = std::env::temp_dir().join(unique_id("vmlet-floor"));
    std::fs::create_dir_all(&dir)?;
    let result = floor_in(&dir, guest_dir, qemu, vsock_bin).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn floor_in(
    dir: &Path,
    guest_dir: &str,
    qemu: &str,
    vsock_bin: &str,
) -> anyhow::Result<(Duration, Vec<(String, u64)>)> {
    let vhost = dir.join("vhost.sock");
    let uds = dir.join("vsock.sock");
    let start = Instant::now();
    let mut vsock = Command::new(vsock_bin)
        .arg("--vm")
        .arg(format!(
            "guest-cid=3,socket={},uds-path={}",
            vhost.display(),
            uds.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start vhost-device-vsock")?;
    while !vhost.exists() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut phases = Vec::new();
    let mut last = start;
    let mut mark = |phase: &str| {
        let now = Instant::now();
        phases.push((phase.to_owned(), (now - last).as_millis() as u64));
        last = now;
    };
    mark("vsock_backend");
    let mut vm = Command::new(qemu)
        .args([
            "-machine",
            "q35,accel=tcg",
            "-m",
            "256",
            "-smp",
            "1",
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
        ])
        .args([
            "-object",
            "memory-backend-memfd,id=mem,size=256M,share=on",
            "-numa",
            "node,memdev=mem",
        ])
        .arg("-chardev")
        .arg(format!("socket,id=vs,path={}", vhost.display()))
        .args(["-device", "vhost-user-vsock-pci,chardev=vs"])
        .arg("-serial")
        .arg(format!("file:{}", dir.join("console.log").display()))
        .arg("-kernel")
        .arg(format!("{guest_dir}/vmlinuz"))
        .arg("-initrd")
        .arg(format!("{guest_dir}/initrd.img"))
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start qemu")?;
    let endpoint = Endpoint::Hybrid { uds };
    let console = dir.join("console.log");
    let client = match connect_agent(&endpoint, Duration::from_secs(60), Some(&console)).await {
        Ok((client, _)) => client,
        Err(e) => {
            let _ = vm.kill();
            let _ = vsock.kill();
            bail!("{}", e.message());
        }
    };
    mark("guest_boot");
    let _ = client
        .shutdown(
            ttrpc::context::with_timeout(2_000_000_000),
            &ShutdownRequest::default(),
        )
        .await;
    let _ = tokio::task::spawn_blocking(move || vm.wait()).await;
    mark("power_off");
    let elapsed = start.elapsed();
    let _ = vsock.kill();
    let _ = vsock.wait();
    Ok((elapsed, phases))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let stack = Stack::from_env()?;
    let qemu = "/usr/bin/qemu-system-x86_64";
    let vsock_bin = "/usr/local/bin/vhost-device-vsock";
    let mut vmlet_runs = Vec::new();
    let mut floor = Vec::new();
    let mut floor_phases = PhaseRuns::new();
    let mut floor_order = Vec::new();
    for i in 0..RUNS {
        let (f, phases) = floor_once(&stack.guest_dir, qemu, vsock_bin).await?;
        let s = stack.clone();
        let (v, id) = tokio::task::spawn_blocking(move || vmlet_once(&s)).await??;
        println!(
            "run {}: vmlet {:.3} s, floor {:.3} s",
            i + 1,
            v.as_secs_f64(),
            f.as_secs_f64()
        );
        vmlet_runs.push((v, id));
        floor.push(f);
        for (phase, ms) in phases {
            if !floor_order.contains(&phase) {
                floor_order.push(phase.clone());
            }
            floor_phases.entry(phase).or_default().push(ms);
        }
    }
    let vmlet: Vec<Duration> = vmlet_runs.iter().map(|(v, _)| *v).collect();
    let (v, f) = (median(vmlet), median(floor));
    println!(
        "bench-start: vmlet ctr run --rm true median {:.3} s",
        v.as_secs_f64()
    );
    println!("bench-start: floor (direct QEMU, same kernel+initramfs, until agent ping, power off) median {:.3} s", f.as_secs_f64());
    println!(
        "bench-start: ratio {:.2} (target <= 1.5)",
        v.as_secs_f64() / f.as_secs_f64()
    );
    print_vmlet_phases(&stack, &vmlet_runs)?;
    println!(
        "bench-start: floor phases (median ms): {}",
        medians(&floor_phases, &floor_order)
    );
    idle_pod_memory(&stack)
}

/// Host memory of one idle pod (default 256 MiB guest): the RSS of its QEMU, virtiofsd,
/// vhost-device-vsock and shim, measured a few seconds after it started.
fn idle_pod_memory(stack: &Stack) -> anyhow::Result<()> {
    let id = unique_id("idle");
    let run = stack.ctr_output(&[
        "run",
        "-d",
        "--runtime",
        vmlet_integration::RUNTIME,
        &stack.image,
        &id,
        "sleep",
        "1000",
    ])?;
    if !run.status.success() {
        bail!("ctr run -d: {}", String::from_utf8_lossy(&run.stderr));
    }
    let measured = (|| {
        stack.wait_status(&id, "RUNNING", Duration::from_secs(90))?;
        std::thread::sleep(Duration::from_secs(3));
        let pids: Vec<u32> = stack
            .pod_processes(&id)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let ticks = || {
            pids.iter()
                .map(|p| vmlet_integration::cpu_ticks(*p))
                .sum::<u64>()
        };
        let before = ticks();
        std::thread::sleep(Duration::from_secs(5));
        // Clock ticks are 1/100 s on Linux: ticks over 5 s / 500 = cores.
        let idle_cores = (ticks() - before) as f64 / 500.0;
        println!(
            "bench-start: idle pod host CPU: {:.0} millicores",
            idle_cores * 1000.0
        );
        let mut parts = Vec::new();
        for (pid, cmdline) in stack.pod_processes(&id) {
            let name = [
                "qemu-system",
                "virtiofsd",
                "vhost-device-vsock",
                "containerd-shim-vmlet",
            ]
            .into_iter()
            .find(|n| cmdline.contains(n))
            .unwrap_or("other");
            parts.push((
                name,
                vmlet_integration::rss_kib(pid),
                vmlet_integration::pss_kib(pid),
            ));
        }
        Ok::<_, anyhow::Error>(parts)
    })();
    let _ = stack.kill_and_remove(&id);
    let parts = measured?;
    // RSS counts a page every process that maps it; PSS shares it among them (issue 14's
    // measure: their sum is what the pod costs the host).
    for (measure, pick) in [
        ("RSS", (|p| p.1) as fn(&(&str, u64, u64)) -> u64),
        ("PSS", |p| p.2),
    ] {
        let total: u64 = parts.iter().map(pick).sum();
        let detail: Vec<String> = parts
            .iter()
            .map(|p| format!("{} {} MiB", p.0, pick(p) / 1024))
            .collect();
        println!(
            "bench-start: idle pod host memory ({measure}, 256 MiB guest): {} MiB ({})",
            total / 1024,
            detail.join(", ")
        );
    }
    Ok(())
}
