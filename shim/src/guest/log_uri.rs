//! Where a process's output goes: containerd's FIFO, or a log URI (`file:///path`,
//! `binary:///path/to/logger?key=value`) as `ctr run --log-uri` and nerdctl pass them.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::pipe2;

use crate::Error;

/// How long a logging binary may take to report ready (by closing fd 5).
const LOGGER_READY_MS: u16 = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// A FIFO path from containerd.
    Fifo(PathBuf),
    /// `file:///path`: appended to.
    File(PathBuf),
    /// `binary:///path?k=v`: a logger started with the streams on fds 3 and 4.
    Binary { path: PathBuf, args: Vec<String> },
}

/// Which part of a log URI is decoded: containerd parses the URI with Go's `net/url`, whose
/// path keeps a `+` and whose query (form encoding) reads it as a space.
#[derive(Clone, Copy)]
enum Part {
    Path,
    Query,
}

/// A part of a log URI with its `%XX` escapes decoded; a `%` not followed by two hex digits
/// (which Go's `net/url` refuses too) and bytes that are not UTF-8 are refused by name.
fn decode(s: &str, part: Part) -> Result<String, Error> {
    let bytes = s.as_bytes();
    let bad_escape = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if bad_escape {
        return Err(Error::InvalidArgument(format!(
            "bad escape in log URI part {s:?}"
        )));
    }
    let spaced;
    let s = match part {
        Part::Path => s,
        Part::Query => {
            spaced = s.replace('+', " ");
            &spaced
        }
    };
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|d| d.into_owned())
        .map_err(|_| Error::InvalidArgument(format!("log URI part {s:?} is not UTF-8")))
}

impl OutputTarget {
    /// Parses what containerd passed as a stdout/stderr path.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let Some((scheme, rest)) = value.split_once("://") else {
            return Ok(OutputTarget::Fifo(PathBuf::from(value)));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !path.starts_with('/') {
            return Err(Error::InvalidArgument(format!(
                "log URI {value:?} needs an absolute path"
            )));
        }
        let path = PathBuf::from(decode(path, Part::Path)?);
        match scheme {
            "file" if query.is_empty() => Ok(OutputTarget::File(path)),
            "file" => Err(Error::InvalidArgument(format!(
                "log URI {value:?}: file:// takes no query"
            ))),
            "binary" => {
                let mut args = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (key, val) = pair.split_once('=').unwrap_or((pair, ""));
                    args.push(decode(key, Part::Query)?);
                    args.push(decode(val, Part::Query)?);
                }
                Ok(OutputTarget::Binary { path, args })
            }
            other => Err(Error::InvalidArgument(format!(
                "log URI {value:?}: unknown scheme {other:?}"
            ))),
        }
    }
}

/// Starts a logging binary the way containerd's shims do: stdout on fd 3, stderr on fd 4,
/// fd 5 closed by the logger when it is ready; `CONTAINER_ID` and `CONTAINER_NAMESPACE` in
/// its environment. Returns the write ends of its stdout and stderr pipes. The shim's
/// reaper collects the logger when it exits (after both pipes reached EOF).
pub fn start_logger(
    path: &PathBuf,
    args: &[String],
    container_id: &str,
    namespace: &str,
) -> Result<(OwnedFd, OwnedFd), Error> {
    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::io("pipe", e.into()));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (ready_r, ready_w) = pipe()?;
    let sources = [out_r.as_raw_fd(), err_r.as_raw_fd(), ready_w.as_raw_fd()];
    let mut command = Command::new(path);
    command
        .args(args)
        .env("CONTAINER_ID", container_id)
        .env("CONTAINER_NAMESPACE", namespace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls umask, fcntl
    // and dup2, which are async-signal-safe, on descriptors that are open in the child.
    unsafe {
        command.pre_exec(move || {
            // The logging binary's files as under runc's shim: not the shim's umask of 077.
            libc::umask(0o022);
            let mut moved = [0; 3];
            for (i, fd) in sources.iter().enumerate() {
                moved[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
                if moved[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, fd) in moved.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| Error::io(format!("start logging binary {}", path.display()), e))?;
    drop((out_r, err_r, ready_w));
    drop(child);
    let mut fds = [PollFd::new(ready_r.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(LOGGER_READY_MS)) {
        Ok(n) if n > 0 => Ok((out_w, err_w)),
        Ok(_) => Err(Error::Timeout(format!(
            "logging binary {} did not get ready within {LOGGER_READY_MS} ms",
            path.display()
        ))),
        Err(e) => Err(Error::io("wait for the logging binary", e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_are_fifos() {
        assert_eq!(
            OutputTarget::parse("/run/containerd/fifo/x-stdout").unwrap(),
            OutputTarget::Fifo("/run/containerd/fifo/x-stdout".into())
        );
    }

    #[test]
    fn file_and_binary_uris() {
        assert_eq!(
            OutputTarget::parse("file:///var/log/a%20b.log").unwrap(),
            OutputTarget::File("/var/log/a b.log".into())
        );
        assert_eq!(
            OutputTarget::parse("binary:///usr/bin/logger?--dir=/tmp/x&-v").unwrap(),
            OutputTarget::Binary {
                path: "/usr/bin/logger".into(),
                args: vec!["--dir".into(), "/tmp/x".into(), "-v".into(), String::new()],
            }
        );
    }

    #[test]
    fn a_plus_is_a_space_in_the_query_only_as_in_containerd() {
        assert_eq!(
            OutputTarget::parse("binary:///opt/c++/log%2Bger?name=a+b%2Bc").unwrap(),
            OutputTarget::Binary {
                path: "/opt/c++/log+ger".into(),
                args: vec!["name".into(), "a b+c".into()],
            }
        );
        assert_eq!(
            OutputTarget::parse("file:///var/log/a+b.log").unwrap(),
            OutputTarget::File("/var/log/a+b.log".into())
        );
    }

    #[test]
    fn bad_uris_are_refused_by_name() {
        for bad in [
            "ftp:///x",
            "file://relative",
            "file:///x?y=1",
            "binary:///x?a=%zz",
            "binary:///x?a=%4",
            "file:///x%",
            "file:///x%ff",
        ] {
            let err = OutputTarget::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains(bad.split('?').next().unwrap())
                    || err.contains("escape")
                    || err.contains("UTF-8"),
                "{bad}: {err}"
            );
        }
    }
}
