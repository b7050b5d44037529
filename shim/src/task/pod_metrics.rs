//! Per-pod figures for Prometheus (`vmletctl metrics`). Each shim serves its pod's figures
//! ([`PodFigures`], as JSON) on `<pod id>.sock` in the metrics directory
//! ([`crate::task::metrics_dir`]), one answer a connection; `vmletctl metrics` asks every live pod's socket and renders them all as one
//! Prometheus text exposition ([`render`]).
//!
//! A pod's figures: its VM's host-side CPU and memory (the pod's cgroup, where QEMU and its
//! helpers run), how long the VM took to boot and its agent to answer, the agent's
//! round-trip time (one call, timed: made by the first scrape, then again in the background
//! when a scrape finds it older than [`RTT_REFRESH`], so that no scrape waits on a slow
//! guest but the first), the execs started, and the shim's own
//! memory, CPU and threads. Labels: `cri_name` and `cri_namespace` (Kubernetes' pod name
//! and namespace for a CRI pod, containerd's task id and namespace otherwise: not `pod` and
//! `namespace`, which Prometheus' Kubernetes discovery sets to the exporter's own) and
//! `pod_id` (the sandbox id). Beside them, the node's: every boot's time as a histogram and
//! the failed creates by reason ([`crate::task::node_counters`]), and `vmlet_build_info`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::task::node_counters::{NodeCounters, BOOT_BUCKETS};
use crate::vm::pod_vm::PodVm;
use crate::Error;

/// How long an answer may take (the agent call included).
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(3);
/// The agent's share of it.
const AGENT_DEADLINE: Duration = Duration::from_secs(2);
/// How old the agent's measured round trip may be before a scrape has it measured again.
pub const RTT_REFRESH: Duration = Duration::from_secs(10);
/// How many connections a shim answers at once; more are closed unanswered.
const MAX_ANSWERS: usize = 4;
/// The largest answer `fetch` reads.
const ANSWER_LIMIT: u64 = 64 << 10;

/// One pod's figures, as its shim serves them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodFigures {
    pub pod_id: String,
    /// Kubernetes' pod name (CRI), else the task id.
    pub pod: String,
    /// Kubernetes' namespace (CRI), else containerd's.
    pub namespace: String,
    pub vm_cpu_seconds: Option<f64>,
    pub vm_memory_bytes: Option<u64>,
    pub boot_seconds: Option<f64>,
    pub agent_ready_seconds: Option<f64>,
    pub agent_rtt_seconds: Option<f64>,
    pub execs: u64,
    pub shim_resident_bytes: Option<u64>,
    pub shim_cpu_seconds: Option<f64>,
    pub shim_threads: Option<u64>,
}

