//! containerd-shim-vmlet-v2: see the `vmlet_shim` crate.

use std::time::Duration;

fn main() {
    // Nothing the shim makes is open to group or other unless it says so (docs/security.md).
    vmlet_shim::private_umask();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(vmlet_shim::run());
    // Never let a stuck blocking call keep an exiting shim alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
}
