//! A VM-mode pod's execs (docs/vm-mode.md), run by the image's QEMU guest agent
//! ([`GuestAgent`]): created as the task service asks, started with `guest-exec`, then
//! polled with `guest-exec-status` until the process exited. The agent gives an exec's
//! output when it has exited, so stdout and stderr are written to containerd's streams
//! then, whole; an exec with a terminal or with stdin is refused by name (the agent has
//! neither), as is a signal to an exec (it cannot send one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use vmlet_protocol::agent::CreateExecRequest;

use crate::guest::guest_agent::{ExecOutcome, GuestAgent};
use crate::guest::stdio::{Copies, Output};
use crate::Error;

/// How often a running exec's status is asked.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// The status of an exec the guest agent lost (it stopped answering, the VM ended).
const LOST_STATUS: i32 = 255;

/// One exec: what it runs, then its guest PID and its outcome once it exited.
struct Exec {
    command: Vec<String>,
    env: Vec<String>,
    outcome: watch::Sender<Option<ExecOutcome>>,
    poll: Option<tokio::task::JoinHandle<()>>,
}

/// The execs of one VM image.
pub struct ImageExecs {
    agent: tokio::sync::Mutex<GuestAgent>,
    execs: Mutex<HashMap<String, Exec>>,
}

fn unknown(exec_id: &str) -> Error {
    Error::NotFound(format!("exec {exec_id}"))
}

impl ImageExecs {
    pub fn new(agent: GuestAgent) -> Arc<Self> {
        Arc::new(ImageExecs {
            agent: tokio::sync::Mutex::new(agent),
            execs: Mutex::new(HashMap::new()),
        })
    }

    /// Records an exec to start; one with a terminal or stdin is refused by name.
    pub fn create(&self, request: &CreateExecRequest) -> Result<(), Error> {
        let process = request.process.as_ref().cloned().unwrap_or_default();
        let stdio = request.stdio.as_ref().cloned().unwrap_or_default();
        let refuse = |what: &str| {
            Error::Unimplemented(format!(
                "exec {} with {what}: a VM-mode pod's execs are run by the image's QEMU guest agent, which gives a process neither a terminal nor input",
                request.exec_id
            ))
        };
        if process.terminal {
            return Err(refuse("a terminal"));
        }
        if stdio.stdin {
            return Err(refuse("stdin"));
        }
        if process.args.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "exec {}: no command",
                request.exec_id
            )));
        }
        let mut execs = self.execs.lock().unwrap();
        if execs.contains_key(&request.exec_id) {
            return Err(Error::AlreadyExists(format!("exec {}", request.exec_id)));
        }
        execs.insert(
            request.exec_id.clone(),
            Exec {
                command: process.args.clone(),
                env: process.env.clone(),
                outcome: watch::Sender::new(None),
                poll: None,
            },
        );
        Ok(())
    }

    /// Starts the exec in the guest and watches it; its guest PID.
    pub async fn start(self: &Arc<Self>, exec_id: &str) -> Result<u32, Error> {
        let (command, env) = {
            let execs = self.execs.lock().unwrap();
            let exec = execs.get(exec_id).ok_or_else(|| unknown(exec_id))?;
            (exec.command.clone(), exec.env.clone())
        };
        let pid = self.agent.lock().await.exec(&command, &env).await?;
        let watcher = Arc::clone(self);
        let id = exec_id.to_owned();
        let poll = tokio::spawn(async move { watcher.poll(&id, pid).await });
        match self.execs.lock().unwrap().get_mut(exec_id) {
            Some(exec) => exec.poll = Some(poll),
            None => poll.abort(),
        }
        Ok(u32::try_from(pid).unwrap_or(0))
    }

    /// Asks the exec's status until it exited (or the agent is lost: status 255, with why
    /// on its stderr).
    async fn poll(&self, exec_id: &str, pid: i64) {
        let outcome = loop {
            tokio::time::sleep(POLL_EVERY).await;
            match self.agent.lock().await.exec_status(pid).await {
                Ok(None) => continue,
                Ok(Some(outcome)) => break outcome,
                Err(e) => {
                    break ExecOutcome {
                        exit_code: LOST_STATUS,
                        stdout: Vec::new(),
                        stderr: format!("vmlet: exec {exec_id}: {}\n", e.message()).into_bytes(),
                        truncated: false,
                    }
                }
            }
        };
        if outcome.truncated {
            log::warn!("exec {exec_id}: the guest agent cut its output short");
        }
        if let Some(exec) = self.execs.lock().unwrap().get(exec_id) {
            exec.outcome.send_replace(Some(outcome));
        }
    }

    /// The exec's outcome, once it exited.
    async fn outcome(&self, exec_id: &str) -> Result<ExecOutcome, Error> {
        let mut outcome = {
            let execs = self.execs.lock().unwrap();
            execs
                .get(exec_id)
                .ok_or_else(|| unknown(exec_id))?
                .outcome
                .subscribe()
        };
        let done = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::FailedPrecondition(format!("exec {exec_id} was removed")))?;
        Ok(done.clone().expect("waited for"))
    }

    /// Waits for the exec's end (no deadline: it may run for ever); its exit status.
    pub async fn wait(&self, exec_id: &str) -> Result<u32, Error> {
        Ok(self.outcome(exec_id).await?.exit_code as u32)
    }

    /// Writes the exec's output to `stdout` and `stderr` (containerd's streams) once it
    /// exited.
    pub fn attach(
        self: &Arc<Self>,
        exec_id: &str,
        [stdout, stderr]: [Option<Output>; 2],
    ) -> Result<Copies, Error> {
        if !self.execs.lock().unwrap().contains_key(exec_id) {
            return Err(unknown(exec_id));
        }
        let execs = Arc::clone(self);
        let id = exec_id.to_owned();
        let copy = tokio::spawn(async move {
            let Ok(outcome) = execs.outcome(&id).await else {
                return;
            };
            for (output, bytes) in [(stdout, &outcome.stdout), (stderr, &outcome.stderr)] {
                if let Some(mut output) = output {
                    if let Err(e) = output.write_all(bytes).await {
                        log::warn!("exec {id}: writing its output: {e}");
                    }
                }
            }
        });
        let mut copies = Copies::default();
        copies.push_output(copy);
        Ok(copies)
    }

    /// Forgets the exec (its watch stops).
    pub fn remove(&self, exec_id: &str) {
        if let Some(exec) = self.execs.lock().unwrap().remove(exec_id) {
            if let Some(poll) = exec.poll {
                poll.abort();
            }
        }
    }
}
