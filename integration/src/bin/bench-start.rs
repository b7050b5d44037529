//! `make bench-start`: cold start of a vmlet task beside the floor, measured in the same run.
//!
//! - vmlet: median wall time of 5 cold `ctr run --rm --runtime io.containerd.vmlet.v2 IMAGE ID true`
//!   under the node config's default launcher (`auto`: without libvirt where the shim confines
//!   QEMU itself, as on the stack);
//! - floor: median of 5 runs of QEMU started directly (no libvirt, no shim) on the same
//!   kernel and initramfs, with its own vhost-device-vsock, until the agent answers a ping,
//!   then powered off through the agent.
//! - runc: median of 5 `ctr run --rm ... true` of the same image under runc, on the same
//!   containerd: vmlet's own time is vmlet's less the floor's less runc's (the medians'),
//!   printed beside the median of each run's own difference (the runs take turns, so that
//!   the machine's drift over the runs cancels out of that one) and their spread.
//! - kernels: boot to the agent's answer (the floor's `guest_boot`) of the lean kernel and of
//!   the Debian cloud kernel (`VMLET_CLOUD_GUEST_DIR`, which `scripts/stack` builds), both with
//!   the cloud image's initramfs (the lean kernel finds no module list for its release in it
//!   and loads nothing).
//!
//! - template: with `templates.enabled`, the median of 5 `ctr run --rm ... true` started from
//!   the template the first pod of the shape saved, beside the cold start and the floor; and
//!   an idle pod's PSS started so, beside a cold one's. Then the same start for a pod with a
//!   network (`--with-ns network:...`, a namespace as CNI's bridge plugin sets it up), from a
//!   template and cold.
//!
//! - through libvirt: with `launcher = "libvirt"`, the median of 5 cold `ctr run --rm ... true`
//!   (and vmlet's own time so), then the median of 5 started from a template, beside that cold
//!   start and the floor, and vmlet's phases.
//!
//! Prints each, and the ratios; then where the time goes: the median of each phase the shim
//! logged for the vmlet runs (`phases of create|start ...` in containerd's log, see
//! `vmlet_shim::task::phases`), what is left outside the shim (containerd, ctr, the teardown), and
//! the floor's phases. Nothing is asserted.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmlet_integration::direct_vm::{DirectVm, Guest, Launch};
use vmlet_integration::figures::figure;
use vmlet_integration::testnet::TestNet;
use vmlet_integration::{libvirt_launcher, unique_id, Stack, TemplatesOn, RUNTIME};
use vmlet_protocol::agent::ShutdownRequest;

const RUNS: usize = 5;
/// The baseline runtime: runc, on the same containerd.
const RUNC: &str = "io.containerd.runc.v2";

fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

/// One cold `ctr run --rm --runtime RUNTIME IMAGE ID true`: its wall time and the task's id.
/// Under runc it is what containerd and `ctr` cost without a VM.
fn run_once(stack: &Stack, runtime: &str) -> anyhow::Result<(Duration, String)> {
    run_once_with(stack, runtime, &[])
}