/// What the shim knows of its pod between scrapes.
pub struct PodMeter {
    pod_id: String,
    pod: String,
    namespace: String,
    /// Where the figures are served.
    socket: PathBuf,
    /// The pod's host cgroup (its state's), where its VM's figures are.
    cgroup: Option<PathBuf>,
    boot_seconds: f64,
    agent_ready_seconds: Option<f64>,
    execs: AtomicU64,
    /// The pod's VM, for the agent's round trip (not kept alive by the meter).
    vm: Weak<dyn PodVm>,
    /// The agent's round trip as last measured (None: no answer), and when.
    /// (tokio's clock: the tests move it.)
    rtt: std::sync::Mutex<Option<(Option<f64>, tokio::time::Instant)>>,
    /// Whether a measurement runs in the background.
    rtt_measuring: AtomicBool,
    server: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PodMeter {
    /// Serves the figures of `vm`, booted in `boot` (its agent answering `agent_ready`
    /// after the VM started), whose state directory is `dir`, on `socket` (in the metrics
    /// directory: [`crate::task::metrics_dir::socket`]); `names` are its `cri_name` and
    /// `cri_namespace` labels. None, logged, when the socket cannot be made: the pod runs
    /// on.
    pub fn start(
        vm: &Arc<dyn PodVm>,
        dir: &Path,
        socket: PathBuf,
        names: crate::host::pod_record::PodNames,
        boot: Duration,
        agent_ready: Option<Duration>,
    ) -> Option<Arc<Self>> {
        let meter = Arc::new(Self {
            pod_id: vm.pod_id().to_owned(),
            pod: names.name,
            namespace: names.namespace,
            socket,
            cgroup: crate::host::state::PodState::load(dir)
                .ok()
                .and_then(|s| s.cgroup().map(Path::to_owned)),
            boot_seconds: boot.as_secs_f64(),
            agent_ready_seconds: agent_ready.map(|d| d.as_secs_f64()),
            execs: AtomicU64::new(0),
            vm: Arc::downgrade(vm),
            rtt: std::sync::Mutex::new(None),
            rtt_measuring: AtomicBool::new(false),
            server: std::sync::Mutex::new(None),
        });
        match meter.serve() {
            Ok(()) => Some(meter),
            Err(e) => {
                log::warn!("{}: no metrics: {}", meter.pod_id, e.message());
                None
            }
        }
    }

    pub fn count_exec(&self) {
        self.execs.fetch_add(1, Ordering::Relaxed);
    }

    /// Serves the figures on its socket (mode 0660: root's and the metrics directory's
    /// group's) until [`PodMeter::stop`].
    fn serve(self: &Arc<Self>) -> Result<(), Error> {
        let path = &self.socket;
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .map_err(|e| Error::io(format!("listen on {}", path.display()), e))?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o660))
            .map_err(|e| Error::io(format!("chmod {}", path.display()), e))?;
        let meter = Arc::downgrade(self);
        let answering = Arc::new(tokio::sync::Semaphore::new(MAX_ANSWERS));
        let server = tokio::spawn(async move {
            loop {
                let mut stream = crate::host::unix_accept::next(&listener, "pod figures").await;
                let Some(meter) = meter.upgrade() else { return };
                // Beyond the bound a connection is closed unanswered.
                let Ok(permit) = Arc::clone(&answering).try_acquire_owned() else {
                    continue;
                };
                tokio::spawn(async move {
                    let _permit = permit;
                    let answer = async {
                        let json = serde_json::to_vec(&meter.figures().await).unwrap_or_default();
                        let _ = stream.write_all(&json).await;
                    };
                    let _ = tokio::time::timeout(ANSWER_DEADLINE, answer).await;
                });
            }
        });
        *self.server.lock().unwrap() = Some(server);
        Ok(())
    }

    /// Stops serving and removes the socket.
    pub fn stop(&self) {
        if let Some(server) = self.server.lock().unwrap().take() {
            server.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// The figures now.
    pub async fn figures(self: &Arc<Self>) -> PodFigures {
        let (vm_cpu_seconds, vm_memory_bytes) =
            self.cgroup.as_deref().map_or((None, None), cgroup_usage);
        let shim = ProcessFigures::of_self();
        PodFigures {
            pod_id: self.pod_id.clone(),
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            vm_cpu_seconds,
            vm_memory_bytes,
            boot_seconds: Some(self.boot_seconds),
            agent_ready_seconds: self.agent_ready_seconds,
            agent_rtt_seconds: self.round_trip().await,
            execs: self.execs.load(Ordering::Relaxed),
            shim_resident_bytes: shim.resident_bytes,
            shim_cpu_seconds: shim.cpu_seconds,
            shim_threads: shim.threads,
        }
    }

    /// The agent's round trip: measured now when it never was, else as last measured, and
    /// measured again in the background when that is older than [`RTT_REFRESH`].
    async fn round_trip(self: &Arc<Self>) -> Option<f64> {
        let last = *self.rtt.lock().unwrap();
        let Some((seconds, at)) = last else {
            // One first measurement at a time: a burst of scrapes is not a burst of calls
            // into the guest (the others have no figure yet).
            if self.rtt_measuring.swap(true, Ordering::AcqRel) {
                return None;
            }
            let _measuring = Measuring(&self.rtt_measuring);
            let measured = self.agent_round_trip().await;
            *self.rtt.lock().unwrap() = Some((measured, tokio::time::Instant::now()));
            return measured;
        };
        if at.elapsed() >= RTT_REFRESH && !self.rtt_measuring.swap(true, Ordering::AcqRel) {
            // Bounded by the agent's deadline; the meter lives on until it ends.
            let meter = Arc::clone(self);
            tokio::spawn(async move {
                let measured = meter.agent_round_trip().await;
                *meter.rtt.lock().unwrap() = Some((measured, tokio::time::Instant::now()));
                meter.rtt_measuring.store(false, Ordering::Release);
            });
        }
        seconds
    }

    /// One cheap agent call (the pod's processes), timed; None without an agent.
    async fn agent_round_trip(&self) -> Option<f64> {
        let vm = self.vm.upgrade()?;
        if vm.has_ended() {
            return None;
        }
        let agent = vm.guest().agent().ok()?;
        let started = Instant::now();
        let call = agent.list_processes(&self.pod_id);
        match tokio::time::timeout(AGENT_DEADLINE, call).await {
            Ok(Ok(_)) => Some(started.elapsed().as_secs_f64()),
            _ => None,
        }
    }
}

/// A measurement of the agent's round trip under way: over when dropped (a scrape whose
/// answer was cut at its deadline included).
struct Measuring<'a>(&'a AtomicBool);

