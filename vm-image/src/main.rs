//! `vmlet-image build --out DIR [--kernel lean|cloud] [--kernel-deb FILE] [--agent FILE]`

use std::path::PathBuf;

use anyhow::{bail, Context};
use vmlet_vm_image::Kernel;

const USAGE: &str =
    "usage: vmlet-image build --out DIR [--kernel lean|cloud] [--kernel-deb FILE] [--agent FILE]";

fn parse(args: &[String]) -> anyhow::Result<vmlet_vm_image::Options> {
    let mut out = None;
    let mut kind = None;
    let mut kernel_deb = None;
    let mut agent = None;
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("build") => {}
        _ => bail!(USAGE),
    }
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--out" => out = Some(PathBuf::from(value()?)),
            "--kernel" => kind = Some(value()?.clone()),
            "--kernel-deb" => kernel_deb = Some(PathBuf::from(value()?)),
            "--agent" => agent = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let kernel = match (kind.as_deref(), kernel_deb) {
        (None | Some("lean"), None) => Kernel::Lean,
        (Some("lean"), Some(_)) => {
            bail!("--kernel-deb names a cloud kernel package; it does not go with --kernel lean")
        }
        (None | Some("cloud"), deb) => Kernel::Cloud { deb },
        (Some(other), _) => bail!("--kernel {other:?}: expected lean or cloud"),
    };
    Ok(vmlet_vm_image::Options {
        out: out.context("--out DIR is required")?,
        kernel,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &str) -> anyhow::Result<vmlet_vm_image::Options> {
        let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
        parse(&args)
    }

    #[test]
    fn the_lean_kernel_is_the_default_and_the_cloud_kernel_selectable() {
        assert_eq!(parsed("build --out o").unwrap().kernel, Kernel::Lean);
        assert_eq!(
            parsed("build --out o --kernel cloud").unwrap().kernel,
            Kernel::Cloud { deb: None }
        );
        assert_eq!(
            parsed("build --out o --kernel-deb k.deb").unwrap().kernel,
            Kernel::Cloud {
                deb: Some("k.deb".into())
            }
        );
    }

    #[test]
    fn bad_kernel_choices_are_named() {
        let err = parsed("build --out o --kernel tiny")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"tiny\""), "{err}");
        let err = parsed("build --out o --kernel lean --kernel-deb k.deb")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--kernel-deb"), "{err}");
        assert!(parsed("build --kernel lean").is_err());
    }
}
