//! The QEMU guest agent of a VM image (`qemu-ga` on the virtio-serial port
//! `org.qemu.guest_agent.0`), through which a VM-mode pod runs an exec
//! (docs/vm-mode.md): `guest-exec` with its output captured, then `guest-exec-status`
//! until the process has exited. The guest runs the agent, so everything it answers is
//! untrusted: lines of at most [`MAX_LINE`] bytes, each call within [`ANSWER_DEADLINE`],
//! and every call is preceded by `guest-sync-delimited`, so that an answer left over from
//! a call that timed out is never taken for the next one's.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::devices::qmp_lines::{LineError, Lines};
use crate::Error;

/// The virtio-serial port's name the agent listens on.
pub const PORT_NAME: &str = "org.qemu.guest_agent.0";
/// How long the agent may take to answer one call.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// The longest answer read: an exec's output comes base64-encoded in one line, so an exec
/// prints at most about 1.5 MiB through the guest agent (more is an error that says so).
pub const MAX_LINE: usize = 2 << 20;
/// Lines skipped while looking for a sync's answer (what a timed-out call left behind).
const MAX_STALE_LINES: usize = 16;

/// What an exec left when it exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The agent cut the output short (its own limit).
    pub truncated: bool,
}

/// A connection to the guest agent; one call at a time.
pub struct GuestAgent {
    lines: Lines<OwnedReadHalf>,
    write: OwnedWriteHalf,
    next_sync: u32,
}

fn no_agent(why: &str) -> Error {
    Error::FailedPrecondition(format!(
        "the VM image's QEMU guest agent ({PORT_NAME}) {why}: an exec in a VM-mode pod needs qemu-guest-agent running in the image"
    ))
}

impl GuestAgent {
    pub fn new(stream: UnixStream) -> Self {
        let (read, write) = stream.into_split();
        GuestAgent {
            lines: Lines::new(read, MAX_LINE),
            write,
            next_sync: u32::from_le_bytes(rand_bytes()),
        }
    }

    /// Runs `command` (its first word the program, found on the guest's PATH) with the
    /// environment `env` (`NAME=value`), its output captured; returns the guest's PID.
    pub async fn exec(&mut self, command: &[String], env: &[String]) -> Result<i64, Error> {
        let (path, args) = command
            .split_first()
            .ok_or_else(|| Error::InvalidArgument("an exec with no command".into()))?;
        let answer = self
            .call(
                "guest-exec",
                json!({"path": path, "arg": args, "env": env, "capture-output": true}),
            )
            .await?;
        answer["pid"].as_i64().ok_or_else(|| {
            Error::Internal(format!("guest-exec answered {} (no pid)", shown(&answer)))
        })
    }

    /// The exec `pid`'s outcome once it has exited; `None` while it runs.
    pub async fn exec_status(&mut self, pid: i64) -> Result<Option<ExecOutcome>, Error> {
        let answer = self.call("guest-exec-status", json!({"pid": pid})).await?;
        exec_outcome(&answer)
    }

    /// `execute` with `arguments`, after a sync: its `return` value, or the agent's error.
    async fn call(&mut self, execute: &str, arguments: Value) -> Result<Value, Error> {
        tokio::time::timeout(ANSWER_DEADLINE, self.sync())
            .await
            .map_err(|_| no_agent(&format!("did not answer within {ANSWER_DEADLINE:?}")))??;
        let line = json!({"execute": execute, "arguments": arguments}).to_string() + "\n";
        let answer = tokio::time::timeout(ANSWER_DEADLINE, async {
            self.send(&line).await?;
            self.read().await
        })
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "{execute}: the guest agent did not answer within {ANSWER_DEADLINE:?}"
            ))
        })??;
        if let Some(error) = answer.get("error") {
            let desc = error["desc"].as_str().unwrap_or("no description");
            return Err(Error::FailedPrecondition(format!(
                "{execute} in the guest: {}",
                crate::guest::guest_text::clean(desc, 500)
            )));
        }
        answer.get("return").cloned().ok_or_else(|| {
            Error::Internal(format!(
                "{execute}: the guest agent answered {}",
                shown(&answer)
            ))
        })
    }

    /// `guest-sync-delimited`: reads until its answer (after the 0xFF the agent puts before
    /// it), skipping what an earlier call left.
    async fn sync(&mut self) -> Result<(), Error> {
        let id = self.next_sync;
        self.next_sync = self.next_sync.wrapping_add(1);
        let line = json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}).to_string();
        // A 0xFF first resets the agent's parser, should a call have been cut short.
        let mut bytes = vec![0xff];
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.write
            .write_all(&bytes)
            .await
            .map_err(|e| no_agent(&format!("cannot be written to: {e}")))?;
        for _ in 0..MAX_STALE_LINES {
            let answer = self.read().await?;
            if answer.get("return").and_then(Value::as_u64) == Some(u64::from(id)) {
                return Ok(());
            }
        }
        Err(no_agent("answered something else than the sync"))
    }

    async fn send(&mut self, line: &str) -> Result<(), Error> {
        self.write
            .write_all(line.as_bytes())
            .await
            .map_err(|e| no_agent(&format!("cannot be written to: {e}")))
    }

    /// The next answer, a JSON object (the delimiter and anything before the first `{`
    /// dropped).
    async fn read(&mut self) -> Result<Value, Error> {
        loop {
            match self.lines.next().await {
                None => return Err(no_agent("closed its port")),
                Some(Err(LineError::TooLong)) => {
                    return Err(Error::ResourceExhausted(format!(
                        "the guest agent's answer is longer than {MAX_LINE} bytes (an exec's output through it is at most about 1.5 MiB)"
                    )))
                }
                Some(Err(LineError::Io(e))) => return Err(no_agent(&format!("cannot be read: {e}"))),
                Some(Ok(line)) => {
                    let Some(start) = line.find('{') else { continue };
                    return serde_json::from_str(&line[start..]).map_err(|e| {
                        Error::Internal(format!("the guest agent sent something that is not JSON: {e}"))
                    });
                }
            }
        }
    }
}