impl Drop for Measuring<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Drop for PodMeter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The pod cgroup's CPU seconds and memory bytes, from whichever hierarchy has them
/// (cgroup v2's `cpu.stat` and `memory.current`, v1's `cpuacct.usage` and
/// `memory.usage_in_bytes`).
fn cgroup_usage(path: &Path) -> (Option<f64>, Option<u64>) {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let (mut cpu, mut memory) = (None, None);
    for hierarchy in crate::host::pod_cgroup::hierarchies() {
        let dir = hierarchy.join(relative);
        let read = |name: &str| read_small(&dir.join(name));
        if cpu.is_none() {
            cpu = read("cpuacct.usage")
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map(|ns| ns as f64 / 1e9)
                .or_else(|| {
                    read("cpu.stat")?
                        .lines()
                        .find_map(|l| l.strip_prefix("usage_usec "))?
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .map(|us| us as f64 / 1e6)
                });
        }
        if memory.is_none() {
            memory = read("memory.usage_in_bytes")
                .or_else(|| read("memory.current"))
                .and_then(|t| t.trim().parse().ok());
        }
    }
    (cpu, memory)
}

fn read_small(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// A process's own figures, from `/proc/self`.
struct ProcessFigures {
    resident_bytes: Option<u64>,
    cpu_seconds: Option<f64>,
    threads: Option<u64>,
}

impl ProcessFigures {
    fn of_self() -> Self {
        let status = read_small(Path::new("/proc/self/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        // utime and stime, fields 14 and 15 of /proc/self/stat, after the command's ")".
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        let cpu_seconds = read_small(Path::new("/proc/self/stat")).and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / ticks)
        });
        Self {
            resident_bytes: field("VmRSS:").map(|kib| kib * 1024),
            cpu_seconds,
            threads: field("Threads:"),
        }
    }
}

/// Asks the shim serving a pod's figures on `path` for them, within [`ANSWER_DEADLINE`].
pub fn fetch(path: &Path) -> Result<PodFigures, String> {
    let stream = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    stream
        .set_read_timeout(Some(ANSWER_DEADLINE))
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream
        .take(ANSWER_LIMIT)
        .read_to_end(&mut answer)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&answer).map_err(|e| format!("{}: {e}", path.display()))
}

