//! OCI lifecycle hooks (runtime-spec `config.md`, "POSIX-platform Hooks") that run on the
//! host: `prestart` and `createRuntime` while the task is created (before the pod's VM
//! boots), `poststart` after its start, `poststop` after its deletion. The state they read
//! on stdin carries the PID of the pod's host process (see [`crate::host::netns_holder`]), whose
//! `/proc/PID/ns/net` is the pod network namespace: nerdctl's CNI hook wires the pod there.
//!
//! `createContainer` and `startContainer` hooks run in the container's namespaces, which
//! are inside the guest where host binaries cannot run: a spec with them is refused.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use oci_spec::runtime::{Hook, Spec};

use crate::host::host_command::{read_tail, spawn_and_wait, Finished};
use crate::Error;

/// The hooks vmlet runs (on the host), for `-info`; `createContainer` and `startContainer`
/// would have to run in the guest and are refused.
pub const SUPPORTED: &[&str] = &["prestart", "createRuntime", "poststart", "poststop"];
/// How long a hook may run when the spec gives no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// How much of a failed hook's output its error carries.
const OUTPUT_TAIL: usize = 2048;

/// The hooks of one task that run on the host, in the order they run.
#[derive(Debug, Clone, Default)]
pub struct HostHooks {
    /// `prestart` (deprecated, run first as runc does), then `createRuntime`.
    pub create: Vec<Hook>,
    pub poststart: Vec<Hook>,
    pub poststop: Vec<Hook>,
}

impl HostHooks {
    /// The spec's host hooks; a hook that would have to run in the guest, or a hook with a
    /// malformed environment entry or timeout, is refused naming it.
    pub fn from_spec(spec: &Spec) -> Result<Self, Error> {
        let Some(hooks) = spec.hooks() else {
            return Ok(Self::default());
        };
        for (kind, list) in [
            ("createContainer", hooks.create_container()),
            ("startContainer", hooks.start_container()),
        ] {
            if let Some(hook) = list.as_ref().and_then(|l| l.first()) {
                return Err(Error::Unimplemented(format!(
                    "the {kind} hook {} (it would run inside the VM)",
                    hook.path().display()
                )));
            }
        }
        let list = |l: &Option<Vec<Hook>>| l.clone().unwrap_or_default();
        #[allow(deprecated)]
        let mut create = list(hooks.prestart());
        create.extend(list(hooks.create_runtime()));
        let all = Self {
            create,
            poststart: list(hooks.poststart()),
            poststop: list(hooks.poststop()),
        };
        for hook in all.create.iter().chain(&all.poststart).chain(&all.poststop) {
            check(hook)?;
        }
        Ok(all)
    }

    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.poststart.is_empty() && self.poststop.is_empty()
    }
}

fn check(hook: &Hook) -> Result<(), Error> {
    let name = hook.path().display();
    if !hook.path().is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "hook path {name} is not absolute"
        )));
    }
    if let Some(bad) = hook
        .env()
        .iter()
        .flatten()
        .find(|kv| !kv.contains('=') || kv.starts_with('='))
    {
        return Err(Error::InvalidArgument(format!(
            "hook {name}: environment entry {bad:?} is not KEY=VALUE"
        )));
    }
    if matches!(hook.timeout(), Some(t) if t <= 0) {
        return Err(Error::InvalidArgument(format!(
            "hook {name}: timeout {} is not a positive number of seconds",
            hook.timeout().unwrap_or_default()
        )));
    }
    Ok(())
}

/// The OCI state a hook reads on its stdin.
#[derive(Debug, Clone)]
pub struct HookState {
    pub id: String,
    pub bundle: String,
    pub annotations: HashMap<String, String>,
    /// The pod's host process.
    pub pid: u32,
}

impl HookState {
    fn json(&self, status: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "ociVersion": "1.0.2",
            "id": self.id,
            "status": status,
            "pid": self.pid,
            "bundle": self.bundle,
            "annotations": self.annotations,
        }))
        .expect("a JSON object of strings serializes")
    }
}

