//! End to end: `vmletctl metrics --listen` serves every running pod's figures over HTTP as
//! Prometheus text that a real parser (python3-prometheus-client's) reads, with each
//! per-pod series for two pods at once (labelled `cri_name`, `cri_namespace`, `pod_id`), the
//! exec one pod ran counted, the node's boot histogram with both boots in it, a refused
//! create counted by its reason, and `vmlet_build_info`; the exporter runs as the node's
//! metrics uid and group alone, as the DaemonSet's metrics container does. Run by `make
//! test`.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{stack, text};
use vmlet_integration::unique_id;

/// The per-pod series every running pod has.
const POD_SERIES: &[&str] = &[
    "vmlet_pod_vm_cpu_seconds_total",
    "vmlet_pod_vm_memory_bytes",
    "vmlet_pod_boot_seconds",
    "vmlet_pod_agent_ready_seconds",
    "vmlet_pod_agent_rtt_seconds",
    "vmlet_pod_execs_total",
    "vmlet_shim_resident_bytes",
    "vmlet_shim_cpu_seconds_total",
    "vmlet_shim_threads",
];

/// Parses the Prometheus text in the file argv[1] with prometheus_client's parser: one
/// `name label value` line a sample, the label the sample's `cri_name`, else its `le`,
/// `reason` or `version`, else "-"; and one `family NAME TYPE` line a family.
const PARSE: &str = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    print("family", family.name, family.type)
    for s in family.samples:
        label = next((s.labels[k] for k in ("cri_name", "le", "reason", "version") if k in s.labels), "-")
        print(s.name, label, s.value)
"#;

/// GET /metrics from the exporter, retried while it starts.
fn scrape(address: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut stream) = std::net::TcpStream::connect(address) {
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut answer = String::new();
            stream.take(4 << 20).read_to_string(&mut answer).unwrap();
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.0 200"), "{head}");
            assert!(head.contains("text/plain; version=0.0.4"), "{head}");
            return body.to_owned();
        }
        assert!(Instant::now() < deadline, "the exporter did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs the vmlet stack: make test"]
fn metrics_of_two_pods_are_valid_prometheus_text() {
    let s = stack();
    let pods = [unique_id("metrics-a"), unique_id("metrics-b")];
    for pod in &pods {
        s.run_detached(pod, &["sleep", "1000"]).unwrap();
    }
    let out = s
        .ctr_output(&["task", "exec", "--exec-id", "m1", &pods[0], "true"])
        .unwrap();
    assert!(out.status.success(), "exec: {}", text(&out.stderr));
    let counters = format!("{}/state/.node-counters.json", s.dir);
    let before: serde_json::Value = std::fs::read(&counters)
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or_default();
    let refused = unique_id("metrics-bad");
    let out = s
        .run(
            &refused,
            &["--annotation", "vmlet.io/memory=lots"],
            &["true"],
        )
        .unwrap();
    assert!(!out.status.success(), "a bad annotation is refused");
    let _ = s.ctr_output(&["container", "rm", &refused]);

    let address = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    // As the DaemonSet's metrics container runs it: the node's metrics uid and group alone,
    // which read what the shims publish and nothing else of vmlet's.
    let gid = crate::direct_pods::node_config().metrics_gid;
    let mut exporter = Command::new("setpriv")
        .arg(format!("--reuid={gid}"))
        .arg(format!("--regid={gid}"))
        .arg(format!("--groups={gid}"))
        .arg(format!("{}/bin/vmletctl", s.dir))
        .args(["metrics", "--listen", &address])
        .arg(format!("--state-dir={}/state", s.dir))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let body = scrape(&address);
    // Clients that connect and never finish a request hold nothing: another scrape is
    // answered at once, not after their deadline.
    let idle: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    let started = Instant::now();
    let again = scrape(&address);
    let took = started.elapsed();
    drop(idle);
    assert!(again.contains("vmlet_pod_"), "{again}");
    assert!(
        took < vmletctl::metrics_server::REQUEST_DEADLINE / 2,
        "a scrape beside idle clients took {took:?}"
    );
    let _ = exporter.kill();
    let _ = exporter.wait();

    let samples = crate::support::parsed_prometheus(&s, &body, PARSE);
    let value = |name: &str, pod: &str| -> f64 {
        samples
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(name) && f.next() == Some(pod))
                    .then(|| f.next().unwrap().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {name} for {pod} in:\n{body}"))
    };
    for pod in &pods {
        for series in POD_SERIES {
            value(series, pod);
        }
        // QEMU and its helpers, at least (a freshly booted 256 MiB guest under TCG was
        // measured from about 60 MiB up).
        assert!(value("vmlet_pod_vm_memory_bytes", pod) > 16.0 * 1048576.0);
        assert!(value("vmlet_pod_boot_seconds", pod) > value("vmlet_pod_agent_ready_seconds", pod));
        assert!(value("vmlet_pod_agent_rtt_seconds", pod) < 2.0);
    }
    assert_eq!(value("vmlet_pod_execs_total", &pods[0]), 1.0);
    assert_eq!(value("vmlet_pod_execs_total", &pods[1]), 0.0);
    assert!(value("vmlet_pods", "-") >= 2.0);
    // The node's: a histogram of every boot (both pods' among them), the refused create by
    // its reason, and the release.
    for family in [
        "family vmlet_pod_boot_duration_seconds histogram",
        "family vmlet_create_failures counter",
        "family vmlet_build_info gauge",
    ] {
        assert!(
            samples.lines().any(|l| l == family),
            "{family} in:\n{samples}"
        );
    }
    let boots = value("vmlet_pod_boot_duration_seconds_count", "-");
    assert!(boots >= 2.0, "{body}");
    assert_eq!(
        value("vmlet_pod_boot_duration_seconds_bucket", "+Inf"),
        boots
    );
    assert!(value("vmlet_pod_boot_duration_seconds_sum", "-") > 0.0);
    let failed_before = before["create_failures"]["invalid_argument"]
        .as_u64()
        .unwrap_or(0) as f64;
    assert!(
        value("vmlet_create_failures_total", "invalid_argument") > failed_before,
        "{body}"
    );
    assert_eq!(
        value("vmlet_build_info", env!("CARGO_PKG_VERSION")),
        1.0,
        "{body}"
    );

    // What the metrics group reaches: the published directory, root's, set-group-ID, each
    // pod's socket the group's to connect; not the pods' own sockets.
    use std::os::unix::fs::MetadataExt;
    let published = std::path::PathBuf::from(format!("{}/state/.metrics", s.dir));
    let meta = std::fs::metadata(&published).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (0, gid, 0o2750)
    );
    for pod in &pods {
        let socket = std::fs::metadata(published.join(format!("{pod}.sock"))).unwrap();
        assert_eq!(
            (socket.uid(), socket.gid(), socket.mode() & 0o777),
            (0, gid, 0o660)
        );
        let vsock = crate::direct_pods::pod_dir(&s, pod).join("vsock.sock");
        let out = Command::new("setpriv")
            .arg(format!("--reuid={gid}"))
            .arg(format!("--regid={gid}"))
            .arg(format!("--groups={gid}"))
            .args(["socat", "-u", "OPEN:/dev/null"])
            .arg(format!("UNIX-CONNECT:{}", vsock.display()))
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "the metrics group connected to {}",
            vsock.display()
        );
    }
    for pod in &pods {
        s.kill_and_remove(pod).unwrap();
        assert!(!published.join(format!("{pod}.sock")).exists());
    }
}
