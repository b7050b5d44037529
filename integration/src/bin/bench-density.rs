//! `make bench-density`: how many idle pods a node holds (issue 14, target 6).
//!
//! - baseline: one idle pod alone (busybox `sleep`, the default 256 MiB guest), its host
//!   memory: the sum of the PSS of its processes (QEMU, virtiofsd, vhost-device-vsock, shim);
//! - density: `PODS` such pods created `AT_ONCE` at a time with `ctr run -d` (each batch
//!   waited for), then one `ctr task exec ... true` into each, timed, then the memory of all
//!   of them (the sum of every pod's processes' PSS, per pod: what they share, such as the
//!   kernel file QEMU maps and the binaries' pages, is split among them).
//!
//! Prints the time to create them all, the execs' median and slowest (and how many answered
//! within 2 s), the per-pod memory beside the baseline's. Removes every pod it made, also
//! after a failure. Nothing is asserted.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmlet_integration::figures::figure;
use vmlet_integration::{proc_kib, pss_kib, unique_id, Stack};

const PODS: usize = 20;
const AT_ONCE: usize = 4;
/// Host memory (MiB) the run wants available per pod: a 256 MiB guest that is idle costs
/// ~150 (`docs/performance.md`), with room for what the guest touches.
const MIB_PER_POD: u64 = 300;
/// The answer time issue 14 asks of each pod's exec.
const EXEC_TARGET: Duration = Duration::from_secs(2);

/// Pods this run made, killed and removed on drop.
struct Pods<'a> {
    stack: &'a Stack,
    ids: Vec<String>,
}

impl Drop for Pods<'_> {
    fn drop(&mut self) {
        let stack = self.stack;
        std::thread::scope(|scope| {
            for chunk in self.ids.chunks(AT_ONCE) {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|id| scope.spawn(move || (id, stack.kill_and_remove(id))))
                    .collect();
                for handle in handles {
                    if let Ok((id, Err(e))) = handle.join() {
                        eprintln!("bench-density: removing {id}: {e:#}");
                    }
                }
            }
        });
    }
}

impl<'a> Pods<'a> {
    fn new(stack: &'a Stack) -> Self {
        Pods {
            stack,
            ids: Vec::new(),
        }
    }

    /// Starts `count` pods, `AT_ONCE` at a time, each running (`ctr task ls`) before the
    /// next batch.
    fn start(&mut self, count: usize) -> anyhow::Result<()> {
        for batch in 0..count.div_ceil(AT_ONCE) {
            let ids: Vec<String> = (0..AT_ONCE.min(count - batch * AT_ONCE))
                .map(|_| unique_id("density"))
                .collect();
            // Recorded first: a pod whose start failed half-way is removed too.
            self.ids.extend(ids.iter().cloned());
            let stack = self.stack;
            std::thread::scope(|scope| {
                let handles: Vec<_> = ids
                    .iter()
                    .map(|id| scope.spawn(move || stack.run_detached(id, &["sleep", "100000"])))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("ctr run thread"))
                    .collect::<anyhow::Result<Vec<()>>>()
            })?;
        }
        Ok(())
    }

    /// The sum of the PSS (KiB) of every process of these pods.
    fn pss_kib(&self) -> u64 {
        self.ids
            .iter()
            .flat_map(|id| self.stack.pod_processes(id))
            .map(|(pid, _)| pss_kib(pid))
            .sum()
    }
}

fn exec_true(stack: &Stack, id: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let out = stack.ctr_output(&["task", "exec", "--exec-id", &unique_id("e"), id, "true"])?;
    if !out.status.success() {
        bail!(
            "ctr task exec {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(started.elapsed())
}

/// Lets the pods settle (their guests idle, free pages reported) before memory is read.
fn settle() {
    std::thread::sleep(Duration::from_secs(5));
}

/// `MemAvailable` of the host, in MiB.
fn available_mib() -> anyhow::Result<u64> {
    proc_kib("/proc/meminfo", "MemAvailable:")
        .map(|kib| kib / 1024)
        .context("no MemAvailable in /proc/meminfo")
}

fn main() -> anyhow::Result<()> {
    let stack = Stack::from_env()?;
    let (needed, available) = (PODS as u64 * MIB_PER_POD, available_mib()?);
    if available < needed {
        println!(
            "bench-density: skipped: {PODS} pods want {needed} MiB available, the host has {available} MiB"
        );
        figure(
            &format!("{PODS} idle pods, {AT_ONCE} at a time"),
            format!("skipped ({available} of {needed} MiB available)"),
            "-",
            None,
            "all answer an exec within 2 s",
        );
        return Ok(());
    }

    let alone_kib = {
        let mut one = Pods::new(&stack);
        one.start(1).context("the baseline pod")?;
        settle();
        one.pss_kib()
    };

    let mut pods = Pods::new(&stack);
    let started = Instant::now();
    pods.start(PODS)?;
    let created = started.elapsed();
    let mut execs = Vec::with_capacity(PODS);
    for id in &pods.ids {
        execs.push(exec_true(&stack, id)?);
    }
    settle();
    let total_kib = pods.pss_kib();

    execs.sort();
    let within = execs.iter().filter(|d| **d <= EXEC_TARGET).count();
    let per_pod_mib = total_kib as f64 / PODS as f64 / 1024.0;
    let alone_mib = alone_kib as f64 / 1024.0;
    println!(
        "bench-density: {PODS} idle pods created {AT_ONCE} at a time in {:.1} s ({:.2} s per pod)",
        created.as_secs_f64(),
        created.as_secs_f64() / PODS as f64
    );
    println!(
        "bench-density: exec into each: median {} ms, slowest {} ms; {within} of {PODS} answered within {} s (target: all)",
        execs[PODS / 2].as_millis(),
        execs[PODS - 1].as_millis(),
        EXEC_TARGET.as_secs()
    );
    println!(
        "bench-density: host memory (PSS) per pod with {PODS} running: {per_pod_mib:.0} MiB ({:.0} MiB in all), one pod alone {alone_mib:.0} MiB, ratio {:.2}",
        total_kib as f64 / 1024.0,
        per_pod_mib / alone_mib
    );
    figure(
        &format!("{PODS} idle pods, {AT_ONCE} at a time: exec answered within 2 s"),
        format!(
            "{within} of {PODS} (slowest {} ms)",
            execs[PODS - 1].as_millis()
        ),
        "-",
        None,
        "all",
    );
    figure(
        &format!("{PODS} idle pods: created"),
        format!("{:.1} s", created.as_secs_f64()),
        "-",
        None,
        "-",
    );
    figure(
        &format!("host memory (PSS) per pod with {PODS} running"),
        format!("{per_pod_mib:.0} MiB"),
        format!("one pod alone {alone_mib:.0} MiB"),
        Some(per_pod_mib / alone_mib),
        "-",
    );
    Ok(())
}
