//! `vmlet-image`'s command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{Kernel, Options};

#[derive(Debug, Parser)]
#[command(
    name = "vmlet-image",
    version,
    about = "Build the vmlet guest image (kernel, initramfs with the static agent, manifest)",
    long_about = "Build the vmlet guest image: the kernel (vmlinux, the lean kernel, or \
        vmlinuz, the Debian cloud kernel), initrd.img holding the static vmlet-agent as /init, \
        and manifest.json with the sha256 of every file. A second run with the same inputs \
        does no work."
)]
pub struct VmletImage {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build the image into a directory (the node config's guest.kernel and guest.initrd).
    Build(BuildArgs),
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The output directory.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Which kernel: lean (built from Debian's kernel source with vmlet's config, the
    /// default) or cloud (Debian's linux-image-cloud-amd64).
    #[arg(long, value_enum)]
    pub kernel: Option<KernelChoice>,
    /// A local linux-image-*-cloud-amd64 .deb for the cloud kernel (implies --kernel cloud).
    #[arg(long, value_name = "FILE")]
    pub kernel_deb: Option<PathBuf>,
    /// A prebuilt static vmlet-agent (without it the agent is built with cargo).
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelChoice {
    Lean,
    Cloud,
}

impl VmletImage {
    /// Exits like a clap usage error (status 2), with `message`.
    pub fn fail(message: &str) -> ! {
        use clap::CommandFactory;
        Self::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit()
    }
}

impl BuildArgs {
    /// The builder's options; a cloud kernel's package with the lean kernel is refused.
    pub fn options(self) -> Result<Options, String> {
        let kernel =
            match (self.kernel, self.kernel_deb) {
                (None | Some(KernelChoice::Lean), None) => Kernel::Lean,
                (Some(KernelChoice::Lean), Some(_)) => return Err(
                    "--kernel-deb names a cloud kernel package; it does not go with --kernel lean"
                        .into(),
                ),
                (None | Some(KernelChoice::Cloud), deb) => Kernel::Cloud { deb },
            };
        Ok(Options {
            out: self.out,
            kernel,
            agent: self.agent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parsed(args: &str) -> Result<Options, String> {
        let args = std::iter::once("vmlet-image").chain(args.split_whitespace());
        let ImageCommand::Build(build) = VmletImage::try_parse_from(args)
            .map_err(|e| e.to_string())?
            .command;
        build.options()
    }

    #[test]
    fn the_command_is_well_formed() {
        VmletImage::command().debug_assert();
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
        let err = parsed("build --out o --kernel tiny").unwrap_err();
        assert!(err.contains("tiny"), "{err}");
        let err = parsed("build --out o --kernel lean --kernel-deb k.deb").unwrap_err();
        assert!(err.contains("--kernel-deb"), "{err}");
        let err = parsed("build --kernel lean").unwrap_err();
        assert!(err.contains("--out"), "{err}");
    }
}
