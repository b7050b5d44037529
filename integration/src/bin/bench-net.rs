//! `make bench-net`: TCP throughput between a peer namespace and a pod, host -> pod and
//! pod -> host, for a vmlet VM and, measured in the same run, for a plain network namespace
//! on the same kind of link (the baseline). Prints both and the ratios; asserts nothing.
//!
//! The pod namespace is set up as CNI's bridge plugin leaves it (a veth with the pod
//! address); the "host" side is a second namespace the benchmark creates, so no traffic
//! touches the machine's own interfaces. iperf3 runs from the test image inside the VM and
//! from the host's iperf3 binary in the namespaces.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmlet_integration::figures::figure;
use vmlet_integration::testnet::TestNet;
use vmlet_integration::{unique_id, Stack, RUNTIME};

const SECONDS: &str = "5";
const POD_IP: &str = "10.213.0.2";

/// Runs the iperf3 client, retrying while the server re-opens its listener between tests
/// (a connection the closing listener had queued is reset: "unable to receive control
/// message: Connection reset by peer") or is still finishing the previous test (slow under
/// TCG: "the server is busy"). Each of these ends a run before it measured anything.
fn client(net: &TestNet, reverse: bool) -> anyhow::Result<f64> {
    let mut last = None;
    for _ in 0..20 {
        match client_once(net, reverse) {
            Ok(gbps) => return Ok(gbps),
            Err(e) if is_transient(&e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap())
}

fn is_transient(e: &anyhow::Error) -> bool {
    let text = e.to_string();
    text.contains("Connection refused")
        || text.contains("busy")
        || text.contains("unable to receive control message: Connection reset by peer")
}

/// One iperf3 client run in the peer namespace against the pod; returns Gbit/s.
fn client_once(net: &TestNet, reverse: bool) -> anyhow::Result<f64> {
    let mut args = vec![
        "netns", "exec", &net.peer, "iperf3", "-c", POD_IP, "-t", SECONDS, "-J",
    ];
    if reverse {
        args.push("-R");
    }
    let out = Command::new("ip")
        .args(&args)
        .output()
        .context("run iperf3 client")?;
    if !out.status.success() {
        bail!("iperf3 client: {}", String::from_utf8_lossy(&out.stdout));
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    if let Some(error) = json["error"].as_str() {
        bail!("iperf3 client (reverse: {reverse}): {error}");
    }
    let bps = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 JSON has no end.sum_received")?;
    Ok(bps / 1e9)
}

/// Waits until something accepts TCP connections on the pod's iperf3 port.
fn wait_for_server(net: &TestNet) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let ok = Command::new("ip")
            .args(["netns", "exec", &net.peer, "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{POD_IP}/5201"))
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            // Let iperf3 finish with the probe connection before the first real client.
            std::thread::sleep(Duration::from_secs(1));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    bail!("no iperf3 server came up in the pod")
}

fn baseline() -> anyhow::Result<(f64, f64)> {
    let net = TestNet::new("bench", 1500);
    let mut server = Command::new("ip")
        .args(["netns", "exec", &net.pod, "iperf3", "-s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let result = (|| {
        wait_for_server(&net)?;
        Ok((client(&net, false)?, client(&net, true)?))
    })();
    let _ = server.kill();
    let _ = server.wait();
    result
}

fn vmlet(stack: &Stack, image: &str) -> anyhow::Result<(f64, f64)> {
    let net = TestNet::new("bench", 1500);
    let id = unique_id("iperf");
    let with_ns = format!("network:{}", net.pod_path().display());
    let mut run = stack
        .ctr()
        .args([
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            "--annotation",
            "vmlet.io/vcpus=2",
            "--with-ns",
            &with_ns,
            image,
            &id,
            "iperf3",
            "-s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let result = (|| {
        wait_for_server(&net)?;
        Ok((client(&net, false)?, client(&net, true)?))
    })();
    let _ = stack.ctr_output(&["task", "kill", "-s", "SIGKILL", &id]);
    let _ = run.wait();
    result
}

fn main() -> anyhow::Result<()> {
    let stack = Stack::from_env()?;
    let image = std::env::var("VMLET_NET_IMAGE").context("VMLET_NET_IMAGE (scripts/stack env)")?;
    let (base_in, base_out) = baseline()?;
    let (vm_in, vm_out) = vmlet(&stack, &image)?;
    println!("bench-net: host -> pod: vmlet {vm_in:.2} Gbit/s, plain netns {base_in:.2} Gbit/s, ratio {:.2}", vm_in / base_in);
    println!("bench-net: pod -> host: vmlet {vm_out:.2} Gbit/s, plain netns {base_out:.2} Gbit/s, ratio {:.2}", vm_out / base_out);
    for (way, vm, base) in [
        ("host -> pod", vm_in, base_in),
        ("pod -> host", vm_out, base_out),
    ] {
        figure(
            &format!("network {way}"),
            format!("{vm:.2} Gbit/s"),
            format!("plain netns {base:.2} Gbit/s"),
            Some(vm / base),
            "-",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_client_that_measured_nothing_is_retried() {
        for transient in [
            "iperf3 client (reverse: true): unable to connect to server: Connection refused",
            "iperf3 client (reverse: false): the server is busy running a test. try again later",
            "iperf3 client (reverse: true): unable to receive control message: Connection reset by peer",
        ] {
            assert!(is_transient(&anyhow::anyhow!(transient)), "{transient}");
        }
        let failed = anyhow::anyhow!("iperf3 JSON has no end.sum_received");
        assert!(!is_transient(&failed));
    }
}