/// Runs `hooks` in order with the state in `status` ("creating", "running", "stopped");
/// the first that fails (exit status, signal, timeout, cannot start) stops the rest and
/// its error names the hook, what happened and the tail of its output.
pub async fn run(hooks: &[Hook], state: &HookState, status: &str) -> Result<(), Error> {
    let input = state.json(status);
    for hook in hooks {
        run_one(hook, &input).await?;
    }
    Ok(())
}

/// Runs `hooks` like [`run`], but a failure is only logged and the others still run: what
/// the runtime spec asks for `poststart` and `poststop`.
pub async fn run_logged(hooks: &[Hook], state: &HookState, status: &str) {
    let input = state.json(status);
    for hook in hooks {
        if let Err(e) = run_one(hook, &input).await {
            log::warn!("{} (task {}; going on)", e.message(), state.id);
        }
    }
}

async fn run_one(hook: &Hook, input: &[u8]) -> Result<(), Error> {
    let path = hook.path().clone();
    let failed = |what: String| Error::Hook(format!("hook {}: {what}", path.display()));
    let timeout = hook
        .timeout()
        .map_or(DEFAULT_TIMEOUT, |t| Duration::from_secs(t as u64));
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("pipe", e.into()))?;
    let command = command(hook, out_w)?;
    let output = tokio::spawn(read_tail(out_r, OUTPUT_TAIL));
    let code = match spawn_and_wait(command, input.to_vec(), timeout).await {
        Ok(Finished::Exited(code)) => code,
        Ok(Finished::TimedOut) => {
            output.abort();
            return Err(failed(format!(
                "did not finish within {} s (killed)",
                timeout.as_secs()
            )));
        }
        Err(e) => {
            output.abort();
            return Err(failed(format!("cannot start: {e}")));
        }
    };
    if code == 0 {
        output.abort();
        return Ok(());
    }
    // The hook is gone; its output ends unless a process it left holds the pipe.
    let abort = output.abort_handle();
    let tail = match tokio::time::timeout(Duration::from_millis(500), output).await {
        Ok(Ok(tail)) => tail,
        _ => {
            abort.abort();
            String::new()
        }
    };
    Err(failed(format!(
        "exited with status {code}{}",
        if tail.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", tail.trim())
        }
    )))
}

