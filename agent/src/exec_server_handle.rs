//! The agent's side of a container's exec server ([`crate::exec_server`]): starting it at
//! the container's first exec, and asking it for exec processes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use nix::sys::socket::{setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};
use nix::sys::time::{TimeVal, TimeValLike};
use tokio::sync::watch;

use crate::exec_server::ExecServerSpec;
use crate::helper_status::read_ready;
use crate::init_spec::ProcessSpec;
use crate::launch::{launch, ChildStdio, Helper, Launched};
use crate::reaper::{ExitStatus, Reaper};
use crate::Error;

/// How long the agent waits for the server's answer to one request (a clone).
const ANSWER_TIMEOUT_SECONDS: i64 = 10;

pub struct ExecServer {
    exit: watch::Receiver<Option<ExitStatus>>,
    /// The agent's end of the request socket; one request and its answer at a time.
    requests: Mutex<OwnedFd>,
}

impl ExecServer {
    /// Starts the exec server of the container whose init is `init_pid` (`id` names it in
    /// errors) and blocks until it has joined the init's namespaces and root.
    pub fn start(reaper: &Reaper, init_pid: i32, id: &str) -> Result<Self, Error> {
        let (requests, server_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| Error::io("socketpair", e.into()))?;
        setsockopt(
            &requests,
            sockopt::ReceiveTimeout,
            &TimeVal::seconds(ANSWER_TIMEOUT_SECONDS),
        )
        .map_err(|e| Error::io("set the exec server's answer timeout", e.into()))?;
        let stdio = crate::process_stdio::helper_stdio()?;
        let spec = ExecServerSpec { init_pid };
        let helper = Helper::ExecServer(server_end.as_raw_fd());
        let (_, launched, exit) = reaper.track(|| launch(helper, &spec, stdio, |_| Ok(())))?;
        drop(server_end);
        let Launched { start, status } = launched;
        drop(start);
        // The server fails and exits by itself when it cannot join; it never hands over.
        read_ready(&status, &format!("{id} (exec server)"), |_| {})?;
        Ok(Self {
            exit,
            requests: Mutex::new(requests),
        })
    }

    pub fn is_running(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Has the server clone an exec process with `stdio` and sends it `spec`. Returns the
    /// process's PID and the agent's ends of its handshake.
    pub fn request(
        &self,
        id: &str,
        spec: &ProcessSpec,
        stdio: ChildStdio,
    ) -> Result<(i32, Launched), Error> {
        let requests = self.requests.lock().unwrap();
        crate::launch::request_exec(id, &requests, spec, stdio)
    }
}
