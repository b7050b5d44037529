//! `cli-docs DIR`: writes the man pages (`DIR/man/man1/`, one per program and subcommand)
//! and the bash, zsh and fish completions (`DIR/completions/`) of vmlet's host programs,
//! from their clap commands (`vmlet_shim::cli`, `vmletctl::cli`, `vmlet_libvirt::cli`,
//! `vmlet_vm_image::cli`). `make dist` puts them in the release.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> anyhow::Result<()> {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .context("usage: cli-docs DIR")?
        .into();
    let mut commands = vmlet_shim::cli::commands();
    commands.push(vmletctl::cli::Vmletctl::command());
    commands.push(vmlet_libvirt::cli::LibvirtHelper::command());
    commands.push(vmlet_vm_image::cli::VmletImage::command());
    for command in commands {
        write_docs(command, &dir)?;
    }
    Ok(())
}

fn write_docs(mut command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    let name = command.get_name().to_owned();
    let man = dir.join("man/man1");
    std::fs::create_dir_all(&man).with_context(|| format!("create {}", man.display()))?;
    clap_mangen::generate_to(command.clone(), &man)
        .with_context(|| format!("man pages of {name}"))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let to = dir.join("completions").join(shell.to_string());
        std::fs::create_dir_all(&to).with_context(|| format!("create {}", to.display()))?;
        clap_complete::generate_to(shell, &mut command, &name, &to)
            .with_context(|| format!("{shell} completion of {name}"))?;
    }
    Ok(())
}