/// The hook's command: its path, `args[0]` as argv[0], exactly its environment, the state
/// on stdin, stdout and stderr into `output`.
fn command(hook: &Hook, output: OwnedFd) -> Result<Command, Error> {
    let mut command = Command::new(hook.path());
    if let Some((argv0, rest)) = hook.args().as_deref().and_then(|a| a.split_first()) {
        command.arg0(argv0).args(rest);
    }
    command.env_clear();
    for kv in hook.env().iter().flatten() {
        let (k, v) = kv.split_once('=').expect("checked by HostHooks::from_spec");
        command.env(k, v);
    }
    let err = output
        .try_clone()
        .map_err(|e| Error::io("dup hook output pipe", e))?;
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::from(output))
        .stderr(Stdio::from(err))
        .current_dir("/");
    // The runtime's own umask (runc's hooks run under containerd's): not the shim's 077.
    // SAFETY: umask is an async-signal-safe system call, made in the forked child before
    // exec; nothing is allocated.
    unsafe {
        command.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn spec_with_hooks(hooks: &str) -> Spec {
        serde_json::from_str(&format!(
            r#"{{"ociVersion": "1.0.2", "root": {{"path": "rootfs"}}, "hooks": {hooks}}}"#
        ))
        .unwrap()
    }

    fn sh(script: &str, timeout: Option<i64>) -> Hook {
        let mut hook: Hook = serde_json::from_value(serde_json::json!({
            "path": "/bin/sh",
            "args": ["sh", "-c", script],
            "env": ["GREETING=hello there"],
        }))
        .unwrap();
        hook.set_timeout(timeout);
        hook
    }

    fn state() -> HookState {
        HookState {
            id: "c1".into(),
            bundle: "/run/bundle/c1".into(),
            annotations: HashMap::from([("k".into(), "v".into())]),
            pid: 4242,
        }
    }

    #[test]
    fn host_hooks_in_runc_order() {
        let spec = spec_with_hooks(
            r#"{"createRuntime": [{"path": "/b"}], "prestart": [{"path": "/a"}],
                "poststart": [{"path": "/c"}], "poststop": [{"path": "/d", "timeout": 5}]}"#,
        );
        let hooks = HostHooks::from_spec(&spec).unwrap();
        let paths = |l: &[Hook]| l.iter().map(|h| h.path().clone()).collect::<Vec<_>>();
        assert_eq!(paths(&hooks.create), ["/a", "/b"].map(PathBuf::from));
        assert_eq!(paths(&hooks.poststart), [PathBuf::from("/c")]);
        assert_eq!(paths(&hooks.poststop), [PathBuf::from("/d")]);
        assert!(HostHooks::from_spec(&spec_with_hooks("{}"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn guest_side_and_malformed_hooks_are_refused_by_name() {
        for (hooks, code, named) in [
            (
                r#"{"createContainer": [{"path": "/usr/bin/nvidia-hook"}]}"#,
                ttrpc::Code::UNIMPLEMENTED,
                "createContainer hook /usr/bin/nvidia-hook",
            ),
            (
                r#"{"startContainer": [{"path": "/x"}]}"#,
                ttrpc::Code::UNIMPLEMENTED,
                "startContainer hook /x",
            ),
            (
                r#"{"poststop": [{"path": "relative/hook"}]}"#,
                ttrpc::Code::INVALID_ARGUMENT,
                "relative/hook is not absolute",
            ),
            (
                r#"{"createRuntime": [{"path": "/h", "env": ["NOEQUALS"]}]}"#,
                ttrpc::Code::INVALID_ARGUMENT,
                "\"NOEQUALS\" is not KEY=VALUE",
            ),
            (
                r#"{"poststart": [{"path": "/h", "timeout": 0}]}"#,
                ttrpc::Code::INVALID_ARGUMENT,
                "hook /h: timeout 0",
            ),
        ] {
            let err = HostHooks::from_spec(&spec_with_hooks(hooks)).unwrap_err();
            assert_eq!(err.code(), code, "{hooks}");
            assert!(err.message().contains(named), "{}", err.message());
        }
    }

    #[tokio::test]
    async fn a_hook_reads_the_state_with_its_own_args_and_env() {
        let dir = std::env::temp_dir().join(format!("vmlet-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("seen");
        let hook = sh(
            &format!(
                r#"{{ cat; echo; echo "$0|$GREETING|${{HOME:-none}}"; }} > {}"#,
                out.display()
            ),
            None,
        );
        run(&[hook], &state(), "creating").await.unwrap();
        let seen = std::fs::read_to_string(&out).unwrap();
        let (json, rest) = seen.split_once('\n').unwrap();
        let json: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(json["id"], "c1");
        assert_eq!(json["pid"], 4242);
        assert_eq!(json["status"], "creating");
        assert_eq!(json["bundle"], "/run/bundle/c1");
        assert_eq!(json["annotations"]["k"], "v");
        assert_eq!(rest.trim(), "sh|hello there|none");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_failed_hook_is_named_with_its_status_and_output_and_stops_the_rest() {
        let dir = std::env::temp_dir().join(format!("vmlet-hook-fail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("second-ran");
        let hooks = [
            sh("echo cni: no such network >&2; exit 3", None),
            sh(&format!("touch {}", marker.display()), None),
        ];
        let err = run(&hooks, &state(), "creating").await.unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        let message = err.message();
        assert!(message.contains("hook /bin/sh"), "{message}");
        assert!(message.contains("status 3"), "{message}");
        assert!(message.contains("cni: no such network"), "{message}");
        assert!(!marker.exists());
        // Logged hooks go on past a failure.
        run_logged(&hooks, &state(), "stopped").await;
        assert!(marker.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_hook_past_its_timeout_is_killed() {
        let started = std::time::Instant::now();
        let err = run(&[sh("sleep 30", Some(1))], &state(), "creating")
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(err.message().contains("within 1 s"), "{}", err.message());
    }

    #[tokio::test]
    async fn a_hook_that_cannot_start_is_named() {
        let hook: Hook =
            serde_json::from_value(serde_json::json!({"path": "/nonexistent/hook"})).unwrap();
        let err = run(&[hook], &state(), "creating").await.unwrap_err();
        assert!(
            err.message().contains("/nonexistent/hook: cannot start"),
            "{}",
            err.message()
        );
    }
}
