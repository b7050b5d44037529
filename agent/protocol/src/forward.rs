//! Port-forward connections: the host connects to [`crate::FORWARD_PORT`] and writes a
//! [`ForwardRequest`] line; the agent dials that TCP port on the guest's loopback and
//! answers with a [`ForwardReply`] line; after an `OK` the connection carries the bytes.

use std::fmt;

use crate::MAX_HEADER_LEN;

/// `FORWARD <port>\n`: the TCP port on the guest's 127.0.0.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardRequest {
    pub port: u16,
}

impl fmt::Display for ForwardRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "FORWARD {}", self.port)
    }
}

impl ForwardRequest {
    /// Parses one request line (with or without its newline).
    pub fn parse(line: &str) -> Result<Self, String> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        if line.len() >= MAX_HEADER_LEN {
            return Err("forward request too long".into());
        }
        let port = line
            .strip_prefix("FORWARD ")
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("malformed forward request {line:?}"))?;
        Ok(Self { port })
    }
}

/// The agent's answer: `OK\n`, or `ERR <reason>\n` before it closes the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardReply {
    Connected,
    Refused(String),
}

impl fmt::Display for ForwardReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardReply::Connected => writeln!(f, "OK"),
            // One line: the reason's own line breaks would end it early.
            ForwardReply::Refused(reason) => writeln!(f, "ERR {}", reason.replace('\n', " ")),
        }
    }
}

impl ForwardReply {
    /// Parses one reply line (with or without its newline). The guest writes it: bounded,
    /// and anything but the two forms is an error.
    pub fn parse(line: &str) -> Result<Self, String> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        if line.len() >= MAX_HEADER_LEN {
            return Err("forward reply too long".into());
        }
        match line {
            "OK" => Ok(ForwardReply::Connected),
            _ => match line.strip_prefix("ERR ") {
                Some(reason) => Ok(ForwardReply::Refused(reason.to_owned())),
                None => Err(format!("malformed forward reply {line:?}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = ForwardRequest { port: 8080 };
        assert_eq!(r.to_string(), "FORWARD 8080\n");
        assert_eq!(ForwardRequest::parse(&r.to_string()), Ok(r));
        for bad in [
            "",
            "FORWARD",
            "FORWARD 0",
            "FORWARD 65536",
            "FORWARD -1",
            "FORWARD 80 x",
        ] {
            assert!(ForwardRequest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_round_trip() {
        for r in [
            ForwardReply::Connected,
            ForwardReply::Refused("connect 127.0.0.1:80: refused".into()),
        ] {
            assert_eq!(ForwardReply::parse(&r.to_string()), Ok(r));
        }
        let multi = ForwardReply::Refused("a\nb".into()).to_string();
        assert_eq!(multi, "ERR a b\n");
        for bad in [
            "",
            "ok",
            "ERR",
            "HTTP/1.1 200 OK",
            &"E".repeat(MAX_HEADER_LEN),
        ] {
            assert!(ForwardReply::parse(bad).is_err(), "{bad}");
        }
    }
}
