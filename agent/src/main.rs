//! `vmlet-agent`: PID 1 of a vmlet guest, or (re-executed as `__container-init`) the first
//! process of a container inside its new namespaces, or (as `__exec-server`) the helper that
//! starts a container's exec processes inside its namespaces.

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some(vmlet_agent::CONTAINER_INIT_ARG) => vmlet_agent::container_init::run(),
        Some(vmlet_agent::EXEC_SERVER_ARG) => vmlet_agent::exec_server::run(),
        _ => vmlet_agent::run_agent(),
    }
}
