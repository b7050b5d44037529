//! `vmletctl`: vmlet's debug and cleanup tool, reading the node config like the shim
//! (`VMLET_CONFIG` or `/etc/vmlet/config.toml`).
//!
//! - `vmletctl ps`: every pod vmlet finds (state directories, marked libvirt domains, marked
//!   taps in `/run/netns/*`) with its shim, domain and taps;
//! - `vmletctl console POD`: the pod's guest console so far;
//! - `vmletctl gc [--dry-run]`: removes what pods whose shim is gone left behind.

use std::path::Path;
use std::process::ExitCode;

use vmlet_config::NodeConfig;
use vmlet_shim::ctl;
use vmlet_shim::vmm::Libvirt;

const USAGE: &str = "usage: vmletctl ps | console POD | gc [--dry-run]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vmletctl: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[&str]) -> Result<(), String> {
    let config = NodeConfig::load().map_err(|e| format!("node config: {e}"))?;
    let vmm = Libvirt::new(&config.libvirt_uri);
    let netns_dir = Path::new(ctl::NAMED_NETNS_DIR);
    match args {
        ["ps"] => {
            let pods = ctl::survey(&config.state_dir, netns_dir, &vmm).map_err(|e| e.message())?;
            println!(
                "{:<66} {:>8} {:>6} {:<8} {:>4}",
                "POD", "SHIM", "STATE", "DOMAIN", "TAPS"
            );
            for p in pods {
                println!(
                    "{:<66} {:>8} {:>6} {:<8} {:>4}",
                    p.pod_id,
                    p.shim_pid.map_or("gone".into(), |pid| pid.to_string()),
                    if p.has_state { "yes" } else { "no" },
                    match p.domain_active {
                        Some(true) => "running",
                        Some(false) => "defined",
                        None => "none",
                    },
                    p.taps.len()
                );
            }
            Ok(())
        }
        ["console", pod] => {
            let path = vmlet_shim::pod_paths::PodPaths::new(&config.state_dir, pod).console;
            let text =
                std::fs::read(&path).map_err(|e| format!("pod {pod}: {}: {e}", path.display()))?;
            print!("{}", String::from_utf8_lossy(&text));
            Ok(())
        }
        ["gc", rest @ ..] if rest.is_empty() || rest == ["--dry-run"] => {
            let dry_run = !rest.is_empty();
            let removed = ctl::gc(&config, netns_dir, &vmm, dry_run).map_err(|e| e.message())?;
            for what in &removed {
                println!(
                    "{}{what}",
                    if dry_run { "would remove " } else { "removed " }
                );
            }
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}
