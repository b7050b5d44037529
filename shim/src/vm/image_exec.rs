//! A VM-mode pod's execs (docs/vm-mode.md), run by the image's QEMU guest agent
//! ([`GuestAgent`]): created as the task service asks, started with `guest-exec`, then
//! polled with `guest-exec-status` until the process exited. The agent gives an exec's
//! output when it has exited, so stdout and stderr are written to containerd's streams
//! then, whole; an exec with a terminal or with stdin is refused by name (the agent has
//! neither). A signal to an exec ends vmlet's watch of it at once (its status 128 + the
//! signal) and asks the agent to `kill` the guest's process, which it may outlive. A pod
//! runs at most [`MAX_EXECS`] execs at a time, and waits at most [`AGENT_WAIT`] for the
//! agent, which serves one call at a time.

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
/// The status of an exec the guest agent lost (it stopped answering, the VM ended) or
/// refused to start.
const LOST_STATUS: i32 = 255;
/// Execs of one pod at a time (each is polled while it runs).
pub const MAX_EXECS: usize = 16;
/// How long a call waits for the agent, busy with another.
const AGENT_WAIT: Duration = Duration::from_secs(15);

/// One exec: what it runs, then its guest PID and its outcome once it exited.
struct Exec {
    command: Vec<String>,
    env: Vec<String>,
    pid: Option<i64>,
    outcome: watch::Sender<Option<ExecOutcome>>,
    poll: Option<tokio::task::JoinHandle<()>>,
}

/// Settles an exec whose watch ended without an outcome (it panicked, or was aborted
/// while its exec still waits): status 255.
struct Unsettled<'a>(&'a ImageExecs, &'a str);

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        let why = Error::Internal("vmlet stopped watching it".into());
        self.0.settle(self.1, lost(self.1, &why));
    }
}

/// The outcome of an exec the agent refused or lost: 255, with why on its stderr.
fn lost(exec_id: &str, why: &Error) -> ExecOutcome {
    ExecOutcome {
        exit_code: LOST_STATUS,
        stdout: Vec::new(),
        stderr: format!("vmlet: exec {exec_id}: {}\n", why.message()).into_bytes(),
        truncated: false,
    }
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
        if execs.len() >= MAX_EXECS {
            return Err(Error::ResourceExhausted(format!(
                "exec {}: the pod runs {MAX_EXECS} execs already (its QEMU guest agent runs one call at a time)",
                request.exec_id
            )));
        }
        execs.insert(
            request.exec_id.clone(),
            Exec {
                command: process.args.clone(),
                env: process.env.clone(),
                pid: None,
                outcome: watch::Sender::new(None),
                poll: None,
            },
        );
        Ok(())
    }

    /// The agent, once no other call holds it (within [`AGENT_WAIT`]).
    async fn agent(&self) -> Result<tokio::sync::MutexGuard<'_, GuestAgent>, Error> {
        tokio::time::timeout(AGENT_WAIT, self.agent.lock())
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "the QEMU guest agent stayed busy for {AGENT_WAIT:?} with the pod's other execs"
                ))
            })
    }

    /// Sets the exec's outcome unless it has one (the first one stands).
    fn settle(&self, exec_id: &str, outcome: ExecOutcome) {
        if let Some(exec) = self.execs.lock().unwrap().get(exec_id) {
            exec.outcome.send_if_modified(|now| {
                let unset = now.is_none();
                if unset {
                    *now = Some(outcome);
                }
                unset
            });
        }
    }

    /// Starts the exec in the guest and watches it; its guest PID. A start that fails
    /// settles the exec at once (status 255, why on its stderr), so that no wait for it
    /// waits on.
    pub async fn start(self: &Arc<Self>, exec_id: &str) -> Result<u32, Error> {
        let (command, env) = {
            let execs = self.execs.lock().unwrap();
            let exec = execs.get(exec_id).ok_or_else(|| unknown(exec_id))?;
            (exec.command.clone(), exec.env.clone())
        };
        let started = match self.agent().await {
            Ok(mut agent) => agent.exec(&command, &env).await,
            Err(e) => Err(e),
        };
        let pid = match started {
            Ok(pid) => pid,
            Err(e) => {
                self.settle(exec_id, lost(exec_id, &e));
                return Err(e);
            }
        };
        let watcher = Arc::clone(self);
        let id = exec_id.to_owned();
        let poll = tokio::spawn(async move {
            let guard = Unsettled(&watcher, &id);
            let outcome = watcher.poll(&id, pid).await;
            std::mem::forget(guard);
            watcher.settle(&id, outcome);
        });
        match self.execs.lock().unwrap().get_mut(exec_id) {
            Some(exec) => {
                exec.pid = Some(pid);
                exec.poll = Some(poll);
            }
            None => poll.abort(),
        }
        Ok(u32::try_from(pid).unwrap_or(0))
    }

    /// Asks the exec's status until it exited (or the agent is lost: status 255, with why
    /// on its stderr).
    async fn poll(&self, exec_id: &str, pid: i64) -> ExecOutcome {
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            let status = match self.agent().await {
                Ok(mut agent) => agent.exec_status(pid).await,
                Err(e) => Err(e),
            };
            match status {
                Ok(None) => continue,
                Ok(Some(mut outcome)) => {
                    if outcome.truncated {
                        outcome.stderr.extend_from_slice(
                            format!("vmlet: exec {exec_id}: the QEMU guest agent cut its output short\n").as_bytes(),
                        );
                    }
                    return outcome;
                }
                Err(e) => return lost(exec_id, &e),
            }
        }
    }

    /// Sends `signal` to the exec: its watch ends at once with 128 + the signal, and the
    /// agent is asked to `kill` the guest's process (best effort: it may outlive this).
    pub async fn kill(&self, exec_id: &str, signal: u32) -> Result<(), Error> {
        let (pid, poll) = {
            let mut execs = self.execs.lock().unwrap();
            let exec = execs.get_mut(exec_id).ok_or_else(|| unknown(exec_id))?;
            (exec.pid, exec.poll.take())
        };
        if let Some(poll) = poll {
            poll.abort();
        }
        self.settle(
            exec_id,
            ExecOutcome {
                exit_code: 128 + (signal as i32 & 0x7f),
                stdout: Vec::new(),
                stderr: Vec::new(),
                truncated: false,
            },
        );
        if let Some(pid) = pid {
            let killed = match self.agent().await {
                Ok(mut agent) => agent.kill(pid, signal).await,
                Err(e) => Err(e),
            };
            if let Err(e) = killed {
                log::warn!(
                    "exec {exec_id}: signal {signal} to guest PID {pid}: {}",
                    e.message()
                );
            }
        }
        Ok(())
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
