//! The QEMU guest agent of a VM image (`qemu-ga` on the virtio-serial port
//! `org.qemu.guest_agent.0`), through which a VM-mode pod runs an exec
//! (docs/vm-mode.md): `guest-exec` with its output captured, then `guest-exec-status`
//! until the process has exited. The guest runs the agent, so everything it answers is
//! untrusted: lines of at most [`MAX_LINE`] bytes, each call within [`ANSWER_DEADLINE`],
//! and every call is preceded by `guest-sync-delimited`, so that an answer left over from
//! a call that timed out is never taken for the next one's.

use std::time::Duration;

use base64::Engine;
use serde::de::DeserializeOwned;
use serde::Deserialize;
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

/// What an exec left when it exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The agent cut the output short (its own limit).
    pub truncated: bool,
}

/// An answer of the agent, typed: unknown fields are skipped, never built into values.
#[derive(Debug, Deserialize)]
struct Answer<T> {
    #[serde(rename = "return")]
    ret: Option<T>,
    error: Option<AgentError>,
}

#[derive(Debug, Deserialize)]
struct AgentError {
    desc: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Started {
    pid: i64,
}

#[derive(Debug, Deserialize)]
struct Status {
    exited: bool,
    exitcode: Option<i64>,
    signal: Option<i64>,
    #[serde(rename = "out-data")]
    out_data: Option<String>,
    #[serde(rename = "err-data")]
    err_data: Option<String>,
    #[serde(rename = "out-truncated", default)]
    out_truncated: bool,
    #[serde(rename = "err-truncated", default)]
    err_truncated: bool,
}

/// A sync's answer: its id.
#[derive(Debug, Deserialize)]
struct Synced {
    #[serde(rename = "return")]
    ret: Option<u64>,
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
        let started: Started = self
            .call(
                "guest-exec",
                json!({"path": path, "arg": args, "env": env, "capture-output": true}),
            )
            .await?;
        Ok(started.pid)
    }

    /// The exec `pid`'s outcome once it has exited; `None` while it runs.
    pub async fn exec_status(&mut self, pid: i64) -> Result<Option<ExecOutcome>, Error> {
        let status: Status = self.call("guest-exec-status", json!({"pid": pid})).await?;
        exec_outcome(status)
    }

    /// Asks the guest to send `signal` to its process `pid` (a `kill` the agent runs; its
    /// own output is not collected).
    pub async fn kill(&mut self, pid: i64, signal: u32) -> Result<(), Error> {
        let _: Started = self
            .call(
                "guest-exec",
                json!({"path": "kill", "arg": [format!("-{signal}"), pid.to_string()]}),
            )
            .await?;
        Ok(())
    }

    /// `execute` with `arguments`, after a sync: its `return` value, or the agent's error.
    async fn call<T: DeserializeOwned>(
        &mut self,
        execute: &str,
        arguments: Value,
    ) -> Result<T, Error> {
        tokio::time::timeout(ANSWER_DEADLINE, self.sync())
            .await
            .map_err(|_| no_agent(&format!("did not answer within {ANSWER_DEADLINE:?}")))??;
        let line = json!({"execute": execute, "arguments": arguments}).to_string() + "\n";
        let answer: Answer<T> = tokio::time::timeout(ANSWER_DEADLINE, async {
            self.send_bytes(line.as_bytes()).await?;
            let line = self.read_line().await?;
            serde_json::from_str(&line).map_err(|e| {
                Error::Internal(format!(
                    "{execute}: the guest agent's answer does not parse: {e}"
                ))
            })
        })
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "{execute}: the guest agent did not answer within {ANSWER_DEADLINE:?} (the command may still run in the guest)"
            ))
        })??;
        if let Some(error) = answer.error {
            let desc = error.desc.unwrap_or_else(|| "no description".into());
            return Err(Error::FailedPrecondition(format!(
                "{execute} in the guest: {}",
                crate::guest::guest_text::clean(&desc, 500)
            )));
        }
        answer
            .ret
            .ok_or_else(|| Error::Internal(format!("{execute}: the guest agent answered nothing")))
    }

    /// `guest-sync-delimited`: reads until its answer, skipping whatever comes before it
    /// (an earlier call's answer, a line too long or not JSON); the caller's deadline ends
    /// the search.
    async fn sync(&mut self) -> Result<(), Error> {
        let id = self.next_sync;
        self.next_sync = self.next_sync.wrapping_add(1);
        let line = json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}).to_string();
        // A 0xFF first resets the agent's parser, should a call have been cut short.
        let mut bytes = vec![0xff];
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.send_bytes(&bytes).await?;
        loop {
            let line = match self.read_line().await {
                Ok(line) => line,
                Err(e) if e.code() == ttrpc::Code::RESOURCE_EXHAUSTED => continue,
                Err(e) => return Err(e),
            };
            if let Ok(Synced { ret: Some(answer) }) = serde_json::from_str(&line) {
                if answer == u64::from(id) {
                    return Ok(());
                }
            }
        }
    }

    async fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.write
            .write_all(bytes)
            .await
            .map_err(|e| no_agent(&format!("cannot be written to: {e}")))
    }

    /// The next line from its first `{` (the delimiter and anything before it dropped).
    async fn read_line(&mut self) -> Result<String, Error> {
        loop {
            match self.lines.next().await {
                None => return Err(no_agent("closed its port")),
                Some(Err(LineError::TooLong)) => {
                    return Err(Error::ResourceExhausted(format!(
                        "the guest agent's answer is longer than {MAX_LINE} bytes (an exec's output through it is at most about 1.5 MiB)"
                    )))
                }
                Some(Err(LineError::Io(e))) => {
                    return Err(no_agent(&format!("cannot be read: {e}")))
                }
                Some(Ok(line)) => {
                    if let Some(start) = line.find('{') {
                        return Ok(line[start..].to_owned());
                    }
                }
            }
        }
    }
}