/// An exec's outcome from `guest-exec-status`'s answer.
fn exec_outcome(answer: &Value) -> Result<Option<ExecOutcome>, Error> {
    if answer["exited"] != json!(true) {
        return Ok(None);
    }
    let data = |key: &str| -> Result<Vec<u8>, Error> {
        match answer.get(key).and_then(Value::as_str) {
            None => Ok(Vec::new()),
            Some(text) => base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| {
                    Error::Internal(format!("guest-exec-status: {key} is not base64: {e}"))
                }),
        }
    };
    // A process ended by a signal has `signal` and no `exitcode`: 128 + the signal, as a
    // shell reports it.
    let exit_code = match (answer["exitcode"].as_i64(), answer["signal"].as_i64()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => {
            return Err(Error::Internal(format!(
                "guest-exec-status answered {} (exited, with neither exitcode nor signal)",
                shown(answer)
            )))
        }
    };
    Ok(Some(ExecOutcome {
        exit_code: i32::try_from(exit_code).unwrap_or(i32::MAX),
        stdout: data("out-data")?,
        stderr: data("err-data")?,
        truncated: answer["out-truncated"] == json!(true) || answer["err-truncated"] == json!(true),
    }))
}

fn shown(value: &Value) -> String {
    crate::guest::guest_text::clean(&value.to_string(), 200)
}

fn rand_bytes() -> [u8; 4] {
    let mut bytes = [0u8; 4];
    // Only to tell this shim's syncs from stale answers: any value does.
    let _ = getrandom::getrandom(&mut bytes);
    bytes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader};

    /// A guest agent that answers each request with `answer(request)` (after the sync's
    /// answer, which it gives as qemu-ga does: 0xFF, then the JSON).
    pub(crate) fn fake_agent(
        answer: impl Fn(&Value) -> Option<String> + Send + 'static,
    ) -> GuestAgent {
        let (ours, theirs) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let (read, mut write) = theirs.into_split();
            let mut lines = BufReader::new(read).split(b'\n');
            while let Ok(Some(line)) = lines.next_segment().await {
                let start = line.iter().position(|b| *b == b'{').unwrap_or(0);
                let request: Value = serde_json::from_slice(&line[start..]).unwrap();
                if request["execute"] == "guest-sync-delimited" {
                    let mut reply = vec![0xff];
                    reply.extend_from_slice(
                        json!({"return": request["arguments"]["id"]})
                            .to_string()
                            .as_bytes(),
                    );
                    reply.push(b'\n');
                    write.write_all(&reply).await.unwrap();
                } else if let Some(reply) = answer(&request) {
                    write.write_all(reply.as_bytes()).await.unwrap();
                }
            }
        });
        GuestAgent::new(ours)
    }

    #[tokio::test]
    async fn an_exec_runs_and_its_output_and_code_are_read() {
        let mut agent = fake_agent(|request| {
            Some(match request["execute"].as_str().unwrap() {
                "guest-exec" => {
                    assert_eq!(request["arguments"]["path"], "cat");
                    assert_eq!(request["arguments"]["arg"], json!(["/etc/hostname"]));
                    assert_eq!(request["arguments"]["capture-output"], true);
                    "{\"return\": {\"pid\": 42}}\n".into()
                }
                _ => "{\"return\": {\"exited\": true, \"exitcode\": 3, \"out-data\": \"d2ViLTAK\"}}\n".into(),
            })
        });
        let command = ["cat".to_string(), "/etc/hostname".to_string()];
        let pid = agent.exec(&command, &[]).await.unwrap();
        assert_eq!(pid, 42);
        let outcome = agent.exec_status(pid).await.unwrap().unwrap();
        assert_eq!(outcome.exit_code, 3);
        assert_eq!(outcome.stdout, b"web-0\n");
        assert!(outcome.stderr.is_empty());
    }

    #[tokio::test]
    async fn a_running_exec_and_a_signalled_one() {
        let running = json!({"exited": false});
        assert_eq!(exec_outcome(&running).unwrap(), None);
        let killed = json!({"exited": true, "signal": 9});
        assert_eq!(exec_outcome(&killed).unwrap().unwrap().exit_code, 137);
        let bad = json!({"exited": true, "exitcode": 0, "out-data": "not base64!"});
        assert!(exec_outcome(&bad)
            .unwrap_err()
            .to_string()
            .contains("out-data"));
    }

    #[tokio::test]
    async fn a_stale_answer_is_skipped_and_the_agents_error_is_named() {
        let mut agent = fake_agent(|_| {
            Some("{\"error\": {\"class\": \"GenericError\", \"desc\": \"Failed to execute child process \\u001b[31mnope\"}}\n".into())
        });
        let err = agent.exec(&["nope".into()], &[]).await.unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(
            err.to_string().contains("Failed to execute child process"),
            "{err}"
        );
        assert!(!err.to_string().contains('\u{1b}'), "cleaned: {err}");
    }

    #[tokio::test]
    async fn no_agent_in_the_image_is_said_within_the_deadline() {
        let (ours, _silent) = UnixStream::pair().unwrap();
        let mut agent = GuestAgent::new(ours);
        tokio::time::pause();
        let err = agent.exec(&["true".into()], &[]).await.unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::FAILED_PRECONDITION);
        assert!(err.to_string().contains("needs qemu-guest-agent"), "{err}");
    }
}
