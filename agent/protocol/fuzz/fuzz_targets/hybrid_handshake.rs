//! Fuzzes the host's side of the hybrid vsock handshake: whatever bytes come back for
//! `CONNECT`, the reader stops within its bound, with a port only for `OK <port>\n`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vmlet_protocol::hybrid::{ReplyReader, MAX_REPLY};

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
});
