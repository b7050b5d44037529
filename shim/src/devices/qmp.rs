//! vmlet's own QMP monitor of the VM. libvirt owns QEMU's main monitor and (in libvirt
//! 9.0) cannot hand it file descriptors, so the domain gets a second monitor whose chardev
//! connects to a socket the shim listens on. The shim attaches block devices and grows the
//! VM's memory through it: a device's fd travels with `add-fd` (SCM_RIGHTS), QEMU never
//! opens host paths.
//!
//! The client is asynchronous: one task reads the socket and routes each reply to the
//! command that waits for it (commands carry an `id`, which QEMU echoes), broadcasts events
//! to whoever subscribed, and when QEMU's end closes (however QEMU ended) fails what still
//! waits and reports the end ([`Qmp::ended`]: the shim's "VM ended" signal). Another task
//! writes the commands, so a QEMU that stops reading stalls no reader. [`Qmp`] is a cheap
//! handle: commands from several callers run side by side. QEMU runs the guest's devices,
//! so what it sends is bounded: lines of [`MAX_LINE`] bytes (a longer one is skipped),
//! [`MAX_EVENTS`] events buffered per subscriber (a slow one loses the oldest), and every
//! command and event wait has a deadline.

use std::collections::HashMap;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::devices::qmp_lines::{LineError, Lines};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use serde_json::{json, Value};
use tokio::io::Interest;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::Error;

/// How long one command may take, from being queued to its reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest QMP line read (QEMU's replies and events to vmlet's commands are a few
/// hundred bytes); a longer one is skipped, never a growing buffer.
pub const MAX_LINE: usize = 64 * 1024;
/// Events buffered for each subscriber; past that it loses the oldest (and logs it).
pub const MAX_EVENTS: usize = 64;
/// Commands queued for the writer.
const QUEUED_COMMANDS: usize = 16;

