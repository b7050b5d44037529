//! The [`Guest`] of a VM-mode pod (docs/vm-mode.md): no vmlet agent runs in a VM image,
//! and the container's one process is the VM itself. Its wait ends with QEMU (status 0
//! when the guest powered itself off, 137 when vmlet ended it); SIGTERM, SIGINT and SIGPWR
//! press the ACPI power button, SIGKILL ends QEMU at once. Execs are the image's QEMU
//! guest agent's ([`ImageExecs`]); what only vmlet's agent could do (pause, resources, a
//! terminal) is UNIMPLEMENTED with the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use vmlet_protocol::agent::{CreateContainerRequest, CreateExecRequest};

use super::image_exec::ImageExecs;
use crate::devices::qmp::Qmp;
use crate::guest::{AgentCalls, Guest, GuestExit, NoAgent, ProcessId};
use crate::vm::pod_vm::VM_ENDED_STATUS;
use crate::Error;

/// The VM's side of a VM-mode pod's one process.
pub struct ImageGuest {
    pub(super) qmp: Qmp,
    /// Set when vmlet ends the VM (SIGKILL, teardown): its end is then 137, not 0.
    pub(super) killed: Arc<AtomicBool>,
    /// The execs, through the image's QEMU guest agent.
    pub(super) execs: Arc<ImageExecs>,
}

/// Why a VM image has no agent's calls.
fn no_agent() -> NoAgent {
    NoAgent("a VM-mode pod (vmlet.io/image-type: vm) runs no vmlet agent".into())
}

impl ImageGuest {
    /// The status of the VM's end: 0 when the guest powered itself off, 137 when vmlet
    /// ended it.
    pub fn end_status(&self) -> u32 {
        if self.killed.load(Ordering::SeqCst) {
            VM_ENDED_STATUS
        } else {
            0
        }
    }
}

#[async_trait]
impl Guest for ImageGuest {
    fn agent(&self) -> Result<&dyn AgentCalls, NoAgent> {
        Err(no_agent())
    }

    /// The VM is the container: nothing more to create.
    async fn create_container(&self, _request: &CreateContainerRequest) -> Result<u32, Error> {
        Ok(0)
    }

    async fn create_exec(&self, request: &CreateExecRequest) -> Result<(), Error> {
        self.execs.create(request)
    }

    async fn remove_exec(&self, process: &ProcessId) -> Result<(), Error> {
        self.execs.remove(&process.exec_id);
        Ok(())
    }

    /// The VM runs from its create on; an exec starts in the guest.
    async fn start_process(&self, process: &ProcessId) -> Result<u32, Error> {
        if process.exec_id.is_empty() {
            return Ok(0);
        }
        self.execs.start(&process.exec_id).await
    }

    async fn wait_process(&self, process: &ProcessId) -> Result<GuestExit, Error> {
        if !process.exec_id.is_empty() {
            return Ok(GuestExit {
                status: self.execs.wait(&process.exec_id).await?,
                oom_killed: false,
            });
        }
        let mut ended = self.qmp.ended();
        let _ = ended.wait_for(|e| *e).await;
        Ok(GuestExit {
            status: self.end_status(),
            oom_killed: false,
        })
    }

