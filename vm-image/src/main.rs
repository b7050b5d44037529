//! `vmlet-image build --out DIR [--kernel-deb FILE] [--agent FILE]`

use std::path::PathBuf;

use anyhow::{bail, Context};

fn parse(args: &[String]) -> anyhow::Result<vmlet_vm_image::Options> {
    let mut out = None;
    let mut kernel_deb = None;
    let mut agent = None;
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("build") => {}
        _ => bail!("usage: vmlet-image build --out DIR [--kernel-deb FILE] [--agent FILE]"),
    }
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .map(PathBuf::from)
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--out" => out = Some(value()?),
            "--kernel-deb" => kernel_deb = Some(value()?),
            "--agent" => agent = Some(value()?),
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(vmlet_vm_image::Options {
        out: out.context("--out DIR is required")?,
        kernel_deb,
        agent,
    })
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = parse(&args)?;
    let manifest = vmlet_vm_image::build(&opts)?;
    println!("{}", serde_json::to_string_pretty(&manifest)?);
    Ok(())
}
