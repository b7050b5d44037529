//! The header that opens a stdio stream connection.

use std::fmt;

/// Longest header line the agent reads, newline included.
pub const MAX_HEADER_LEN: usize = 512;

/// Which stdio stream a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    Stdin,
    Stdout,
    Stderr,
}

impl StreamKind {
    fn as_str(self) -> &'static str {
        match self {
            StreamKind::Stdin => "stdin",
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
        }
    }
}

/// `STREAM <container-id> <exec-id or -> <stdin|stdout|stderr>\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHeader {
    pub container_id: String,
    /// Empty for the container's init process.
    pub exec_id: String,
    pub kind: StreamKind,
}

impl fmt::Display for StreamHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let exec = if self.exec_id.is_empty() {
            "-"
        } else {
            &self.exec_id
        };
        writeln!(
            f,
            "STREAM {} {} {}",
            self.container_id,
            exec,
            self.kind.as_str()
        )
    }
}

impl StreamHeader {
    /// Parses one header line (with or without its newline).
    pub fn parse(line: &str) -> Result<Self, String> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        if line.len() >= MAX_HEADER_LEN {
            return Err("stream header too long".into());
        }
        let mut words = line.split(' ');
        let (Some("STREAM"), Some(container), Some(exec), Some(kind), None) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            return Err(format!("malformed stream header {line:?}"));
        };
        if container.is_empty() || exec.is_empty() {
            return Err(format!("malformed stream header {line:?}"));
        }
        let kind = match kind {
            "stdin" => StreamKind::Stdin,
            "stdout" => StreamKind::Stdout,
            "stderr" => StreamKind::Stderr,
            other => return Err(format!("unknown stream {other:?}")),
        };
        Ok(Self {
            container_id: container.to_owned(),
            exec_id: if exec == "-" {
                String::new()
            } else {
                exec.to_owned()
            },
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for exec_id in ["", "exec-1"] {
            let h = StreamHeader {
                container_id: "c1".into(),
                exec_id: exec_id.into(),
                kind: StreamKind::Stderr,
            };
            assert_eq!(StreamHeader::parse(&h.to_string()), Ok(h));
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "STREAM",
            "STREAM a b",
            "STREAM a b stdweird",
            "GET / HTTP/1.1",
            "STREAM a b stdin extra",
        ] {
            assert!(StreamHeader::parse(bad).is_err(), "{bad}");
        }
    }
}
