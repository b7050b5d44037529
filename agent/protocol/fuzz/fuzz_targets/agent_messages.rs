//! Fuzzes the decoding of what the agent sends the host: every response message the shim
//! reads, from arbitrary bytes (the guest is untrusted). Decoding must end in a message or
//! an error, never a panic, and a decoded message must encode again.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protobuf::Message;
use vmlet_protocol::agent::{
    CreateContainerResponse, ListProcessesResponse, PingResponse, StartProcessResponse,
    StatsResponse, WaitProcessResponse,
};

fn round_trip<M: Message>(data: &[u8]) {
    if let Ok(message) = M::parse_from_bytes(data) {
        let bytes = message.write_to_bytes().expect("a decoded message encodes");
        M::parse_from_bytes(&bytes).expect("an encoded message decodes");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((which, rest)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => round_trip::<PingResponse>(rest),
        1 => round_trip::<CreateContainerResponse>(rest),
        2 => round_trip::<StartProcessResponse>(rest),
        3 => round_trip::<WaitProcessResponse>(rest),
        4 => round_trip::<StatsResponse>(rest),
        _ => round_trip::<ListProcessesResponse>(rest),
    }
});
