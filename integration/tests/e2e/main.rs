//! The end-to-end suite: one binary against the real containerd, libvirtd, QEMU, virtiofsd
//! and CNI plugins of a stack that is up (`eval "$(scripts/stack up)"`), a module per area.
//! Every test is `#[ignore]`d so that `cargo test --workspace` only builds it; `scripts/e2e`
//! (`make e2e`) runs the areas in its order, each under a deadline, starting with
//! `leftovers::before_the_suite` and ending with `leftovers::nothing_is_left_behind`:
//!
//! ```text
//! cargo test --locked --workspace --test e2e -- --ignored --test-threads=1 ctr::
//! ```

mod support;

mod agent_gate;
mod block_devices;
mod cni;
mod containerd_drop_in;
mod cri;
mod ctr;
mod cycles;
mod direct_launch;
mod direct_pods;
mod exec;
mod faults;
mod guest_boundary;
mod guest_fill;
mod guest_privileges;
mod k8s;
mod k8s_token;
mod leftovers;
mod libvirt_outage;
mod metrics;
mod nerdctl;
mod netns;
mod network;
mod node_config;
mod qemu_user;
mod resources;
mod templates;
mod vm_exec;
mod vm_mode;
mod vm_networks;
mod vm_options;
mod vm_stop;
mod vm_virtlet;
mod vm_volumes;
mod vmletctl;
