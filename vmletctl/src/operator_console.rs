//! `vmletctl console POD --interactive`: the node operator at a VM image's serial console.
//! What the guest writes comes from the console log, cleaned as `--follow` shows it
//! ([`ConsoleFollower`]: no escape sequence of the guest's reaches the terminal); what the
//! operator types goes to the shim's `console-input.sock` (root only, one session at a time:
//! [`vmlet_shim::vm_mode::serial_console::SerialConsole::serve_operator`]), which writes it to the guest's
//! serial input. A terminal is put into raw input mode (keys go to the guest as typed,
//! Ctrl-C included; output still ends lines with CR LF) and restored on the way out.
//! The session ends at Ctrl-], at the end of the input, or when the pod is gone.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vmlet_shim::guest::console::ConsoleFollower;
use vmlet_shim::host::pod_paths::PodPaths;

/// The key that ends the session (Ctrl-], as telnet and `virsh console` have it).
pub const ESCAPE: u8 = 0x1d;
/// How much of the console's past is shown first.
const PAST: u64 = 4096;
/// How often the log is looked at for more.
const POLL: Duration = Duration::from_millis(50);
/// The most the shim says on the input socket (why it refused the session).
const REFUSAL_LIMIT: u64 = 512;

/// Runs the session; Err says why there is none.
pub fn run(paths: &PodPaths, pod: &str) -> Result<(), String> {
    let mut input = connect(paths, pod)?;
    let mut follower = ConsoleFollower::new(&paths.console);
    follower.start_near_end(PAST);
    let done = Arc::new(AtomicBool::new(false));
    // The shim writes on the socket only to refuse the session, and closes it when the
    // console ends.
    let refusal = {
        let (mut socket, done) = (
            input
                .try_clone()
                .map_err(|e| format!("console input: {e}"))?,
            done.clone(),
        );
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let _ = (&mut socket).take(REFUSAL_LIMIT).read_to_end(&mut said);
            done.store(true, Ordering::SeqCst);
            said
        })
    };
    let terminal = RawInput::enter();
    eprint!("[vmlet: the console of pod {pod}; Ctrl-] leaves]\r\n");
    {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 4096];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let typed = &buf[..n];
                let (keys, leave) = match typed.iter().position(|&b| b == ESCAPE) {
                    Some(at) => (&typed[..at], true),
                    None => (typed, false),
                };
                if input.write_all(keys).is_err() || leave {
                    break;
                }
            }
            done.store(true, Ordering::SeqCst);
        });
    }
    let mut out = std::io::stdout().lock();
    while !done.load(Ordering::SeqCst) && paths.dir.exists() {
        let text = follower.read_new().unwrap_or_default();
        if text.is_empty() {
            std::thread::sleep(POLL);
        } else if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    // What the guest wrote last (the echo of the last keys).
    std::thread::sleep(POLL);
    let _ = out.write_all(follower.read_new().unwrap_or_default().as_bytes());
    let _ = out.flush();
    drop(terminal);
    eprintln!();
    if refusal.is_finished() {
        let said = refusal.join().unwrap_or_default();
        if !said.is_empty() {
            let said = vmlet_shim::guest::guest_text::clean(&String::from_utf8_lossy(&said), 512);
            return Err(format!("pod {pod}: {}", said.trim()));
        }
    }
    Ok(())
}

/// The pod's console input, or why there is none.
fn connect(paths: &PodPaths, pod: &str) -> Result<UnixStream, String> {
    if !paths.dir.is_dir() {
        return Err(format!(
            "pod {pod}: no state at {} (is it a vmlet pod on this node?)",
            paths.dir.display()
        ));
    }
    match UnixStream::connect(&paths.console_input) {
        Ok(stream) => Ok(stream),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(format!(
            "pod {pod}: {}: only root may type into a pod's console",
            paths.console_input.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "pod {pod} has no console input: only a VM image's console takes keys (vmlet's own \
             guest has no login on its console: use `ctr task exec` or `kubectl exec`)"
        )),
        Err(e) => Err(format!(
            "pod {pod}: {}: {e} (is its shim running?)",
            paths.console_input.display()
        )),
    }
}

/// A terminal on stdin in raw input mode, restored when dropped; nothing when stdin is not
/// a terminal.
struct RawInput(Option<nix::sys::termios::Termios>);

impl RawInput {
    fn enter() -> Self {
        use nix::sys::termios::{self, OutputFlags, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(&stdin) else {
            return RawInput(None);
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        // Lines the console shows still start at the left.
        raw.output_flags |= OutputFlags::OPOST | OutputFlags::ONLCR;
        match termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw) {
            Ok(()) => RawInput(Some(saved)),
            Err(_) => RawInput(None),
        }
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        if let Some(saved) = self.0.take() {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                &saved,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_without_console_input_is_named_with_what_to_use_instead() {
        let scratch = tempfile::tempdir().unwrap();
        let state = scratch.path();
        let err = connect(&PodPaths::new(state, "gone"), "gone").unwrap_err();
        assert!(err.contains("is it a vmlet pod"), "{err}");
        let paths = PodPaths::new(state, "agent-pod");
        std::fs::create_dir_all(&paths.dir).unwrap();
        let err = connect(&paths, "agent-pod").unwrap_err();
        assert!(
            err.contains("has no console input") && err.contains("kubectl exec"),
            "{err}"
        );
        // A socket nobody serves: the shim is gone.
        drop(std::os::unix::net::UnixListener::bind(&paths.console_input).unwrap());
        let err = connect(&paths, "agent-pod").unwrap_err();
        assert!(err.contains("is its shim running"), "{err}");
    }
}