/// [`run_once`] with `extra` options of `ctr run` (`--with-ns network:...`).
fn run_once_with(
    stack: &Stack,
    runtime: &str,
    extra: &[&str],
) -> anyhow::Result<(Duration, String)> {
    let id = unique_id("bench");
    let start = Instant::now();
    let mut args = vec!["run", "--rm", "--runtime", runtime];
    args.extend_from_slice(extra);
    args.extend([stack.image.as_str(), &id, "true"]);
    let out = stack.ctr_output(&args)?;
    if !out.status.success() {
        bail!(
            "ctr run ({runtime}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((start.elapsed(), id))
}

/// Milliseconds of each phase over the runs, the phases in the order they were first seen.
#[derive(Default)]
struct PhaseTable {
    order: Vec<String>,
    runs: BTreeMap<String, Vec<u64>>,
}

impl PhaseTable {
    fn push(&mut self, phase: &str, ms: u64) {
        if !self.runs.contains_key(phase) {
            self.order.push(phase.to_owned());
        }
        self.runs.entry(phase.to_owned()).or_default().push(ms);
    }

    /// "name ms, name ms, ..." of each phase's median.
    fn medians(&self) -> String {
        self.order
            .iter()
            .map(|p| format!("{p} {}", median(self.runs[p].clone())))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Prints the median of each phase the shim logged for the runs' creates and starts (read
/// from containerd's log, where the shim's log goes) and of what was spent outside them.
fn print_vmlet_phases(stack: &Stack, runs: &[(Duration, String)]) -> anyhow::Result<()> {
    let log_path = format!("{}/containerd/containerd.log", stack.dir);
    let log = std::fs::read_to_string(&log_path).with_context(|| format!("read {log_path}"))?;
    // Each phases line by what it times (`create ID`, `start task ID`).
    let logged: HashMap<String, Vec<(String, u64)>> = log
        .lines()
        .filter_map(vmlet_shim::task::phases::parse)
        .collect();
    let mut tables: BTreeMap<&str, PhaseTable> = BTreeMap::new();
    let mut outside = Vec::new();
    for (wall, id) in runs {
        let mut in_shim = 0;
        for kind in ["create", "start"] {
            let what = match kind {
                "create" => format!("create {id}"),
                _ => format!("start task {id}"),
            };
            let phases = logged
                .get(&what)
                .with_context(|| format!("no phases of {what} in {log_path}"))?;
            for (phase, ms) in phases {
                tables.entry(kind).or_default().push(phase, *ms);
                if phase == "total" {
                    in_shim += ms;
                }
            }
        }
        outside.push((wall.as_millis() as u64).saturating_sub(in_shim));
    }
    for (kind, table) in &tables {
        println!(
            "bench-start: vmlet {kind} phases (median ms): {}",
            table.medians()
        );
    }
    println!(
        "bench-start: vmlet outside the create and start (containerd, ctr, delete and teardown) median {} ms",
        median(outside)
    );
    Ok(())
}

/// One floor run: its wall time and its phases (ms).
async fn floor_once(guest: &Guest) -> anyhow::Result<(Duration, Vec<(String, u64)>)> {
    let start = Instant::now();
    let mut vm = DirectVm::new("vmlet-floor")?;
    let mut phases = Vec::new();
    let mut last = start;
    let mut mark = |phase: &str| {
        let now = Instant::now();
        phases.push((phase.to_owned(), (now - last).as_millis() as u64));
        last = now;
    };
    vm.start_vsock_backend().await?;
    mark("vsock_backend");
    vm.launch(
        guest,
        Launch {
            vsock_at_boot: true,
            ..Launch::default()
        },
    )?;
    let (client, _) = vm.agent(Duration::from_secs(60)).await?;
    mark("guest_boot");
    let _ = client
        .shutdown(
            ttrpc::context::with_timeout(2_000_000_000),
            &ShutdownRequest::default(),
        )
        .await;
    vm.wait_qemu().await?;
    mark("power_off");
    let elapsed = start.elapsed();
    drop(vm);
    Ok((elapsed, phases))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let stack = Stack::from_env()?;
    let guest = Guest::of_image(&stack.guest_dir)?;
    let mut vmlet_runs = Vec::new();
    let mut floor = Vec::new();
    let mut floor_phases = PhaseTable::default();
    let mut runc = Vec::new();
    for i in 0..RUNS {
        let (f, phases) = floor_once(&guest).await?;
        let s = stack.clone();
        let (v, id) = tokio::task::spawn_blocking(move || run_once(&s, RUNTIME)).await??;
        let s = stack.clone();
        let (r, _) = tokio::task::spawn_blocking(move || run_once(&s, RUNC)).await??;
        println!(
            "run {}: vmlet {:.3} s, floor {:.3} s, runc {:.3} s",
            i + 1,
            v.as_secs_f64(),
            f.as_secs_f64(),
            r.as_secs_f64()
        );
        vmlet_runs.push((v, id));
        floor.push(f);
        runc.push(r);
        for (phase, ms) in phases {
            floor_phases.push(&phase, ms);
        }
    }
    let vmlet: Vec<Duration> = vmlet_runs.iter().map(|(v, _)| *v).collect();
    let floor_runs = floor.clone();
    let (v, f) = (median(vmlet.clone()), median(floor));
    println!(
        "bench-start: vmlet ctr run --rm true median {:.3} s",
        v.as_secs_f64()
    );
    println!("bench-start: floor (direct QEMU, same kernel+initramfs, until agent ping, power off) median {:.3} s", f.as_secs_f64());
    println!(
        "bench-start: ratio {:.2} (target <= 1.10)",
        v.as_secs_f64() / f.as_secs_f64()
    );
    figure(
        "cold start, default launcher (ctr run --rm ... true)",
        format!("{:.2} s", v.as_secs_f64()),
        format!("floor {:.2} s", f.as_secs_f64()),
        Some(v.as_secs_f64() / f.as_secs_f64()),
        "<= 1.10",
    );
    // vmlet's own time: what its start adds to the VM's boot (the floor) and to what
    // containerd and ctr cost anyway (runc's run of the same image).
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let r = median(runc.clone());
    let (v_ms, f_ms, r_ms) = (ms(v), ms(f), ms(r));
    let own_ms = v_ms - f_ms - r_ms;
    println!(
        "bench-start: vmlet's own time: vmlet {v_ms:.0} ms - floor {f_ms:.0} ms - runc ctr run --rm {r_ms:.0} ms = {own_ms:.0} ms (target <= 300 ms)"
    );
    figure(
        "cold start, vmlet's own time (less floor, less runc)",
        format!("{own_ms:.0} ms"),
        format!("floor {f_ms:.0} ms, runc {r_ms:.0} ms"),
        None,
        "<= 300 ms",
    );
    paired_own_time(&vmlet, &floor_runs, &runc);
    print_vmlet_phases(&stack, &vmlet_runs)?;
    println!(
        "bench-start: floor phases (median ms): {}",
        floor_phases.medians()
    );
    compare_kernels(&guest).await?;
    let cold_pss = idle_pod_memory(&stack)?;
    template_starts(&stack, v, f, cold_pss).await?;
    starts_through_libvirt(&stack, v, f, r).await
}

/// vmlet's own time run by run (each run's vmlet less its floor less its runc, in ms), their
/// median and spread: beside the figure of the medians.
fn paired_own_time(vmlet: &[Duration], floor: &[Duration], runc: &[Duration]) {
    let mut own: Vec<i64> = vmlet
        .iter()
        .zip(floor)
        .zip(runc)
        .map(|((v, f), r)| v.as_millis() as i64 - f.as_millis() as i64 - r.as_millis() as i64)
        .collect();
    let runs = own
        .iter()
        .map(|ms| format!("{ms}"))
        .collect::<Vec<_>>()
        .join(", ");
    own.sort_unstable();
    let (low, high) = (own[0], own[own.len() - 1]);
    let paired = median(own);
    println!(
        "bench-start: vmlet's own time run by run (vmlet - floor - runc of the same run): {runs} ms; median {paired} ms"
    );
    figure(
        "cold start, vmlet's own time, median of each run's",
        format!("{paired} ms"),
        format!("runs {low} to {high} ms"),
        None,
        "<= 300 ms",
    );
}

/// RUNS `ctr run --rm ... true` (blocking, on a thread of their own).
async fn runs_of(stack: &Stack, n: usize) -> anyhow::Result<Vec<(Duration, String)>> {
    let s = stack.clone();
    tokio::task::spawn_blocking(move || (0..n).map(|_| run_once(&s, RUNTIME)).collect()).await?
}

/// With `launcher = "libvirt"` (a domain per pod): [`RUNS`] cold starts beside the default
/// launcher's (`cold`) and the floor, vmlet's own time so (less `runc`), and [`RUNS`] starts
/// from a template beside that cold start and the floor.
async fn starts_through_libvirt(
    stack: &Stack,
    cold: Duration,
    floor: Duration,
    runc: Duration,
) -> anyhow::Result<()> {
    let _libvirt = libvirt_launcher();
    let runs = runs_of(stack, RUNS).await?;
    let d = median(runs.iter().map(|(d, _)| *d).collect());
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let own_ms = ms(d) - ms(floor) - ms(runc);
    println!(
        "bench-start: through libvirt: cold start median {:.3} s (default launcher {:.3} s); vmlet's own time {:.0} - {:.0} - {:.0} = {own_ms:.0} ms",
        d.as_secs_f64(),
        cold.as_secs_f64(),
        ms(d),
        ms(floor),
        ms(runc)
    );
    figure(
        "cold start through libvirt (launcher = libvirt)",
        format!("{:.2} s", d.as_secs_f64()),
        format!(
            "default launcher {:.2} s, floor {:.2} s",
            cold.as_secs_f64(),
            floor.as_secs_f64()
        ),
        Some(d.as_secs_f64() / floor.as_secs_f64()),
        "beside the default's",
    );
    figure(
        "cold start through libvirt, vmlet's own time (less floor, less runc)",
        format!("{own_ms:.0} ms"),
        format!("floor {:.0} ms, runc {:.0} ms", ms(floor), ms(runc)),
        None,
        "beside the default's",
    );
    print_vmlet_phases(stack, &runs)?;
    let _templates = TemplatesOn::new("vmlet-bench-templates-libvirt")?;
    let first = runs_of(stack, 1).await?[0].0;
    let t = median(
        runs_of(stack, RUNS)
            .await?
            .into_iter()
            .map(|(d, _)| d)
            .collect(),
    );
    println!(
        "bench-start: through libvirt: template start median {:.3} s (the first pod of the shape, which booted and saved it: {:.3} s); against the floor {:.2}",
        t.as_secs_f64(),
        first.as_secs_f64(),
        t.as_secs_f64() / floor.as_secs_f64()
    );
    figure(
        "template start through libvirt (launcher = libvirt)",
        format!("{:.2} s", t.as_secs_f64()),
        format!(
            "cold through libvirt {:.2} s, floor {:.2} s",
            d.as_secs_f64(),
            floor.as_secs_f64()
        ),
        Some(t.as_secs_f64() / d.as_secs_f64()),
        "beside the default's",
    );
    Ok(())
}

/// With `templates.enabled` (in a directory of the run's own): the first pod of the
/// benchmark's shape boots and saves its template; then [`RUNS`] starts from it, beside
/// the cold start and the floor measured above, and an idle pod's memory beside a cold one's.
async fn template_starts(
    stack: &Stack,
    cold: Duration,
    floor: Duration,
    cold_pss_mib: u64,
) -> anyhow::Result<()> {
    let templates = TemplatesOn::new("vmlet-bench-templates")?;
    let s = stack.clone();
    let (first, _) = tokio::task::spawn_blocking(move || run_once(&s, RUNTIME)).await??;
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let s = stack.clone();
        runs.push(
            tokio::task::spawn_blocking(move || run_once(&s, RUNTIME))
                .await??
                .0,
        );
    }
    let t = median(runs);
    println!(
        "bench-start: template start ctr run --rm true median {:.3} s (the first pod of the shape, which booted and saved it: {:.3} s)",
        t.as_secs_f64(),
        first.as_secs_f64()
    );
    figure(
        "template start, default launcher (ctr run --rm ... true)",
        format!("{:.2} s", t.as_secs_f64()),
        format!(
            "cold {:.2} s, floor {:.2} s",
            cold.as_secs_f64(),
            floor.as_secs_f64()
        ),
        Some(t.as_secs_f64() / cold.as_secs_f64()),
        "<= 0.50 of cold, and <= the floor",
    );
    println!(
        "bench-start: template start against the floor: ratio {:.2} (target <= 1.00)",
        t.as_secs_f64() / floor.as_secs_f64()
    );
    let parts = measure_idle_pod(stack)?;
    print_memory(
        "PSS, from a template",
        parts.iter().map(|(n, _, pss)| (*n, *pss)),
    );
    let pss_mib = parts.iter().map(|(_, _, pss)| pss).sum::<u64>() / 1024;
    figure(
        "idle pod host memory (PSS), started from a template",
        format!("{pss_mib} MiB"),
        format!("cold {cold_pss_mib} MiB"),
        Some(pss_mib as f64 / cold_pss_mib as f64),
        "<= 1.00",
    );
    drop(templates);
    networked_template_starts(stack).await
}

/// A pod with a network (CNI's and nerdctl's, `ctr run --with-ns network:...` here, in a
/// namespace set up as the bridge plugin would): [`RUNS`] cold starts, then with
/// `templates.enabled` the first pod of the networked shape saving its template and
/// [`RUNS`] starts from it, each with its NIC plugged in after the load.
async fn networked_template_starts(stack: &Stack) -> anyhow::Result<()> {
    let net = TestNet::new("bench", 1500);
    let with_ns = format!("network:{}", net.pod_path().display());
    let runs = |n: usize| {
        let (s, with_ns) = (stack.clone(), with_ns.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Duration>> {
            (0..n)
                .map(|_| Ok(run_once_with(&s, RUNTIME, &["--with-ns", &with_ns])?.0))
                .collect()
        })
    };
    let cold = median(runs(RUNS).await??);
    let _templates = TemplatesOn::new("vmlet-bench-templates-net")?;
    let first = runs(1).await??[0];
    let t = median(runs(RUNS).await??);
    println!(
        "bench-start: with a network: cold start median {:.3} s, template start median {:.3} s (the first pod of the shape, which booted and saved it: {:.3} s)",
        cold.as_secs_f64(),
        t.as_secs_f64(),
        first.as_secs_f64()
    );
    figure(
        "template start with a network (ctr run --rm --with-ns ...)",
        format!("{:.2} s", t.as_secs_f64()),
        format!("cold with a network {:.2} s", cold.as_secs_f64()),
        Some(t.as_secs_f64() / cold.as_secs_f64()),
        "<= 0.50 of cold",
    );
    Ok(())
}

/// Boot to the agent's answer of vmlet's kernel and of the Debian cloud kernel, on the cloud
/// image's initramfs, alternating run by run.
async fn compare_kernels(guest: &Guest) -> anyhow::Result<()> {
    let cloud_dir = std::env::var("VMLET_CLOUD_GUEST_DIR").context(
        "VMLET_CLOUD_GUEST_DIR (the cloud kernel's image, from scripts/stack) is not set",
    )?;
    let cloud = Guest::of_image(&cloud_dir)?;
    if cloud.kernel == guest.kernel {
        println!("bench-start: kernels: vmlet's kernel is the cloud kernel; nothing to compare");
        return Ok(());
    }
    let ours = Guest {
        kernel: guest.kernel.clone(),
        initrd: cloud.initrd.clone(),
    };
    let boot_ms = |phases: Vec<(String, u64)>| {
        phases
            .into_iter()
            .find(|(p, _)| p == "guest_boot")
            .map(|(_, ms)| ms)
            .context("the floor measured no guest_boot")
    };
    let (mut lean, mut debian) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        lean.push(boot_ms(floor_once(&ours).await?.1)?);
        debian.push(boot_ms(floor_once(&cloud).await?.1)?);
    }
    let (l, d) = (median(lean), median(debian));
    println!(
        "bench-start: kernels: boot to agent (same initramfs) median: {} {l} ms, Debian cloud kernel {} {d} ms, ratio {:.2} (target <= 0.5)",
        guest.kernel.display(),
        cloud.kernel.display(),
        l as f64 / d as f64
    );
    figure(
        "lean kernel boot to agent",
        format!("{l} ms"),
        format!("cloud kernel {d} ms"),
        Some(l as f64 / d as f64),
        "<= 0.5",
    );
    Ok(())
}

/// Host memory of one idle pod (default 256 MiB guest, [`measure_idle_pod`]), printed;
/// returns its PSS (MiB).
fn idle_pod_memory(stack: &Stack) -> anyhow::Result<u64> {
    let parts = measure_idle_pod(stack)?;
    // RSS counts a page for every process that maps it; PSS shares it among them (issue
    // 14's measure: their sum is what the pod costs the host).
    print_memory("RSS", parts.iter().map(|(n, rss, _)| (*n, *rss)));
    print_memory("PSS", parts.iter().map(|(n, _, pss)| (*n, *pss)));
    let pss_mib = parts.iter().map(|(_, _, pss)| pss).sum::<u64>() / 1024;
    let shim_rss_mib = parts
        .iter()
        .filter(|(n, _, _)| n.starts_with("containerd-shim"))
        .map(|(_, rss, _)| rss)
        .sum::<u64>()
        / 1024;
    figure(
        "idle pod host memory (PSS)",
        format!("{pss_mib} MiB"),
        "-",
        None,
        "<= 80 MiB",
    );
    figure(
        "idle pod's shim (RSS)",
        format!("{shim_rss_mib} MiB"),
        "-",
        None,
        "<= 10 MiB",
    );
    Ok(pss_mib)
}

/// One idle pod's processes (QEMU, virtiofsd, vhost-device-vsock, shim), each with its RSS
/// and PSS (KiB) a few seconds after it started; its host CPU printed.
fn measure_idle_pod(stack: &Stack) -> anyhow::Result<Vec<(&'static str, u64, u64)>> {
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
    measured
}

/// One line: the pod's total by `measure` and each process's part (KiB in, MiB out).
fn print_memory<'a>(measure: &str, parts: impl Iterator<Item = (&'a str, u64)>) {
    let parts: Vec<(&str, u64)> = parts.collect();
    let total: u64 = parts.iter().map(|(_, kib)| kib).sum();
    let detail: Vec<String> = parts
        .iter()
        .map(|(n, kib)| format!("{n} {} MiB", kib / 1024))
        .collect();
    println!(
        "bench-start: idle pod host memory ({measure}, 256 MiB guest): {} MiB ({})",
        total / 1024,
        detail.join(", ")
    );
}