/// A reply: the command's `return` value, or QEMU's description of its error.
type Reply = Result<Value, String>;
/// Replies awaited, by command id.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// One command for the writer.
struct Outgoing {
    line: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// A handle on a VM's QMP monitor.
#[derive(Clone)]
pub struct Qmp {
    commands: mpsc::Sender<Outgoing>,
    waiting: Waiting,
    /// Never read: what new subscribers are made from (the reader holds the only sender,
    /// so subscribers see the channel close when QEMU's end does).
    events: Arc<broadcast::Receiver<Value>>,
    ended: watch::Receiver<bool>,
    next_id: Arc<AtomicU64>,
}

/// Events of one subscriber, from the moment it subscribed.
pub struct Events(broadcast::Receiver<Value>);

impl Qmp {
    /// Reads QEMU's greeting from `stream`, starts the reader and writer tasks and leaves
    /// capabilities negotiation mode.
    pub async fn handshake(stream: UnixStream) -> Result<Self, Error> {
        let (read, write) = stream.into_split();
        let mut lines = Lines::new(read, MAX_LINE);
        let greeting = tokio::time::timeout(REPLY_TIMEOUT, lines.next())
            .await
            .map_err(|_| Error::Timeout(format!("no QMP greeting within {REPLY_TIMEOUT:?}")))?;
        let greeting = match greeting {
            Some(Ok(line)) => parse(&line)?,
            Some(Err(e)) => return Err(read_error(e)),
            None => return Err(Error::Internal("QEMU closed the QMP monitor".into())),
        };
        if greeting.get("QMP").is_none() {
            return Err(Error::Internal(format!(
                "QMP greeting expected, got {greeting}"
            )));
        }
        let (commands, outgoing) = mpsc::channel(QUEUED_COMMANDS);
        let waiting = Waiting::default();
        let (events, subscribers) = broadcast::channel(MAX_EVENTS);
        let (ended_tx, ended) = watch::channel(false);
        tokio::spawn(write_commands(write, outgoing));
        tokio::spawn(read_messages(lines, waiting.clone(), events, ended_tx));
        let qmp = Qmp {
            commands,
            waiting,
            events: Arc::new(subscribers),
            ended,
            next_id: Arc::new(AtomicU64::new(0)),
        };
        qmp.execute("qmp_capabilities", json!({}), Vec::new())
            .await?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments`, passing `fds` with it, and returns its `return`
    /// value; QEMU's error is returned with the command's name.
    pub async fn execute(
        &self,
        command: &str,
        arguments: Value,
        fds: Vec<OwnedFd>,
    ) -> Result<Value, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line =
            serde_json::to_vec(&json!({"execute": command, "arguments": arguments, "id": id}))
                .map_err(|e| Error::Internal(format!("encode QMP {command}: {e}")))?;
        line.push(b'\n');
        let (reply_tx, reply) = oneshot::channel();
        self.waiting.lock().unwrap().insert(id, reply_tx);
        // The reader fails what waits once QEMU is gone; a command after that would wait in
        // vain.
        if *self.ended.borrow() {
            self.waiting.lock().unwrap().remove(&id);
            return Err(Error::Internal(format!(
                "QMP {command}: QEMU closed the QMP monitor"
            )));
        }
        let closed = || Error::Internal(format!("QMP {command}: QEMU closed the QMP monitor"));
        let exchange = async {
            self.commands
                .send(Outgoing { line, fds })
                .await
                .map_err(|_| closed())?;
            reply.await.map_err(|_| closed())
        };
        let result = tokio::time::timeout(REPLY_TIMEOUT, exchange).await;
        self.waiting.lock().unwrap().remove(&id);
        match result {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(desc))) => Err(Error::Internal(format!("QEMU refused {command}: {desc}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Timeout(format!(
                "QEMU did not answer {command} within {REPLY_TIMEOUT:?}"
            ))),
        }
    }

    /// Events from now on (subscribe before the command whose event is awaited).
    pub fn subscribe(&self) -> Events {
        Events(self.events.resubscribe())
    }

    /// Becomes true when QEMU's end of the monitor closed: QEMU is gone.
    pub fn ended(&self) -> watch::Receiver<bool> {
        self.ended.clone()
    }
}

impl Events {
    /// Waits up to `timeout` for an event named `name` whose `data` satisfies `matches`.
    pub async fn wait_for(
        &mut self,
        name: &str,
        matches: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Result<(), Error> {
        let wait = async {
            loop {
                match self.0.recv().await {
                    Ok(e) => {
                        if e.get("event").and_then(Value::as_str) == Some(name)
                            && matches(e.get("data").unwrap_or(&Value::Null))
                        {
                            return Ok(());
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        log::warn!("QMP: {n} events unread were dropped (more than {MAX_EVENTS})");
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(Error::Internal(format!(
                            "QEMU closed the QMP monitor before its {name} event"
                        )));
                    }
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout(format!(
                    "QEMU sent no {name} event within {timeout:?}"
                )))
            })
    }
}

/// The writer: one command line at a time, its fds with its first byte.
async fn write_commands(write: OwnedWriteHalf, mut outgoing: mpsc::Receiver<Outgoing>) {
    while let Some(command) = outgoing.recv().await {
        if let Err(e) = send(write.as_ref(), &command.line, &command.fds).await {
            // The reader sees the end and fails what waits; the waiter's deadline covers a
            // QEMU that merely stopped reading.
            log::warn!("QMP: write failed: {e}");
            return;
        }
    }
}

async fn send(stream: &UnixStream, line: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut sent = 0;
    while sent < line.len() {
        stream.writable().await?;
        let rights = [ControlMessage::ScmRights(&raw)];
        let control: &[ControlMessage] = if sent == 0 && !raw.is_empty() {
            &rights
        } else {
            &[]
        };
        let written = stream.try_io(Interest::WRITABLE, || {
            sendmsg::<UnixAddr>(
                stream.as_raw_fd(),
                &[IoSlice::new(&line[sent..])],
                control,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match written {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The reader: routes replies by id, broadcasts events; at the end of the stream fails
/// every waiter and reports QEMU's end.
async fn read_messages(
    mut lines: Lines<tokio::net::unix::OwnedReadHalf>,
    waiting: Waiting,
    events: broadcast::Sender<Value>,
    ended: watch::Sender<bool>,
) {
    loop {
        let message = match lines.next().await {
            Some(Ok(line)) => parse(&line),
            // Skipped to its newline; the monitor reads on.
            Some(Err(LineError::TooLong)) => Err(Error::Internal(format!(
                "QMP sent a line longer than {MAX_LINE} bytes (skipped)"
            ))),
            Some(Err(LineError::Io(e))) => {
                log::warn!("QMP: read failed: {e}");
                break;
            }
            None => break,
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                log::warn!("QMP: {}", e.message());
                continue;
            }
        };
        if message.get("event").is_some() {
            // No subscriber: nobody waits for it.
            let _ = events.send(message);
            continue;
        }
        let Some(id) = message.get("id").and_then(Value::as_u64) else {
            log::warn!("QMP: a reply without vmlet's id: {}", shown(&message));
            continue;
        };
        let reply = if let Some(value) = message.get("return") {
            Ok(value.clone())
        } else if let Some(error) = message.get("error") {
            let desc = error
                .get("desc")
                .and_then(Value::as_str)
                .unwrap_or("no description");
            Err(desc.to_owned())
        } else {
            log::warn!("QMP: neither a reply nor an event: {}", shown(&message));
            continue;
        };
        if let Some(waiter) = waiting.lock().unwrap().remove(&id) {
            let _ = waiter.send(reply);
        }
    }
    // Dropping the senders fails every waiter with "closed".
    waiting.lock().unwrap().clear();
    ended.send_replace(true);
}

fn parse(line: &str) -> Result<Value, Error> {
    serde_json::from_str(line).map_err(|e| {
        let shown: String = line.chars().take(200).collect();
        Error::Internal(format!("QMP sent {}: {e}", shown.trim_end()))
    })
}

fn shown(message: &Value) -> String {
    message.to_string().chars().take(200).collect()
}

fn read_error(e: LineError) -> Error {
    match e {
        LineError::TooLong => {
            Error::Internal(format!("QMP sent a line longer than {MAX_LINE} bytes"))
        }
        LineError::Io(e) => Error::io("read QMP", e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// A QMP server in a thread: greets, then answers each command line with `reply(cmd)`
    /// (one or more lines; a reply gets the command's id; `"close"` ends the server as QEMU
    /// ending would), and records the commands and how many fds came with each. Returns the client's end, ready for [`Qmp::handshake`].
    pub(crate) fn fake_qemu(
        reply: impl Fn(&Value) -> Vec<Value> + Send + 'static,
    ) -> (UnixStream, std::thread::JoinHandle<Vec<(Value, usize)>>) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut out = theirs.try_clone().unwrap();
            writeln!(out, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            let mut pending = String::new();
            loop {
                let mut buf = vec![0u8; 4096];
                let mut cmsg = nix::cmsg_space!([RawFd; 4]);
                let mut iov = [std::io::IoSliceMut::new(&mut buf)];
                let Ok(msg) = nix::sys::socket::recvmsg::<UnixAddr>(
                    theirs.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::empty(),
                ) else {
                    return seen;
                };
                let mut fds = 0;
                for c in msg.cmsgs().unwrap() {
                    if let nix::sys::socket::ControlMessageOwned::ScmRights(r) = c {
                        fds += r.len();
                        for fd in r {
                            nix::unistd::close(fd).unwrap();
                        }
                    }
                }
                let len = msg.bytes;
                if len == 0 {
                    return seen;
                }
                pending.push_str(&String::from_utf8_lossy(&buf[..len]));
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    let command: Value = serde_json::from_str(&line).unwrap();
                    for mut r in reply(&command) {
                        if r == json!("close") {
                            // QEMU ends: both ends of its socket close.
                            return seen;
                        }
                        if r.get("event").is_none() {
                            r["id"] = command["id"].clone();
                        }
                        if writeln!(out, "{r}").is_err() {
                            return seen;
                        }
                    }
                    seen.push((command, fds));
                    fds = 0;
                }
            }
        });
        ours.set_nonblocking(true).unwrap();
        (UnixStream::from_std(ours).unwrap(), server)
    }

    /// What the fake QEMU saw, once the client's end closed (every [`Qmp`] handle dropped:
    /// the writer's half shuts the socket's write side, the fake then ends). Joined off the
    /// runtime's thread, so that the client's tasks run meanwhile.
    pub(crate) async fn finished(
        server: std::thread::JoinHandle<Vec<(Value, usize)>>,
    ) -> Vec<(Value, usize)> {
        tokio::task::spawn_blocking(move || server.join().unwrap())
            .await
            .unwrap()
    }

    fn null_fd() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    #[tokio::test]
    async fn commands_return_values_and_errors_name_the_command() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "add-fd" => vec![
                json!({"event": "RESUME", "data": {}}),
                json!({"return": {"fdset-id": 3, "fd": 25}}),
            ],
            "device_add" => vec![json!({"error": {"class": "GenericError", "desc": "bus full"}})],
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let mut events = qmp.subscribe();
        let added = qmp
            .execute("add-fd", json!({}), vec![null_fd()])
            .await
            .unwrap();
        assert_eq!(added["fdset-id"], 3);
        let err = qmp
            .execute("device_add", json!({"driver": "nvme"}), Vec::new())
            .await
            .unwrap_err();
        assert_eq!(err.message(), "QEMU refused device_add: bus full");
        // The event that came before add-fd's reply reached the subscriber.
        events
            .wait_for("RESUME", |_| true, Duration::from_millis(10))
            .await
            .unwrap();
        drop(qmp);
        let seen = crate::devices::qmp::tests::finished(server).await;
        let names: Vec<_> = seen.iter().map(|(c, _)| c["execute"].clone()).collect();
        assert_eq!(names, ["qmp_capabilities", "add-fd", "device_add"]);
        assert_eq!(seen[1].1, 1, "the fd travels with add-fd");
    }

    #[tokio::test]
    async fn commands_run_side_by_side_and_each_gets_its_own_reply() {
        let (stream, _server) =
            fake_qemu(|c| vec![json!({"return": {"echo": c["arguments"]["n"]}})]);
        let qmp = Qmp::handshake(stream).await.unwrap();
        let calls = (0..20).map(|n| {
            let qmp = qmp.clone();
            async move { qmp.execute("echo", json!({"n": n}), Vec::new()).await }
        });
        let replies = futures::future::join_all(calls).await;
        for (n, reply) in replies.into_iter().enumerate() {
            assert_eq!(reply.unwrap()["echo"], n);
        }
    }

    #[tokio::test]
    async fn an_endless_line_is_refused_not_buffered() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            let mut out = theirs;
            let chunk = vec![b'x'; 64 * 1024];
            // 64 MiB without a newline, unless the reader gives up first.
            for _ in 0..1024 {
                if out.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        ours.set_nonblocking(true).unwrap();
        let err = Qmp::handshake(UnixStream::from_std(ours).unwrap())
            .await
            .err()
            .expect("no QMP greeting");
        assert_eq!(
            err.message(),
            format!("QMP sent a line longer than {MAX_LINE} bytes")
        );
        writer.join().unwrap();
    }

    #[tokio::test]
    async fn an_over_long_line_is_skipped_and_the_monitor_goes_on() {
        let (stream, _server) = fake_qemu(|c| {
            if c["execute"] == "noisy" {
                // An event the guest made longer than the bound, then the reply.
                let big = "x".repeat(2 * MAX_LINE);
                vec![
                    json!({"event": "BIG", "data": {"s": big}}),
                    json!({"return": {"n": 1}}),
                ]
            } else {
                vec![json!({"return": {}})]
            }
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let reply = qmp.execute("noisy", json!({}), Vec::new()).await.unwrap();
        assert_eq!(reply["n"], 1);
        assert!(!*qmp.ended().borrow(), "the monitor's reader ended");
        qmp.execute("after", json!({}), Vec::new()).await.unwrap();
    }

    #[tokio::test]
    async fn a_flood_of_events_keeps_only_the_newest() {
        let flood = 10 * MAX_EVENTS;
        let (stream, _server) = fake_qemu(move |c| {
            if c["execute"] == "flood" {
                let mut lines: Vec<Value> = (0..flood)
                    .map(|i| json!({"event": "NOISE", "data": {"n": i}}))
                    .collect();
                lines.push(json!({"return": {}}));
                lines
            } else {
                vec![json!({"return": {}})]
            }
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let mut events = qmp.subscribe();
        qmp.execute("flood", json!({}), Vec::new()).await.unwrap();
        let newest = (flood - 1) as u64;
        let oldest_kept = (flood - MAX_EVENTS) as u64;
        events
            .wait_for(
                "NOISE",
                |d| d["n"] == oldest_kept,
                Duration::from_millis(100),
            )
            .await
            .unwrap();
        events
            .wait_for("NOISE", |d| d["n"] == newest, Duration::from_millis(100))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn waiting_for_a_missing_event_times_out_clearly() {
        let (stream, _server) = fake_qemu(|_| vec![json!({"return": {}})]);
        let qmp = Qmp::handshake(stream).await.unwrap();
        let err = qmp
            .subscribe()
            .wait_for("DEVICE_DELETED", |_| true, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(
            err.message(),
            "QEMU sent no DEVICE_DELETED event within 50ms"
        );
    }

    #[tokio::test]
    async fn qemus_end_fails_what_waits_and_is_reported() {
        let (stream, _server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "quit" => vec![json!("close")],
            _ => vec![json!({"return": {}})],
        });
        let qmp = Qmp::handshake(stream).await.unwrap();
        let mut ended = qmp.ended();
        assert!(!*ended.borrow());
        let mut events = qmp.subscribe();
        let err = qmp
            .execute("quit", json!({}), Vec::new())
            .await
            .unwrap_err();
        assert_eq!(err.message(), "QMP quit: QEMU closed the QMP monitor");
        tokio::time::timeout(Duration::from_secs(1), ended.wait_for(|e| *e))
            .await
            .expect("the end is reported")
            .unwrap();
        let err = qmp
            .execute("query-status", json!({}), Vec::new())
            .await
            .unwrap_err();
        assert_eq!(
            err.message(),
            "QMP query-status: QEMU closed the QMP monitor"
        );
        let err = events
            .wait_for("DEVICE_DELETED", |_| true, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.message().contains("closed"), "{}", err.message());
    }
}
