//! The single-node Kubernetes cluster `scripts/k8s up` runs on the stack: kubectl against
//! it, run in the stack's node network namespace (where the API server listens).

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::bounded;

/// The cluster's coordinates, from `scripts/k8s env`.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub kubectl: String,
    pub kubeconfig: String,
    pub node: String,
    node_netns: String,
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: start the cluster with `eval \"$(scripts/k8s up)\"` on the stack (make test does)")
    })
}

impl Cluster {
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Cluster {
            kubectl: var("VMLET_KUBECTL")?,
            kubeconfig: var("VMLET_KUBECONFIG")?,
            node: var("VMLET_K8S_NODE")?,
            node_netns: var("VMLET_NODE_NETNS")?,
        })
    }

    /// `kubectl` against the cluster.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.node_netns, &self.kubectl])
            .args(["--kubeconfig", &self.kubeconfig]);
        c
    }

    /// `kubectl ARGS` to completion within `timeout`.
    pub fn run(&self, args: &[&str], timeout: Duration) -> anyhow::Result<Output> {
        self.complete(args, None, timeout)
    }

    /// `kubectl ARGS` with `input` (if any) on its stdin, to completion within `timeout`.
    fn complete(
        &self,
        args: &[&str],
        input: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<Output> {
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn kubectl")?;
        if let Some(input) = input {
            // Dropped at the end of the statement: kubectl sees its stdin end.
            child
                .stdin
                .take()
                .context("kubectl's stdin")?
                .write_all(input.as_bytes())?;
        }
        bounded::output_within(child, timeout, &format!("kubectl {}", args.join(" ")))
    }

    /// `kubectl ARGS`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args, bounded::COMMAND_TIMEOUT)?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl get OBJECT... [-n NAMESPACE] -o jsonpath=PATH`: the field's text.
    pub fn jsonpath(
        &self,
        object: &[&str],
        namespace: Option<&str>,
        path: &str,
    ) -> anyhow::Result<String> {
        let path = format!("jsonpath={path}");
        let mut args = vec!["get"];
        args.extend_from_slice(object);
        if let Some(ns) = namespace {
            args.extend_from_slice(&["-n", ns]);
        }
        args.extend_from_slice(&["-o", &path]);
        self.ok(&args)
    }

    /// What `kubectl ARGS` (a command that runs on, such as `logs -f`) prints until `done`
    /// holds for it or `deadline` has passed; it is then stopped. The caller checks `done`
    /// again: a slow node gets the whole deadline, not a fixed window.
    pub fn output_until(
        &self,
        args: &[&str],
        deadline: Duration,
        done: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        use std::io::Read;
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn kubectl")?;
        let mut stdout = child.stdout.take().context("kubectl's stdout")?;
        let (chunks, arrived) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                if chunks.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let until = std::time::Instant::now() + deadline;
        let mut text = Vec::new();
        while !done(&String::from_utf8_lossy(&text)) {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match arrived.recv_timeout(left) {
                Ok(chunk) => text.extend_from_slice(&chunk),
                // The deadline, or kubectl ended.
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    /// `kubectl ARGS` with `input` on its stdin, to completion.
    pub fn with_input(&self, args: &[&str], input: &str) -> anyhow::Result<Output> {
        self.complete(args, Some(input), bounded::COMMAND_TIMEOUT)
    }

    /// The same cluster as the holder of `token` (a service account's) alone: a kubeconfig
    /// of the API server's address and CA with that token, written to `path`.
    pub fn as_token(&self, token: &str, path: &std::path::Path) -> anyhow::Result<Cluster> {
        let field = |f: &str| {
            self.ok(&[
                "config",
                "view",
                "--raw",
                "-o",
                &format!("jsonpath={{.clusters[0].cluster.{f}}}"),
            ])
        };
        let (server, ca) = (field("server")?, field("certificate-authority")?);
        if server.is_empty() || ca.is_empty() {
            bail!("the admin kubeconfig names no server or CA file");
        }
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
        );
        std::fs::write(path, config).context("write the token's kubeconfig")?;
        Ok(Cluster {
            kubeconfig: path.to_string_lossy().into_owned(),
            ..self.clone()
        })
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let out = self.with_input(&["apply", "-f", "-"], yaml)?;
        if !out.status.success() {
            bail!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}
