//! `vmletctl`'s command line: what its `--help` prints, what `vmletctl completion` and its
//! man pages are made from.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `vmletctl`: see [`crate::ctl`].
#[derive(Debug, Parser)]
#[command(
    name = "vmletctl",
    version,
    about = "Inspect and clean up vmlet's pods on this node",
    long_about = "Inspect and clean up vmlet's pods on this node.\n\n\
        vmletctl reads the node config the shim reads: --config, else $VMLET_CONFIG, else \
        /etc/vmlet/config.toml (all defaults when that file is missing)."
)]
pub struct Vmletctl {
    /// The node config file to read instead of $VMLET_CONFIG or /etc/vmlet/config.toml.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// List every pod vmlet finds (state directories, marked libvirt domains, marked taps in
    /// /run/netns): its namespace and name, kind, vCPUs, memory, accelerator, state (running,
    /// stopped, or orphaned when its shim is gone) and age.
    Ps {
        /// The output format.
        #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
        output: OutputFormat,
    },
    /// Print a pod's guest console (control characters shown as `?`).
    Console(ConsoleArgs),
    /// Remove what pods whose shim is gone left behind (state, domains, taps, helpers).
    Gc {
        /// Print what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Say, line by line, what this node has and what vmlet will use (KVM or TCG, the vsock
    /// backend, libvirt, QEMU, virtiofsd, the guest image, cgroups, containerd); exits with
    /// status 1 when something keeps a pod from starting.
    Check(CheckArgs),
    /// Print every pod's figures (VM CPU and memory on the host, boot and agent times, agent
    /// round trip, execs, the shim's own) as Prometheus text, or serve them over HTTP.
    Metrics {
        /// Serve GET /metrics on this address instead of printing once (without one:
        /// 127.0.0.1:9464, loopback only).
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = crate::metrics_server::DEFAULT_ADDRESS)]
        listen: Option<std::net::SocketAddr>,
        /// The pods' state directory to read instead of the node config's `state_dir` (the
        /// node config is then not read: a container that mounts only that directory).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Install the release this vmletctl belongs to (an unpacked `make dist` tarball) onto
    /// the node: its programs, guest image, man pages and completions, vmlet's CRI runtime (a
    /// drop-in file where containerd's config imports a directory of them and containerd
    /// merges it, else appended to the config after a backup), /etc/vmlet/config.toml when
    /// absent. Another installed version is taken off first.
    Install(InstallArgs),
    /// Take off what `install` put on the node; containerd's config gets its bytes back (or
    /// vmlet's drop-in file is removed).
    Uninstall(UninstallArgs),
    /// Print a shell completion script for vmletctl.
    Completion {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// The pod: NAMESPACE/NAME (Kubernetes' for a CRI pod, containerd's namespace and the
    /// task's id for `ctr run`), or its pod id (`vmletctl ps` shows both).
    pub pod: String,
    /// Keep printing what the guest writes until the pod is gone (or Ctrl-C).
    #[arg(short, long)]
    pub follow: bool,
    /// Type into the console too (a VM image's: vmlet's own guest has no login there): the
    /// console's last lines, then what the guest writes, and your keys to the guest's
    /// serial input, until Ctrl-], the end of input, or the pod's end.
    #[arg(short, long, conflicts_with = "follow")]
    pub interactive: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print only the accelerator this node's pods get now, `kvm` or `tcg` (status 1 where
    /// no pod can start: accel = "kvm" where KVM runs no guest). The installer labels the
    /// node `vmlet.io/accel` with it.
    #[arg(long)]
    pub accel: bool,
    /// The containerd binary to ask its version (default: containerd on the PATH).
    #[arg(long, value_name = "FILE")]
    pub containerd: Option<PathBuf>,
    /// containerd's config, where vmlet's CRI runtime should be registered.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/etc/containerd/config.toml"
    )]
    pub containerd_config: PathBuf,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The root of the node's file system (a chroot, a container's root, the host's /).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// The unpacked release (default: the one this vmletctl is in, `RELEASE/bin/vmletctl`).
    #[arg(long, value_name = "DIR")]
    pub release: Option<PathBuf>,
    /// containerd's config version when it has no config yet: 2 (containerd 1.6, 1.7) or 3
    /// (2.x) (default: from `containerd --version` under the root, else 3).
    #[arg(long, value_name = "VERSION", value_parser = ["2", "3"])]
    pub config_version: Option<String>,
    /// Restart containerd (systemctl, in the mount namespace of the host's init when
    /// vmletctl runs in a container with the host's PIDs) once its config has vmlet's runtime.
    #[arg(long)]
    pub restart_containerd: bool,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Stay running once installed, until SIGTERM or SIGINT (a DaemonSet's pod stays up).
    #[arg(long)]
    pub wait: bool,
}

/// The Kubernetes node whose `vmlet.io/runtime` label install sets and uninstall removes.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Label (install) or unlabel (uninstall) this Kubernetes node `vmlet.io/runtime=true`,
    /// with the pod's service account (vmletctl runs in the installer DaemonSet's pod).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Where the service account's token and ca.crt are.
    #[arg(
        long,
        value_name = "DIR",
        default_value = crate::node_label::SERVICE_ACCOUNT_DIR
    )]
    pub service_account: PathBuf,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// The root `install` was given.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Restart containerd (systemctl, as for install) once vmlet's runtime is out of its
    /// config.
    #[arg(long)]
    pub restart_containerd: bool,
    /// Uninstall although vmlet pods run (refused otherwise, naming them): they run on, but
    /// without vmlet's programs their removal leaves their VMs behind (`vmletctl gc` of a
    /// later install removes them).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns.
    Table,
    /// One JSON array of pods.
    Json,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_is_well_formed() {
        Vmletctl::command().debug_assert();
    }

    #[test]
    fn vmletctl_parses_its_subcommands() {
        let ctl = Vmletctl::try_parse_from(["vmletctl", "ps", "-o", "json"]).unwrap();
        assert!(matches!(
            ctl.command,
            CtlCommand::Ps {
                output: OutputFormat::Json
            }
        ));
        let ctl = Vmletctl::try_parse_from(["vmletctl", "console", "p1", "--follow"]).unwrap();
        assert!(
            matches!(ctl.command, CtlCommand::Console(ConsoleArgs { follow: true, interactive: false, ref pod }) if pod == "p1")
        );
        let ctl = Vmletctl::try_parse_from(["vmletctl", "console", "-i", "p1"]).unwrap();
        assert!(matches!(
            ctl.command,
            CtlCommand::Console(ConsoleArgs {
                interactive: true,
                follow: false,
                ..
            })
        ));
        assert!(Vmletctl::try_parse_from(["vmletctl", "console", "-i", "-f", "p1"]).is_err());
        let ctl = Vmletctl::try_parse_from(["vmletctl", "--config", "/c.toml", "gc", "--dry-run"])
            .unwrap();
        assert_eq!(ctl.config, Some(PathBuf::from("/c.toml")));
        assert!(matches!(ctl.command, CtlCommand::Gc { dry_run: true }));
        let err = Vmletctl::try_parse_from(["vmletctl", "ps", "-o", "yaml"]).unwrap_err();
        assert!(err.to_string().contains("yaml"), "{err}");
    }
}
