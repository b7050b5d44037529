//! Running a client (`ctr -t`) on a pseudo-terminal of a chosen size, as a user's shell
//! would, and collecting what it printed there.

use std::os::fd::OwnedFd;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::bounded::{describe, output_within, COMMAND_TIMEOUT};

/// Shell that prints `stty size` once the terminal has one, waiting as long as 5 s: `ctr`
/// sends its terminal's size only after the process started.
pub const WAIT_FOR_A_SIZE: &str = "for i in $(seq 50); do s=$(stty size 2>/dev/null); \
    [ -n \"$s\" ] && [ \"$s\" != '0 0' ] && break; sleep 0.1; done; echo \"$s\"";

/// Runs `command` with a new terminal of `rows` x `cols` as its stdin, stdout and stderr.
/// Returns its exit and everything written to the terminal.
pub fn run_on_terminal(
    mut command: Command,
    rows: u16,
    cols: u16,
) -> anyhow::Result<(Output, String)> {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).context("openpty")?;
    let slave = |fd: &OwnedFd| -> anyhow::Result<Stdio> {
        Ok(Stdio::from(fd.try_clone().context("dup pty")?))
    };
    let what = describe(&command);
    let child = command
        .stdin(slave(&pty.slave)?)
        .stdout(slave(&pty.slave)?)
        .stderr(slave(&pty.slave)?)
        .spawn()
        .with_context(|| format!("start {what}"))?;
    // The terminal reads EOF only once no slave end is left open here: the command holds
    // copies until it is dropped.
    drop(command);
    drop(pty.slave);
    let master = pty.master;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut file = std::fs::File::from(master);
        let mut buf = [0u8; 4096];
        // Ends with EIO once every slave end is closed.
        while let Ok(n) = std::io::Read::read(&mut file, &mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        let _ = tx.send(all);
    });
    let out = output_within(child, COMMAND_TIMEOUT, &what)?;
    let seen = rx
        .recv_timeout(Duration::from_secs(10))
        .with_context(|| format!("the terminal of {what} stayed open after it exited"))?;
    Ok((out, String::from_utf8_lossy(&seen).into_owned()))
}
