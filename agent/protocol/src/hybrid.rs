//! The hybrid vsock handshake of `vhost-device-vsock` (Firecracker's): the host writes
//! `CONNECT <port>\n` on the unix socket and reads `OK <host port>\n`; every byte after the
//! newline belongs to the connection. The reply comes from a process that relays the
//! guest, so it is read a byte at a time, bounded, and checked.

/// Longest reply accepted, newline included.
pub const MAX_REPLY: usize = 64;

/// The request for guest port `port`.
pub fn connect_request(port: u32) -> String {
    format!("CONNECT {port}\n")
}

/// Collects the reply one byte at a time.
#[derive(Debug, Default)]
pub struct ReplyReader {
    line: Vec<u8>,
}

impl ReplyReader {
    /// Takes the next byte: `Ok(None)` wants more, `Ok(Some(port))` is a complete good
    /// reply (the host port), an error says what was wrong.
    pub fn push(&mut self, byte: u8) -> Result<Option<u32>, String> {
        self.line.push(byte);
        if byte == b'\n' {
            return parse_reply(&self.line).map(Some);
        }
        if self.line.len() >= MAX_REPLY {
            return Err(format!("reply longer than {MAX_REPLY} bytes"));
        }
        Ok(None)
    }
}

/// Parses a whole reply line: `OK <host port>\n`.
pub fn parse_reply(line: &[u8]) -> Result<u32, String> {
    let text = std::str::from_utf8(line).map_err(|_| format!("reply {line:?} is not text"))?;
    match text.strip_suffix('\n').unwrap_or(text).split_once(' ') {
        Some(("OK", port)) => port
            .parse::<u32>()
            .map_err(|_| format!("unexpected reply {text:?}")),
        _ => Err(format!("unexpected reply {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(bytes: &[u8]) -> Result<Option<u32>, String> {
        let mut r = ReplyReader::default();
        for b in bytes {
            if let Some(done) = r.push(*b)? {
                return Ok(Some(done));
            }
        }
        Ok(None)
    }

    #[test]
    fn good_reply_gives_the_port() {
        assert_eq!(feed(b"OK 1073741824\n"), Ok(Some(1073741824)));
        assert_eq!(feed(b"OK 5"), Ok(None), "wants the newline");
        assert_eq!(connect_request(1024), "CONNECT 1024\n");
    }

    #[test]
    fn bad_replies_are_refused() {
        for bad in [
            &b"\n"[..],
            b"OK\n",
            b"ERR\n",
            b"OK x\n",
            b"NOPE 1\n",
            b"OK -1\n",
            b"\xff\n",
        ] {
            assert!(feed(bad).is_err(), "{bad:?}");
        }
        assert!(feed(&[b'O'; 100]).unwrap_err().contains("longer than"));
    }
}
