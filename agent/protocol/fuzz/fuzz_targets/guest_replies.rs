//! Fuzzes the host's readers of the guest's one-line replies: whatever bytes come back for
//! the hybrid vsock `CONNECT`, the reader stops within its bound, with a port only for
//! `OK <port>\n`; whatever line comes back for a port-forward request, it parses to `OK`,
//! an `ERR` with its reason, or an error, never more than the bound; whatever the guest
//! sends for its handshake challenge and proof, only the exact lines parse.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vmlet_protocol::auth::{Accept, Hello};
use vmlet_protocol::hybrid::{ReplyReader, MAX_REPLY};
use vmlet_protocol::{ForwardReply, MAX_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let mut reader = ReplyReader::default();
    for (i, byte) in data.iter().enumerate() {
        assert!(i < MAX_REPLY, "read past the bound");
        match reader.push(*byte) {
            Ok(None) => {}
            Ok(Some(port)) => {
                let line = &data[..=i];
                assert!(line.starts_with(b"OK ") && line.ends_with(b"\n"));
                let digits = std::str::from_utf8(&line[3..i]).expect("a port is text");
                assert_eq!(digits.parse::<u32>(), Ok(port));
                break;
            }
            Err(_) => break,
        }
    }

    let line = String::from_utf8_lossy(data);
    match ForwardReply::parse(&line) {
        Ok(ForwardReply::Connected) => assert_eq!(line.trim_end_matches('\n'), "OK"),
        Ok(ForwardReply::Refused(reason)) => {
            assert!(line.starts_with("ERR ") && reason.len() < MAX_HEADER_LEN)
        }
        Err(_) => {}
    }

    if let Ok(hello) = Hello::parse(data) {
        assert_eq!(hello.to_line().as_bytes(), data);
    }
    if let Ok(accept) = Accept::parse(data) {
        assert_eq!(accept.to_line().as_bytes(), data);
    }
});
