//! containerd-shim-vmlet-v2: see the `vmlet_shim` crate.

#[tokio::main]
async fn main() {
    vmlet_shim::run().await;
}
