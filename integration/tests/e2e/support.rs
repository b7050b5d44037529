//! What every area of the suite uses: the stack from the environment, process output as
//! text, and a CRI pod that is removed whatever the test did ([`PodUnderTest`]).

use std::time::{Duration, Instant};

use vmlet_integration::cri::Cri;
use vmlet_integration::{unique_id, Stack};

/// The stack `scripts/stack up` described in the environment; a test without one fails.
pub fn stack() -> Stack {
    Stack::from_env().expect("the vmlet stack")
}

/// `vmletctl ARGS` against the stack's node config, run to its end.
fn vmletctl_run(s: &Stack, args: &[&str]) -> std::process::Output {
    vmlet_integration::bounded::output(
        std::process::Command::new(format!("{}/bin/vmletctl", s.dir))
            .args(args)
            .env("VMLET_CONFIG", format!("{}/config.toml", s.dir)),
    )
    .unwrap()
}

/// `vmletctl ARGS` against the stack's node config; its stdout (it must succeed).
pub fn vmletctl(s: &Stack, args: &[&str]) -> String {
    let out = vmletctl_run(s, args);
    assert!(
        out.status.success(),
        "vmletctl {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Prometheus text `body` through a real parser (python3-prometheus-client's): `script` reads
/// the file argv[1] and prints what the test looks for; its output. Fails the test when the
/// parser does not take the text.
pub fn parsed_prometheus(s: &Stack, body: &str, script: &str) -> String {
    let file = format!("{}/{}.prom", s.dir, vmlet_integration::unique_id("scrape"));
    std::fs::write(&file, body).unwrap();
    let parsed = vmlet_integration::bounded::output(
        std::process::Command::new("/usr/bin/python3").args(["-c", script, &file]),
    )
    .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(
        parsed.status.success(),
        "not valid Prometheus text: {}\n{body}",
        text(&parsed.stderr)
    );
    text(&parsed.stdout)
}

/// `vmletctl ARGS` that must fail: what it said on stderr.
pub fn vmletctl_fails(s: &Stack, args: &[&str]) -> String {
    let out = vmletctl_run(s, args);
    assert!(!out.status.success(), "vmletctl {args:?} succeeded");
    text(&out.stderr)
}

/// A command's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A pod with handler `vmlet` and its log directory (removed on drop), removed by
/// [`PodUnderTest::finish`], or, when a test failed before that, by `crictl rmp -f` on drop,
/// so that a failed test leaves no VM running into the next ones.
pub struct PodUnderTest {
    pub cri: Cri,
    pub config: k8s_cri::v1::PodSandboxConfig,
    pub pod: String,
    pub logs: std::path::PathBuf,
    containerd: String,
    finished: bool,
}

impl Drop for PodUnderTest {
    fn drop(&mut self) {
        if !self.finished {
            let mut rmp = vmlet_integration::cri::crictl(&self.containerd);
            rmp.args(["rmp", "-f", &self.pod]);
            if let Err(e) = vmlet_integration::bounded::output(&mut rmp) {
                eprintln!("cri: removing pod {} after a failure: {e}", self.pod);
            }
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

impl PodUnderTest {
    pub async fn start(s: &Stack) -> Self {
        Self::start_with(s, |_| {}).await
    }

    /// A pod whose sandbox config `adjust` changed first.
    pub async fn start_with(
        s: &Stack,
        adjust: impl FnOnce(&mut k8s_cri::v1::PodSandboxConfig),
    ) -> Self {
        let mut cri = Cri::connect(&s.containerd).await.unwrap();
        let logs = std::env::temp_dir().join(unique_id("vmlet-cri-logs"));
        std::fs::create_dir_all(&logs).unwrap();
        let mut config = Cri::pod_config(
            &unique_id("cri"),
            &unique_id("uid"),
            &logs.to_string_lossy(),
        );
        adjust(&mut config);
        let pod = cri.run_pod(&config, "vmlet").await.unwrap();
        Self {
            cri,
            config,
            pod,
            logs,
            containerd: s.containerd.clone(),
            finished: false,
        }
    }

    /// CreateContainer + StartContainer in this pod, with a memory limit (0: none).
    pub async fn container(&mut self, name: &str, image: &str, cmd: &[&str], limit: i64) -> String {
        let (pod, config) = (self.pod.clone(), self.config.clone());
        self.cri
            .create_and_start_limited(&pod, &config, name, image, cmd, limit)
            .await
            .unwrap()
    }

    /// Polls ContainerStatus until the container has exited (60 s at most).
    pub async fn wait_exited(&mut self, id: &str) -> k8s_cri::v1::ContainerStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.cri.container_status(id).await.unwrap();
            if status.state == k8s_cri::v1::ContainerState::ContainerExited as i32
                || Instant::now() > deadline
            {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn finish(mut self, containers: &[&str]) {
        for c in containers {
            self.cri.remove_container(c, 2).await.unwrap();
        }
        self.cri.remove_pod(&self.pod).await.unwrap();
        self.finished = true;
    }
}

/// `scripts/stack COMMAND` against the test's stack; it must succeed.
pub fn stack_script(s: &Stack, command: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/stack");
    let out = vmlet_integration::bounded::output(
        std::process::Command::new(script)
            .arg(command)
            .env("VMLET_STACK_DIR", &s.dir),
    )
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}