/// One metric family: name, type, help, and each pod's value.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&PodFigures) -> Option<f64>,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "vmlet_pod_vm_cpu_seconds_total",
        kind: "counter",
        help: "CPU time of the pod's VM on the host (QEMU and its helpers, the pod's cgroup).",
        value: |f| f.vm_cpu_seconds,
    },
    Family {
        name: "vmlet_pod_vm_memory_bytes",
        kind: "gauge",
        help: "Memory of the pod's VM on the host (QEMU and its helpers, the pod's cgroup).",
        value: |f| f.vm_memory_bytes.map(|b| b as f64),
    },
    Family {
        name: "vmlet_pod_boot_seconds",
        kind: "gauge",
        help: "From the sandbox's create to its VM booted with its network configured.",
        value: |f| f.boot_seconds,
    },
    Family {
        name: "vmlet_pod_agent_ready_seconds",
        kind: "gauge",
        help: "From the VM's start to its agent's first answer.",
        value: |f| f.agent_ready_seconds,
    },
    Family {
        name: "vmlet_pod_agent_rtt_seconds",
        kind: "gauge",
        help: "Round trip of one agent call, as last measured (at most 10 s before the scrape before this one).",
        value: |f| f.agent_rtt_seconds,
    },
    Family {
        name: "vmlet_pod_execs_total",
        kind: "counter",
        help: "Exec processes started in the pod.",
        value: |f| Some(f.execs as f64),
    },
    Family {
        name: "vmlet_shim_resident_bytes",
        kind: "gauge",
        help: "Resident memory of the pod's shim.",
        value: |f| f.shim_resident_bytes.map(|b| b as f64),
    },
    Family {
        name: "vmlet_shim_cpu_seconds_total",
        kind: "counter",
        help: "CPU time of the pod's shim.",
        value: |f| f.shim_cpu_seconds,
    },
    Family {
        name: "vmlet_shim_threads",
        kind: "gauge",
        help: "Threads of the pod's shim.",
        value: |f| f.shim_threads.map(|t| t as f64),
    },
];

/// The figures of every pod as Prometheus text (exposition format 0.0.4), the node's
/// counters (none when they could not be read: an error of the scrape), and
/// `vmlet_build_info`, `vmlet_pods` and `vmlet_scrape_errors` for the node.
pub fn render(pods: &[PodFigures], node: Option<&NodeCounters>, errors: usize) -> String {
    let mut out = format!(
        "# HELP vmlet_build_info The vmlet release that serves these figures.\n\
         # TYPE vmlet_build_info gauge\nvmlet_build_info{{version=\"{}\"}} 1\n\
         # HELP vmlet_pods Pods whose shim answered this scrape.\n# TYPE vmlet_pods gauge\n\
         vmlet_pods {}\n\
         # HELP vmlet_scrape_errors Live pods whose shim did not answer this scrape, and the \
         node's counters when they could not be read.\n\
         # TYPE vmlet_scrape_errors gauge\nvmlet_scrape_errors {errors}\n",
        escape(env!("CARGO_PKG_VERSION")),
        pods.len()
    );
    if let Some(node) = node {
        out.push_str(&render_node(node));
    }
    for f in FAMILIES {
        out.push_str(&format!(
            "# HELP {} {}\n# TYPE {} {}\n",
            f.name, f.help, f.name, f.kind
        ));
        for pod in pods {
            if let Some(value) = (f.value)(pod) {
                out.push_str(&format!(
                    "{}{{cri_name=\"{}\",cri_namespace=\"{}\",pod_id=\"{}\"}} {}\n",
                    f.name,
                    escape(&pod.pod),
                    escape(&pod.namespace),
                    escape(&pod.pod_id),
                    value
                ));
            }
        }
    }
    out
}

/// The node's counters: the boot histogram (cumulative buckets) and the failed creates.
fn render_node(node: &NodeCounters) -> String {
    let name = "vmlet_pod_boot_duration_seconds";
    let mut out = format!(
        "# HELP {name} From a pod's create to its VM booted with its network configured, \
         every boot on the node.\n# TYPE {name} histogram\n"
    );
    let mut cumulative = 0;
    for (i, le) in BOOT_BUCKETS.iter().enumerate() {
        cumulative += node.boot_buckets.get(i).copied().unwrap_or(0);
        out.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {cumulative}\n"));
    }
    out.push_str(&format!(
        "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}\n",
        node.boots(),
        node.boot_sum_seconds,
        node.boots()
    ));
    out.push_str(
        "# HELP vmlet_create_failures_total Creates that failed on the node, by the error's \
         code.\n# TYPE vmlet_create_failures_total counter\n",
    );
    for (reason, count) in &node.create_failures {
        out.push_str(&format!(
            "vmlet_create_failures_total{{reason=\"{}\"}} {count}\n",
            escape(reason)
        ));
    }
    out
}

