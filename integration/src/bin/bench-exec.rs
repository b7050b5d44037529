//! `make bench-exec`: exec latency and stdout throughput of a vmlet container beside
//! ceilings measured in the same run.
//!
//! - exec: wall time of 50 `ctr task exec ... true` into a running vmlet container, p50 and
//!   p95, beside the same into a runc container (`io.containerd.runc.v2`) of the same image;
//! - stdout: a vmlet exec writing 512 MiB of zeros to stdout, read by this process through
//!   `ctr`, beside `dd if=/dev/zero of=/dev/null bs=1M count=512` in the same guest (the
//!   in-guest ceiling), both timed around the whole `ctr task exec`; and, for scale, the
//!   same 512 MiB through one pipe inside the guest (`dd | dd`): what a single in-guest copy
//!   of the output costs, which any path out of the VM pays at least once.
//!
//! Prints the figures and ratios. Nothing is asserted.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmlet_integration::figures::figure;
use vmlet_integration::{unique_id, Stack, RUNTIME};

const EXECS: usize = 50;
const MIB: usize = 512;

/// A detached `sleep` container of the test image under `runtime`, removed on drop.
struct Container<'a> {
    stack: &'a Stack,
    id: String,
}

impl<'a> Container<'a> {
    fn start(stack: &'a Stack, runtime: &str) -> anyhow::Result<Self> {
        let id = unique_id("bench-exec");
        let out = stack.ctr_output(&[
            "run",
            "-d",
            "--runtime",
            runtime,
            &stack.image,
            &id,
            "sleep",
            "1000",
        ])?;
        if !out.status.success() {
            bail!(
                "ctr run ({runtime}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let c = Self { stack, id };
        stack.wait_status(&c.id, "RUNNING", Duration::from_secs(90))?;
        Ok(c)
    }

    fn exec(&self, exec_id: &str, args: &[&str]) -> anyhow::Result<Duration> {
        let mut all = vec!["task", "exec", "--exec-id", exec_id, &self.id];
        all.extend_from_slice(args);
        let start = Instant::now();
        let out = self.stack.ctr_output(&all)?;
        let took = start.elapsed();
        if !out.status.success() {
            bail!("ctr task exec: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(took)
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.stack.kill_and_remove(&self.id) {
            eprintln!("bench-exec: cleanup of {}: {e}", self.id);
        }
    }
}

/// p50 and p95 of `EXECS` execs of `true`.
fn exec_latency(c: &Container) -> anyhow::Result<(Duration, Duration)> {
    let mut times = (0..EXECS)
        .map(|i| c.exec(&format!("lat{i}"), &["true"]))
        .collect::<anyhow::Result<Vec<_>>>()?;
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok((at(0.50), at(0.95)))
}

/// MiB/s of `MIB` MiB written to stdout by an exec and read here through ctr.
fn stdout_throughput(c: &Container) -> anyhow::Result<f64> {
    let count = format!("count={MIB}");
    let start = Instant::now();
    let mut child = c
        .stack
        .ctr()
        .args(["task", "exec", "--exec-id", "out", &c.id])
        .args(["dd", "if=/dev/zero", "bs=1M", &count])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start ctr task exec")?;
    let mut stdout = child.stdout.take().context("ctr stdout")?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0usize;
    loop {
        let n = stdout.read(&mut buf).context("read ctr stdout")?;
        if n == 0 {
            break;
        }
        total += n;
    }
    let status = child.wait()?;
    let took = start.elapsed();
    if !status.success() || total != MIB << 20 {
        bail!("stdout exec: {status}, {total} bytes");
    }
    Ok(MIB as f64 / took.as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    let stack = Stack::from_env()?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;

    let vmlet = Container::start(&stack, RUNTIME)?;
    let (v50, v95) = exec_latency(&vmlet)?;
    let throughput = stdout_throughput(&vmlet)?;
    let count = format!("count={MIB}");
    let ceiling = vmlet.exec(
        "ceiling",
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=1M", &count],
    )?;
    let ceiling = MIB as f64 / ceiling.as_secs_f64();
    let one_pipe = vmlet.exec(
        "one-pipe",
        &[
            "sh",
            "-c",
            &format!(
                "dd if=/dev/zero bs=1M {count} 2>/dev/null | dd of=/dev/null bs=1M 2>/dev/null"
            ),
        ],
    )?;
    let one_pipe = MIB as f64 / one_pipe.as_secs_f64();
    drop(vmlet);

    let runc = Container::start(&stack, "io.containerd.runc.v2")?;
    let (r50, r95) = exec_latency(&runc)?;
    drop(runc);

    println!(
        "bench-exec: exec true x{EXECS}: vmlet p50 {:.0} ms, p95 {:.0} ms; runc p50 {:.0} ms, p95 {:.0} ms; p50 ratio {:.2} (target: ratio <= 1.5)",
        ms(v50),
        ms(v95),
        ms(r50),
        ms(r95),
        ms(v50) / ms(r50)
    );
    figure(
        "exec p50 (ctr task exec true)",
        format!("{:.0} ms", ms(v50)),
        format!("runc {:.0} ms", ms(r50)),
        Some(ms(v50) / ms(r50)),
        "<= 1.5",
    );
    figure(
        &format!("stdout of {MIB} MiB"),
        format!("{throughput:.0} MiB/s"),
        format!("in-guest dd {ceiling:.0} MiB/s"),
        Some(throughput / ceiling),
        ">= 0.5",
    );
    println!(
        "bench-exec: stdout {MIB} MiB: vmlet {throughput:.0} MiB/s, in-guest dd to /dev/null {ceiling:.0} MiB/s, ratio {:.3} (target >= 0.5)",
        throughput / ceiling
    );
    println!(
        "bench-exec: for scale: {MIB} MiB through one pipe inside the guest (dd | dd) {one_pipe:.0} MiB/s, ratio to the ceiling {:.3}; vmlet stdout / one pipe {:.3}",
        one_pipe / ceiling,
        throughput / one_pipe
    );
    Ok(())
}
