//! Helpers for vmlet's end-to-end tests and benchmarks. They drive the real clients (`ctr`,
//! `virsh`) against the private stack that `scripts/stack up` started; its export lines
//! must be in the environment. Without them every test fails loudly: nothing passes by
//! skipping.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub mod bounded;
pub mod cluster;
pub mod cri;
pub mod direct_vm;
pub mod figures;
pub mod terminal;
pub mod testnet;

/// The runtime name tests ask containerd for.
pub const RUNTIME: &str = "io.containerd.vmlet.v2";

/// The stack's coordinates, from `scripts/stack env`.
#[derive(Debug, Clone)]
pub struct Stack {
    pub dir: String,
    pub containerd: String,
    pub libvirt_uri: String,
    pub image: String,
    pub guest_dir: String,
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: start the stack with `eval \"$(scripts/stack up)\"` (make test does)")
    })
}

impl Stack {
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            dir: var("VMLET_STACK_DIR")?,
            containerd: var("CONTAINERD_ADDRESS")?,
            libvirt_uri: var("LIBVIRT_DEFAULT_URI")?,
            image: var("VMLET_TEST_IMAGE")?,
            guest_dir: var("VMLET_GUEST_DIR")?,
        })
    }

    /// `nerdctl` against the stack's containerd, namespace `default`, with its data and CNI
    /// configuration under the stack directory, run in the stack's node network namespace
    /// (where containerd and so the shims, which run nerdctl's CNI hook, live).
    pub fn nerdctl(&self) -> Command {
        let node = std::env::var("VMLET_NODE_NETNS").unwrap_or_default();
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{node}"))
            .arg("nerdctl")
            .args(["--address", &self.containerd, "--namespace", "default"])
            .args(["--data-root", &format!("{}/nerdctl/data", self.dir)])
            .args(["--cni-path", "/usr/lib/cni"])
            .args(["--cni-netconfpath", &format!("{}/nerdctl/net.d", self.dir)]);
        c
    }

    /// Runs `nerdctl ARGS` to completion with no stdin, within [`bounded::COMMAND_TIMEOUT`].
    pub fn nerdctl_output(&self, args: &[&str]) -> anyhow::Result<Output> {
        bounded::output(self.nerdctl().args(args))
    }

    /// `ctr` against the stack's containerd, namespace `default`.
    pub fn ctr(&self) -> Command {
        let mut c = Command::new("ctr");
        c.args(["-a", &self.containerd, "-n", "default"]);
        c
    }

    /// Runs `ctr ARGS` to completion with no stdin, within [`bounded::COMMAND_TIMEOUT`].
    pub fn ctr_output(&self, args: &[&str]) -> anyhow::Result<Output> {
        bounded::output(self.ctr().args(args))
    }

    /// `ctr run --rm --runtime vmlet IMAGE ID ARGS...`, returning its output.
    pub fn run(&self, id: &str, extra: &[&str], command: &[&str]) -> anyhow::Result<Output> {
        let mut args = vec!["run", "--rm", "--runtime", RUNTIME];
        args.extend_from_slice(extra);
        args.push(&self.image);
        args.push(id);
        args.extend_from_slice(command);
        self.ctr_output(&args)
    }

    /// `ctr run -d --runtime vmlet IMAGE ID COMMAND...`, then waits (60 s at most) until
    /// `ctr task ls` shows it RUNNING.
    pub fn run_detached(&self, id: &str, command: &[&str]) -> anyhow::Result<()> {
        self.run_detached_with(id, &[], command)
    }

    /// [`Stack::run_detached`] with `extra` `ctr run` options (before the image).
    pub fn run_detached_with(
        &self,
        id: &str,
        extra: &[&str],
        command: &[&str],
    ) -> anyhow::Result<()> {
        let mut args = vec!["run", "-d", "--runtime", RUNTIME];
        args.extend_from_slice(extra);
        args.extend([self.image.as_str(), id]);
        args.extend_from_slice(command);
        let out = self.ctr_output(&args)?;
        if !out.status.success() {
            bail!("ctr run -d {id}: {}", String::from_utf8_lossy(&out.stderr));
        }
        self.wait_status(id, "RUNNING", Duration::from_secs(60))
    }

    /// Starts an attached `ctr run --rm --runtime vmlet EXTRA... IMAGE ID COMMAND...` with no
    /// stdin and piped output.
    pub fn spawn_run(&self, id: &str, extra: &[&str], command: &[&str]) -> anyhow::Result<Child> {
        self.ctr()
            .args(["run", "--rm", "--runtime", RUNTIME])
            .args(extra)
            .args([self.image.as_str(), id])
            .args(command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn ctr run")
    }

    /// Starts `ctr events`; [`Events::stop`] returns what it printed.
    pub fn watch_events(&self) -> anyhow::Result<Events> {
        let child = self
            .ctr()
            .arg("events")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start ctr events")?;
        Ok(Events(child))
    }

    /// The status column of `ctr task ls` for `id`, if it is listed.
    pub fn task_status(&self, id: &str) -> anyhow::Result<Option<String>> {
        let out = self.ctr_output(&["task", "ls"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.first() == Some(&id))
            .and_then(|cols| cols.last().map(|s| s.to_string())))
    }

    /// Waits until `ctr task ls` shows `id` in `status`.
    pub fn wait_status(&self, id: &str, status: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.task_status(id)?;
            if now.as_deref() == Some(status) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("task {id} is {now:?}, not {status}, after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ends a detached task: SIGKILL, wait until `ctr task ls` shows it STOPPED, delete the
    /// task and its container. The error names the step that failed.
    pub fn kill_and_remove(&self, id: &str) -> anyhow::Result<()> {
        let step = |args: &[&str]| -> anyhow::Result<()> {
            let out = self.ctr_output(args)?;
            if !out.status.success() {
                bail!(
                    "ctr {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        };
        step(&["task", "kill", "-s", "SIGKILL", id])?;
        self.wait_status(id, "STOPPED", Duration::from_secs(30))?;
        step(&["task", "delete", id])?;
        step(&["container", "rm", id])
    }

    /// containerd's log so far (the shims' lines among it).
    pub fn containerd_log(&self) -> String {
        std::fs::read_to_string(format!("{}/containerd/containerd.log", self.dir))
            .unwrap_or_default()
    }

    /// Names of the libvirt domains vmlet owns on the stack's libvirtd.
    pub fn vmlet_domains(&self) -> anyhow::Result<Vec<String>> {
        let out = bounded::output(Command::new("virsh").args([
            "-c",
            &self.libvirt_uri,
            "list",
            "--all",
            "--name",
        ]))?;
        if !out.status.success() {
            bail!("virsh list: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("vmlet-"))
            .map(str::to_owned)
            .collect())
    }

    /// The pods' VMs as `vmlet-POD`, whichever launcher started them: libvirt's domains
    /// and the QEMUs the shims started themselves (by `guest=vmlet-POD` on their command
    /// line), each once.
    pub fn pod_vms(&self) -> anyhow::Result<Vec<String>> {
        let mut vms = self.vmlet_domains()?;
        for (_, cmdline) in self.stack_processes() {
            let name = cmdline
                .split_once("guest=")
                .and_then(|(_, rest)| rest.split([',', ' ']).next())
                .filter(|name| name.starts_with("vmlet-"));
            if let Some(name) = name.filter(|n| !vms.iter().any(|v| v == n)) {
                vms.push(name.to_owned());
            }
        }
        Ok(vms)
    }

    /// Whether the VM of pod `pod_id` is still there, whichever launcher started it: a
    /// domain of libvirt's (running or only defined), or a QEMU the shim started.
    pub fn has_pod_domain(&self, pod_id: &str) -> bool {
        let name = format!("vmlet-{pod_id}");
        self.pod_vms().expect("the pods' VMs").contains(&name)
    }

    /// Processes of the kinds vmlet starts (QEMU, virtiofsd, vhost-device-vsock, shims)
    /// that belong to this stack: `(pid, command line)`.
    pub fn stack_processes(&self) -> Vec<(u32, String)> {
        let mut found = Vec::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return found;
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            let kind = [
                "qemu-system",
                "virtiofsd",
                "vhost-device-vsock",
                "containerd-shim-vmlet",
            ]
            .iter()
            .any(|k| cmdline.contains(k));
            if kind && cmdline.contains(&self.dir) {
                found.push((pid, cmdline));
            }
        }
        found
    }

    /// The host processes of one pod: its QEMU, virtiofsd, vhost-device-vsock and shim.
    pub fn pod_processes(&self, pod_id: &str) -> Vec<(u32, String)> {
        let state = format!("{}/state/{pod_id}/", self.dir);
        let domain = format!("guest=vmlet-{pod_id},");
        let shim = format!("-id {pod_id} ");
        self.stack_processes()
            .into_iter()
            .filter(|(_, c)| c.contains(&state) || c.contains(&domain) || c.contains(&shim))
            .collect()
    }

    /// Mount points below the shim's state dir (the state dir's own bind excluded).
    pub fn state_mounts(&self) -> Vec<String> {
        let state = format!("{}/state/", self.dir);
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
            .filter(|m| m.starts_with(&state))
            .collect()
    }
}

/// A running `ctr events`.
pub struct Events(Child);

impl Events {
    /// Gives late events a moment, stops `ctr events` and returns its lines.
    pub fn stop(mut self) -> anyhow::Result<String> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.0.kill();
        let out = bounded::output_within(self.0, bounded::COMMAND_TIMEOUT, "ctr events")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Resident memory of a process in KiB (`VmRSS`), 0 when it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    proc_kib(&format!("/proc/{pid}/status"), "VmRSS:").unwrap_or(0)
}

/// Proportional set size of a process in KiB (`Pss` of `smaps_rollup`: each shared page
/// counted once across the processes that map it), 0 when it is gone.
pub fn pss_kib(pid: u32) -> u64 {
    proc_kib(&format!("/proc/{pid}/smaps_rollup"), "Pss:").unwrap_or(0)
}

/// The number after `key` on its line of `path` (a `/proc` file in kB: `status`,
/// `smaps_rollup`, `meminfo`); `None` when the file or the line is absent.
pub fn proc_kib(path: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
}

/// CPU time (user + system) a process used so far, in clock ticks, 0 when it is gone.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    field(11) + field(12)
}

/// A container id unique within this test run.
pub fn unique_id(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The stack's node config (`VMLET_CONFIG`, read by the shim at every create) replaced for
/// a test; the original is put back when dropped, also when the test fails.
pub struct ConfigSwap {
    path: String,
    original: String,
}

impl ConfigSwap {
    pub fn with(text: &str) -> Self {
        let path = std::env::var("VMLET_CONFIG").expect("VMLET_CONFIG: the stack's config");
        let original = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text).unwrap();
        Self { path, original }
    }

    /// The stack's config replaced by `edit` of its text.
    pub fn edited(edit: impl FnOnce(&str) -> String) -> Self {
        let path = std::env::var("VMLET_CONFIG").expect("VMLET_CONFIG: the stack's config");
        let original = std::fs::read_to_string(path).unwrap();
        Self::with(&edit(&original))
    }

    pub fn original(&self) -> &str {
        &self.original
    }
}

/// `launcher = "direct"` in the stack's config while it lives (whatever it said before).
pub fn direct_launcher() -> ConfigSwap {
    ConfigSwap::edited(|c| {
        let rest: Vec<&str> = c.lines().filter(|l| !l.starts_with("launcher")).collect();
        format!("launcher = \"direct\"\n{}\n", rest.join("\n"))
    })
}

/// `launcher = "libvirt"` in the stack's config while it lives (whatever it said before):
/// for what only the libvirt launcher does (its domain directory, its DAC labels).
pub fn libvirt_launcher() -> ConfigSwap {
    ConfigSwap::edited(|c| {
        let rest: Vec<&str> = c.lines().filter(|l| !l.starts_with("launcher")).collect();
        format!("launcher = \"libvirt\"\n{}\n", rest.join("\n"))
    })
}

/// Template starts on in the stack's config while it lives, their saved guests in a private
/// directory of its own (removed after the config is restored).
pub struct TemplatesOn {
    // Dropped in this order: the config first, then the directory.
    _config: ConfigSwap,
    _dir: direct_vm::PrivateDir,
}

impl TemplatesOn {
    /// `prefix` names the directory.
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        let dir = direct_vm::PrivateDir::new(prefix)?;
        let store = dir.join("store");
        let config = ConfigSwap::edited(|c| {
            format!(
                "{c}\n[templates]\nenabled = true\ndir = \"{}\"\n",
                store.display()
            )
        });
        Ok(TemplatesOn {
            _config: config,
            _dir: dir,
        })
    }
}

impl Drop for ConfigSwap {
    fn drop(&mut self) {
        std::fs::write(&self.path, &self.original).unwrap();
    }
}
