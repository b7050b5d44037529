//! The node's programs as `vmletctl` asks them (`check`, `install`): found on the PATH, or
//! run, chrooted into the node's root when that is not `/` (so that a node's program runs
//! with the node's libraries when vmletctl runs in a container), with a deadline and
//! bounded output. (The shim's own runs are [`vmlet_shim::host::host_command`]'s.)

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a program's `--version` may take.
const VERSION_DEADLINE: Duration = Duration::from_secs(10);
/// The most of a program's output read.
const VERSION_OUTPUT: u64 = 4096;

pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The first line a program prints for `--version` (stdout, else stderr), run with a
/// deadline and bounded output.
pub fn version_line(program: &Path) -> Result<String, String> {
    version_line_under(Path::new("/"), program)
}

/// [`version_line`] of `program` (a path inside `root`) run chrooted into `root`, so that a
/// node's program runs with the node's libraries when vmletctl runs in a container or a
/// chroot's host.
pub fn version_line_under(root: &Path, program: &Path) -> Result<String, String> {
    let text = run_under(root, program, &["--version".as_ref()], VERSION_DEADLINE)
        .map_err(|e| e.replace("the program", "--version"))?;
    Ok(vmlet_shim::guest::guest_text::clean(
        text.lines().next().unwrap_or("").trim(),
        200,
    ))
}

/// Runs `program` (a path inside `root`) with `args`, chrooted into `root` unless that is
/// `/`, within `deadline`; its stdout (or its stderr where stdout is empty), at most
/// 4 KiB of each. An error says why, with the first line of what it printed.
pub fn run_under(
    root: &Path,
    program: &Path,
    args: &[&std::ffi::OsStr],
    deadline: Duration,
) -> Result<String, String> {
    let inside = program.strip_prefix("/").unwrap_or(program);
    if !root.join(inside).is_file() {
        return Err("not found".into());
    }
    let mut command = Command::new(program);
    if root != Path::new("/") {
        let root = std::ffi::CString::new(root.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{}: a NUL in the path", root.display()))?;
        // SAFETY: chroot and chdir are async-signal-safe system calls on memory owned by
        // the closure; nothing is allocated between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run: {e}"))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("no output pipes".into());
    };
    let read = |pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.take(VERSION_OUTPUT).read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let (out, err) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the program did not answer within {}s",
                    deadline.as_secs()
                ));
            }
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let text = if out.trim().is_empty() { err } else { out };
    if !status.success() {
        let line =
            vmlet_shim::guest::guest_text::clean(text.lines().next().unwrap_or("").trim(), 200);
        return Err(format!("the program failed ({status}): {line}"));
    }
    Ok(text)
}