    async fn signal_process(
        &self,
        process: &ProcessId,
        signal: u32,
        _all: bool,
    ) -> Result<(), Error> {
        if !process.exec_id.is_empty() {
            return self.execs.kill(&process.exec_id, signal).await;
        }
        match signal as i32 {
            libc::SIGKILL => {
                self.killed.store(true, Ordering::SeqCst);
                self.qmp.execute("quit", json!({}), Vec::new()).await?;
            }
            libc::SIGTERM | libc::SIGINT | libc::SIGPWR => {
                self.qmp
                    .execute("system_powerdown", json!({}), Vec::new())
                    .await?;
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "signal {other} to a VM-mode pod's VM: it takes SIGTERM, SIGINT or SIGPWR (an ACPI power-off) and SIGKILL"
                )))
            }
        }
        Ok(())
    }

    async fn remove_container(&self, _container_id: &str) -> Result<(), Error> {
        Ok(())
    }

    /// Presses the power button; the caller waits for the end and ends the VM itself when
    /// it does not come.
    async fn shutdown(&self) -> Result<(), Error> {
        self.qmp
            .execute("system_powerdown", json!({}), Vec::new())
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::qmp::tests::fake_qemu;
    use crate::guest::guest_agent::tests::fake_agent;

    /// A QEMU that ends (the guest powered off, or QEMU quit) on `ending`, the one command
    /// that makes the VM's wait return; every other command is answered and nothing more.
    async fn guest(ending: &'static str) -> ImageGuest {
        let (stream, _server) = fake_qemu(move |c| {
            if c["execute"] == ending {
                vec![json!({"return": {}}), json!("close")]
            } else {
                vec![json!({"return": {}})]
            }
        });
        ImageGuest {
            qmp: Qmp::handshake(stream).await.unwrap(),
            killed: Arc::new(AtomicBool::new(false)),
            execs: ImageExecs::new(fake_agent(|request| {
                Some(match request["execute"].as_str().unwrap() {
                    "guest-exec" => "{\"return\": {\"pid\": 7}}\n".into(),
                    _ => "{\"return\": {\"exited\": true, \"exitcode\": 3, \"out-data\": \"aGkK\"}}\n"
                        .into(),
                })
            })),
        }
    }

    fn exec_request(exec_id: &str, terminal: bool, stdin: bool) -> CreateExecRequest {
        CreateExecRequest {
            container_id: "vm".into(),
            exec_id: exec_id.into(),
            process: Some(vmlet_protocol::agent::Process {
                args: vec!["hostname".into()],
                terminal,
                ..Default::default()
            })
            .into(),
            stdio: Some(vmlet_protocol::agent::Stdio {
                stdin,
                stdout: true,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_exec_runs_through_the_guest_agent_and_ends_with_its_code_and_output() {
        let guest = guest("quit").await;
        guest
            .create_exec(&exec_request("e1", false, false))
            .await
            .unwrap();
        let exec = ProcessId::exec("vm", "e1");
        let (out, mut read) = tokio::io::duplex(1024);
        let mut copies = guest
            .execs
            .attach("e1", [Some(Box::new(out)), None])
            .unwrap();
        assert_eq!(guest.start_process(&exec).await.unwrap(), 7);
        assert_eq!(guest.wait_process(&exec).await.unwrap().status, 3);
        copies.drain().await;
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut read, &mut text)
            .await
            .unwrap();
        assert_eq!(text, "hi\n");
        guest.remove_exec(&exec).await.unwrap();
        let err = guest.start_process(&exec).await.unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_killed_exec_ends_at_once_and_the_guest_is_asked_to_kill_it() {
        let killed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = killed.clone();
        let mut guest = guest("quit").await;
        guest.execs = ImageExecs::new(fake_agent(move |request| {
            Some(match request["arguments"]["path"].as_str() {
                Some("kill") => {
                    seen.lock()
                        .unwrap()
                        .push(request["arguments"]["arg"].clone());
                    "{\"return\": {\"pid\": 8}}\n".into()
                }
                Some(_) => "{\"return\": {\"pid\": 7}}\n".into(),
                None => "{\"return\": {\"exited\": false}}\n".into(),
            })
        }));
        guest
            .create_exec(&exec_request("e3", false, false))
            .await
            .unwrap();
        let exec = ProcessId::exec("vm", "e3");
        guest.start_process(&exec).await.unwrap();
        guest
            .signal_process(&exec, libc::SIGKILL as u32, false)
            .await
            .unwrap();
        assert_eq!(guest.wait_process(&exec).await.unwrap().status, 137);
        assert_eq!(*killed.lock().unwrap(), vec![json!(["-9", "7"])]);
    }

    #[tokio::test]
    async fn a_refused_start_settles_the_exec_at_once() {
        let mut guest = guest("quit").await;
        guest.execs = ImageExecs::new(fake_agent(|_| {
            Some(
                "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such program\"}}\n"
                    .into(),
            )
        }));
        guest
            .create_exec(&exec_request("e4", false, false))
            .await
            .unwrap();
        let exec = ProcessId::exec("vm", "e4");
        let err = guest.start_process(&exec).await.unwrap_err();
        assert!(err.to_string().contains("no such program"), "{err}");
        let exit =
            tokio::time::timeout(std::time::Duration::from_secs(1), guest.wait_process(&exec))
                .await
                .expect("the wait ends at once");
        assert_eq!(exit.unwrap().status, 255);
    }

    #[tokio::test]
    async fn an_exec_with_a_terminal_or_stdin_is_refused_by_name() {
        let guest = guest("quit").await;
        for (terminal, stdin, what) in [(true, false, "a terminal"), (false, true, "stdin")] {
            let err = guest
                .create_exec(&exec_request("e2", terminal, stdin))
                .await
                .unwrap_err();
            assert_eq!(err.code(), ttrpc::Code::UNIMPLEMENTED);
            assert!(err.to_string().contains(what), "{err}");
        }
    }

    #[tokio::test]
    async fn sigterm_presses_the_power_button_and_the_power_off_is_status_0() {
        let guest = guest("system_powerdown").await;
        let init = ProcessId::init("vm");
        let _ = guest
            .signal_process(&init, libc::SIGTERM as u32, false)
            .await;
        let exit = guest.wait_process(&init).await.unwrap();
        assert_eq!(exit.status, 0);
    }

    #[tokio::test]
    async fn sigkill_ends_qemu_and_is_status_137() {
        let guest = guest("quit").await;
        let init = ProcessId::init("vm");
        let _ = guest
            .signal_process(&init, libc::SIGKILL as u32, false)
            .await;
        let exit = guest.wait_process(&init).await.unwrap();
        assert_eq!(exit.status, VM_ENDED_STATUS);
    }

    #[tokio::test]
    async fn what_needs_an_agent_is_unimplemented_by_name() {
        let guest = guest("quit").await;
        let err = guest.agent().err().expect("no agent").refuse("pause");
        assert!(err.to_string().starts_with("pause:"), "{err}");
        assert!(err.to_string().contains("runs no vmlet agent"), "{err}");
        let err = guest
            .signal_process(&ProcessId::init("vm"), libc::SIGHUP as u32, false)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
    }
}
