//! `vmlet-agent`: PID 1 of a vmlet guest, or (re-executed as `__container-init`) the first
//! process of a container inside its new namespaces, or (as `__exec-server`) the helper that
//! starts a container's exec processes inside its namespaces. Outside a guest, a lone
//! `--help` or `--version` is answered (without clap: the agent is in every guest's memory).

const HELP: &str = "\
vmlet-agent: the vmlet guest agent

It runs as PID 1 (/init) of a vmlet guest VM: it mounts the guest's file systems, brings up
its network and serves the shim's ttrpc requests (create, start, exec, signals, stats) on
vsock port 1024. It is not run by hand; the shim boots it inside each pod's VM.

Usage: vmlet-agent [--help | --version]

Options:
  -h, --help     Print this help
  -V, --version  Print the version
";

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some(vmlet_agent::CONTAINER_INIT_ARG) => vmlet_agent::container_init::run(),
        Some(vmlet_agent::EXEC_SERVER_ARG) => vmlet_agent::exec_server::run(),
        // PID 1 takes no arguments of its own: the kernel hands it what it did not know.
        Some("--help" | "-h") if std::process::id() != 1 => print!("{HELP}"),
        Some("--version" | "-V") if std::process::id() != 1 => {
            println!("vmlet-agent {}", env!("CARGO_PKG_VERSION"))
        }
        _ => vmlet_agent::run_agent(),
    }
}
