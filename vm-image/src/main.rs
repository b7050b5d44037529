//! `vmlet-image build --out DIR [--kernel lean|cloud] [--kernel-deb FILE] [--agent FILE]`
//! (see [`vmlet_vm_image::cli`]).

use clap::Parser;
use vmlet_vm_image::cli::{ImageCommand, VmletImage};

fn main() -> anyhow::Result<()> {
    let ImageCommand::Build(build) = VmletImage::parse().command;
    let opts = build
        .options()
        .unwrap_or_else(|message| VmletImage::fail(&message));
    let manifest = vmlet_vm_image::build(&opts)?;
    println!("{}", serde_json::to_string_pretty(&manifest)?);
    Ok(())
}