/// An exec's outcome from `guest-exec-status`'s answer.
fn exec_outcome(status: Status) -> Result<Option<ExecOutcome>, Error> {
    if !status.exited {
        return Ok(None);
    }
    let data = |key: &str, text: Option<String>| -> Result<Vec<u8>, Error> {
        match text {
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
    let exit_code = match (status.exitcode, status.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => signal.saturating_add(128),
        (None, None) => {
            return Err(Error::Internal(
                "guest-exec-status: exited, with neither exitcode nor signal".into(),
            ))
        }
    };
    Ok(Some(ExecOutcome {
        exit_code: i32::try_from(exit_code).unwrap_or(i32::MAX),
        stdout: data("out-data", status.out_data)?,
        stderr: data("err-data", status.err_data)?,
        truncated: status.out_truncated || status.err_truncated,
    }))
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
        let status = |v: Value| exec_outcome(serde_json::from_value(v).unwrap());
        assert_eq!(status(json!({"exited": false})).unwrap(), None);
        let killed = status(json!({"exited": true, "signal": 9}))
            .unwrap()
            .unwrap();
        assert_eq!(killed.exit_code, 137);
        let huge = status(json!({"exited": true, "signal": i64::MAX}))
            .unwrap()
            .unwrap();
        assert_eq!(huge.exit_code, i32::MAX, "no overflow");
        let bad = status(json!({"exited": true, "exitcode": 0, "out-data": "not base64!"}));
        assert!(bad.unwrap_err().to_string().contains("out-data"));
    }

    #[tokio::test]
    async fn junk_before_the_syncs_answer_is_skipped() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut agent = GuestAgent::new(ours);
        tokio::spawn(async move {
            let (read, mut write) = theirs.into_split();
            let mut lines = BufReader::new(read).split(b'\n');
            while let Ok(Some(line)) = lines.next_segment().await {
                let start = line.iter().position(|b| *b == b'{').unwrap_or(0);
                let request: Value = serde_json::from_slice(&line[start..]).unwrap();
                if request["execute"] == "guest-sync-delimited" {
                    let mut reply = b"not json\n{\"return\": 7}\n{broken\n".to_vec();
                    reply.extend(vec![b'x'; MAX_LINE + 10]);
                    reply.push(b'\n');
                    reply.push(0xff);
                    let id = json!({"return": request["arguments"]["id"]}).to_string();
                    reply.extend_from_slice(id.as_bytes());
                    reply.push(b'\n');
                    write.write_all(&reply).await.unwrap();
                } else {
                    let answer = b"{\"return\": {\"pid\": 5, \"extra\": [0, 0, 0]}}\n";
                    write.write_all(answer).await.unwrap();
                }
            }
        });
        assert_eq!(agent.exec(&["true".into()], &[]).await.unwrap(), 5);
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
