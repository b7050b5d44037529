//! vmlet's own QMP monitor of the VM. libvirt owns QEMU's main monitor and (in libvirt
//! 9.0) cannot hand it file descriptors, so the domain gets a second monitor whose chardev
//! connects to a socket the shim listens on. The shim attaches block devices through it:
//! the device's fd travels with `add-fd` (SCM_RIGHTS), QEMU never opens host paths.
//!
//! The client is blocking and line-based (QMP sends one JSON object per line); events that
//! arrive between replies are kept for [`Qmp::wait_event`]. QEMU runs the guest's devices,
//! so what it sends is bounded: lines of [`MAX_LINE`] bytes, [`MAX_EVENTS`] kept events,
//! and a deadline on every read.

use std::io::{BufRead, BufReader, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use serde_json::{json, Value};

use crate::Error;

/// How long one command may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest QMP line read (QEMU's replies and events to vmlet's commands are a few
/// hundred bytes); a longer one is an error, never a growing buffer.
pub const MAX_LINE: usize = 64 * 1024;
/// Events kept between replies; past that the oldest is dropped (and logged).
pub const MAX_EVENTS: usize = 64;

pub struct Qmp {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    /// Events read while waiting for replies, oldest first.
    events: Vec<Value>,
}

impl Qmp {
    /// Reads QEMU's greeting and leaves capabilities negotiation mode.
    pub fn handshake(stream: UnixStream) -> Result<Self, Error> {
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|e| Error::io("QMP socket", e))?;
        let reader = BufReader::new(stream.try_clone().map_err(|e| Error::io("QMP socket", e))?);
        let mut qmp = Qmp {
            writer: stream,
            reader,
            events: Vec::new(),
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(Error::Internal(format!(
                "QMP greeting expected, got {greeting}"
            )));
        }
        qmp.execute("qmp_capabilities", json!({}), &[])?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments`, passing `fds` with it, and returns its `return`
    /// value; QEMU's error is returned with the command's name.
    pub fn execute(
        &mut self,
        command: &str,
        arguments: Value,
        fds: &[RawFd],
    ) -> Result<Value, Error> {
        let mut line = serde_json::to_vec(&json!({"execute": command, "arguments": arguments}))
            .map_err(|e| Error::Internal(format!("encode QMP {command}: {e}")))?;
        line.push(b'\n');
        if fds.is_empty() {
            self.writer
                .write_all(&line)
                .map_err(|e| Error::io(format!("QMP {command}"), e))?;
        } else {
            let sent = sendmsg::<UnixAddr>(
                self.writer.as_raw_fd(),
                &[IoSlice::new(&line)],
                &[ControlMessage::ScmRights(fds)],
                MsgFlags::empty(),
                None,
            )
            .map_err(|e| Error::io(format!("QMP {command}"), e.into()))?;
            if sent != line.len() {
                self.writer
                    .write_all(&line[sent..])
                    .map_err(|e| Error::io(format!("QMP {command}"), e))?;
            }
        }
        loop {
            let message = self.read_message()?;
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                let desc = error
                    .get("desc")
                    .and_then(Value::as_str)
                    .unwrap_or("no description");
                return Err(Error::Internal(format!("QEMU refused {command}: {desc}")));
            }
            self.keep_event(message);
        }
    }

    fn keep_event(&mut self, event: Value) {
        if self.events.len() >= MAX_EVENTS {
            let dropped = self.events.remove(0);
            log::warn!(
                "QMP: more than {MAX_EVENTS} events unread; dropped {}",
                dropped.get("event").and_then(Value::as_str).unwrap_or("?")
            );
        }
        self.events.push(event);
    }

    /// Waits up to `timeout` for an event named `name` whose `data` satisfies `matches`.
    pub fn wait_event(
        &mut self,
        name: &str,
        matches: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Result<(), Error> {
        let is_it = |e: &Value| {
            e.get("event").and_then(Value::as_str) == Some(name)
                && matches(e.get("data").unwrap_or(&Value::Null))
        };
        if let Some(i) = self.events.iter().position(is_it) {
            self.events.remove(i);
            return Ok(());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "QEMU sent no {name} event within {timeout:?}"
                )));
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(left))
                .map_err(|e| Error::io("QMP socket", e))?;
            let message = self.read_message();
            self.reader
                .get_ref()
                .set_read_timeout(Some(REPLY_TIMEOUT))
                .map_err(|e| Error::io("QMP socket", e))?;
            match message {
                Ok(m) if is_it(&m) => return Ok(()),
                Ok(_) => {}
                Err(Error::Io { source, .. })
                    if matches!(
                        source.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn read_message(&mut self) -> Result<Value, Error> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io("read QMP", e))?;
        if n == 0 {
            return Err(Error::Internal("QEMU closed the QMP monitor".into()));
        }
        if line.len() > MAX_LINE {
            return Err(Error::Internal(format!(
                "QMP sent a line longer than {MAX_LINE} bytes"
            )));
        }
        serde_json::from_slice(&line).map_err(|e| {
            let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
            Error::Internal(format!("QMP sent {}: {e}", shown.trim_end()))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A QMP server in a thread: greets, then answers each command line with `reply(cmd)`
    /// (one or more lines), and records the commands and how many fds came with each.
    pub(crate) fn fake_qemu(
        reply: impl Fn(&Value) -> Vec<Value> + Send + 'static,
    ) -> (UnixStream, std::thread::JoinHandle<Vec<(Value, usize)>>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut out = theirs.try_clone().unwrap();
            writeln!(out, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            loop {
                let mut buf = vec![0u8; 4096];
                let mut cmsg = nix::cmsg_space!([RawFd; 4]);
                let mut iov = [std::io::IoSliceMut::new(&mut buf)];
                let msg = nix::sys::socket::recvmsg::<UnixAddr>(
                    theirs.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::empty(),
                )
                .unwrap();
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
                for line in String::from_utf8_lossy(&buf[..len]).lines() {
                    let command: Value = serde_json::from_str(line).unwrap();
                    for r in reply(&command) {
                        writeln!(out, "{r}").unwrap();
                    }
                    seen.push((command, fds));
                }
            }
        });
        (ours, server)
    }

    #[test]
    fn commands_return_values_and_errors_name_the_command() {
        let (stream, server) = fake_qemu(|c| match c["execute"].as_str().unwrap() {
            "add-fd" => vec![
                json!({"event": "RESUME", "data": {}}),
                json!({"return": {"fdset-id": 3, "fd": 25}}),
            ],
            "device_add" => vec![json!({"error": {"class": "GenericError", "desc": "bus full"}})],
            _ => vec![json!({"return": {}})],
        });
        let mut qmp = Qmp::handshake(stream).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let added = qmp
            .execute("add-fd", json!({}), &[file.as_raw_fd()])
            .unwrap();
        assert_eq!(added["fdset-id"], 3);
        let err = qmp
            .execute("device_add", json!({"driver": "nvme"}), &[])
            .unwrap_err();
        assert_eq!(err.message(), "QEMU refused device_add: bus full");
        // The event that came before add-fd's reply is kept.
        qmp.wait_event("RESUME", |_| true, Duration::from_millis(10))
            .unwrap();
        drop(qmp);
        let seen = server.join().unwrap();
        let names: Vec<_> = seen.iter().map(|(c, _)| c["execute"].clone()).collect();
        assert_eq!(names, ["qmp_capabilities", "add-fd", "device_add"]);
        assert_eq!(seen[1].1, 1, "the fd travels with add-fd");
    }

    #[test]
    fn an_endless_line_is_refused_not_buffered() {
        let (ours, theirs) = UnixStream::pair().unwrap();
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
        let err = Qmp::handshake(ours).err().expect("no QMP greeting");
        assert_eq!(
            err.message(),
            format!("QMP sent a line longer than {MAX_LINE} bytes")
        );
        writer.join().unwrap();
    }

    #[test]
    fn a_flood_of_events_keeps_only_the_newest() {
        let (stream, _server) = fake_qemu(|c| {
            if c["execute"] == "flood" {
                let mut lines: Vec<Value> = (0..10 * MAX_EVENTS)
                    .map(|i| json!({"event": "NOISE", "data": {"n": i}}))
                    .collect();
                lines.push(json!({"return": {}}));
                lines
            } else {
                vec![json!({"return": {}})]
            }
        });
        let mut qmp = Qmp::handshake(stream).unwrap();
        qmp.execute("flood", json!({}), &[]).unwrap();
        assert_eq!(qmp.events.len(), MAX_EVENTS);
        let newest = (10 * MAX_EVENTS - 1) as u64;
        assert_eq!(qmp.events.last().unwrap()["data"]["n"], newest);
    }

    #[test]
    fn waiting_for_a_missing_event_times_out_clearly() {
        let (stream, _server) = fake_qemu(|_| vec![json!({"return": {}})]);
        let mut qmp = Qmp::handshake(stream).unwrap();
        let err = qmp
            .wait_event("DEVICE_DELETED", |_| true, Duration::from_millis(50))
            .unwrap_err();
        assert_eq!(
            err.message(),
            "QEMU sent no DEVICE_DELETED event within 50ms"
        );
    }
}
