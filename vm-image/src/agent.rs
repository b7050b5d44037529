//! Building `vmlet-agent` as a static binary with cargo.

use std::path::PathBuf;
use std::process::Command;

use crate::{progress, Error};

const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds the agent (static glibc) in the workspace this crate belongs to and returns its
/// path. cargo does no work when nothing changed.
pub fn build_static() -> Result<PathBuf, Error> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .ok_or_else(|| Error::Kernel("no workspace dir".into()))?;
    let target_dir = workspace.join("target/agent-static");
    progress("building vmlet-agent (static)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "vmlet-agent",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .current_dir(&workspace)
        .status()
        .map_err(|e| Error::Command {
            command: "cargo build -p vmlet-agent".into(),
            detail: e.to_string(),
        })?;
    if !status.success() {
        return Err(Error::Command {
            command: "cargo build -p vmlet-agent".into(),
            detail: status.to_string(),
        });
    }
    Ok(target_dir.join(TARGET).join("release/vmlet-agent"))
}
