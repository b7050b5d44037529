//! `vmlet-libvirt URI OPERATION [ARGS]`: one libvirt call for the shim (see
//! `vmlet_shim::vmm::libvirt_helper`), so that the shim, alive as long as its pod, never maps
//! libvirt's libraries. The request of `start` (the domain XML and its AppArmor files, as
//! JSON) comes on stdin; stdout gets `ok` and the answer, or `error` and the message (exit
//! status 1), each after a newline; called wrongly, usage on stderr and exit status 2
//! ([`vmlet_libvirt::cli::LibvirtHelper`]).

use std::io::Read;

use clap::Parser;
use vmlet_libvirt::cli::LibvirtHelper;
use vmlet_libvirt::Libvirt;
use vmlet_shim::vmm::libvirt_helper::{check_protocol, serve, PROTOCOL_ENV};
use vmlet_shim::Error;

/// The largest start request taken on stdin.
const INPUT_LIMIT: u64 = 4 << 20;

fn main() {
    let LibvirtHelper { uri, operation } = LibvirtHelper::parse();
    let mut input = String::new();
    if operation.first().map(String::as_str) == Some("start") {
        if let Err(e) = std::io::stdin()
            .take(INPUT_LIMIT + 1)
            .read_to_string(&mut input)
        {
            eprintln!("vmlet-libvirt: read the start request: {e}");
            std::process::exit(2);
        }
        if input.len() as u64 > INPUT_LIMIT {
            print!("error\nstart: the request is larger than {INPUT_LIMIT} bytes");
            std::process::exit(1);
        }
    }
    // libvirt would print each error to stderr itself as well; the shim wants one message.
    virt::error::clear_error_callback();
    let protocol = std::env::var(PROTOCOL_ENV).ok();
    let answered = check_protocol(protocol.as_deref())
        .and_then(|()| serve(&Libvirt::new(&uri), &operation, &input));
    match answered {
        Ok(answer) => print!("ok\n{answer}"),
        Err(e) => {
            // The shim makes a libvirt error of this text again.
            match e {
                Error::Libvirt(text) => print!("error\n{text}"),
                other => print!("error\n{}", other.message()),
            }
            std::process::exit(1);
        }
    }
}