/// A label value escaped as the exposition format wants (`\\`, `\"`, `\n`).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pod_gets_a_sample_of_each_figure_it_has() {
        let a = PodFigures {
            pod_id: "sb1".into(),
            pod: "web".into(),
            namespace: "default".into(),
            vm_cpu_seconds: Some(1.5),
            vm_memory_bytes: Some(300 << 20),
            boot_seconds: Some(2.25),
            agent_ready_seconds: Some(1.0),
            agent_rtt_seconds: Some(0.002),
            execs: 3,
            shim_resident_bytes: Some(20 << 20),
            shim_cpu_seconds: Some(0.5),
            shim_threads: Some(6),
        };
        let b = PodFigures {
            pod_id: "sb2".into(),
            pod: "we\"ird\\name".into(),
            namespace: "k8s.io".into(),
            ..Default::default()
        };
        let node = NodeCounters {
            version: 1,
            boot_buckets: vec![1, 0, 2],
            boot_over: 1,
            boot_sum_seconds: 200.5,
            create_failures: [("invalid_argument".to_owned(), 3)].into(),
        };
        let text = render(&[a, b], Some(&node), 1);
        assert!(text.contains("vmlet_build_info{version=\""), "{text}");
        assert!(text.contains("vmlet_pod_boot_duration_seconds_bucket{le=\"0.25\"} 1\n"));
        assert!(
            text.contains("vmlet_pod_boot_duration_seconds_bucket{le=\"1\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("vmlet_pod_boot_duration_seconds_bucket{le=\"120\"} 3\n"));
        assert!(text.contains("vmlet_pod_boot_duration_seconds_bucket{le=\"+Inf\"} 4\n"));
        assert!(text.contains("vmlet_pod_boot_duration_seconds_count 4\n"));
        assert!(text.contains("vmlet_create_failures_total{reason=\"invalid_argument\"} 3\n"));
        assert!(!render(&[], None, 1).contains("vmlet_pod_boot_duration_seconds"));
        assert!(text.contains("vmlet_pods 2\n"), "{text}");
        assert!(text.contains("vmlet_scrape_errors 1\n"), "{text}");
        assert!(text.contains(
            "vmlet_pod_vm_memory_bytes{cri_name=\"web\",cri_namespace=\"default\",pod_id=\"sb1\"} 314572800\n"
        ));
        assert!(text.contains("vmlet_pod_execs_total{cri_name=\"we\\\"ird\\\\name\",cri_namespace=\"k8s.io\",pod_id=\"sb2\"} 0\n"), "{text}");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("vmlet_pod_boot_seconds{") && l.contains("sb2")),
            "no figure, no sample"
        );
        // Every family has its HELP and TYPE once.
        for f in FAMILIES {
            assert_eq!(text.matches(&format!("# TYPE {} ", f.name)).count(), 1);
        }
    }

    /// The first scrape measures the agent's round trip; the next ones get it as measured,
    /// and one that finds it old has it measured again behind its answer.
    #[tokio::test(start_paused = true)]
    async fn the_agents_round_trip_is_measured_once_then_in_the_background() {
        let fake = Arc::new(crate::task::fakes::FakeVm::default());
        let vm: Arc<dyn PodVm> = fake.clone();
        let dir = tempfile::tempdir().unwrap();
        let names = crate::host::pod_record::PodNames {
            name: "web".into(),
            namespace: "default".into(),
        };
        let socket = dir.path().join("p.sock");
        let meter =
            PodMeter::start(&vm, dir.path(), socket, names, Duration::from_secs(2), None).unwrap();
        let calls = || fake.guest.called("list_processes");
        assert!(meter.figures().await.agent_rtt_seconds.is_some());
        assert_eq!(calls(), 1);
        meter.figures().await;
        assert_eq!(calls(), 1, "a fresh measurement is kept");
        tokio::time::advance(RTT_REFRESH).await;
        assert!(meter.figures().await.agent_rtt_seconds.is_some());
        tokio::task::yield_now().await;
        assert_eq!(
            calls(),
            2,
            "an old one is measured again, behind the answer"
        );
        meter.stop();
    }

    #[test]
    fn the_shims_own_figures_are_read() {
        let me = ProcessFigures::of_self();
        assert!(me.resident_bytes.unwrap() > 0);
        assert!(me.threads.unwrap() >= 1);
        assert!(me.cpu_seconds.is_some());
    }
}
