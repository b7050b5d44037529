//! The command lines of the shim crate's programs, as clap commands: what each one's
//! `--help` and `--version` print, what `vmletctl completion` and the man pages
//! (`cargo run -p vmlet-integration --bin cli-docs`) are made from.
//!
//! `vmletctl` and `vmlet-libvirt` are parsed by these commands. The shim and the domain's
//! emulator wrapper are called by containerd and libvirt with arguments that are not theirs
//! to define (Go-style `-flags`; QEMU's command line): their commands describe those
//! arguments, and only a lone help or version argument is answered by
//! [`answer_help_or_version`].

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

/// The version of every vmlet program (the crates are versioned together).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

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
    /// List every pod vmlet finds: state directories, marked libvirt domains, marked taps in
    /// /run/netns, with whether its shim still runs.
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
    },
    /// Install the release this vmletctl belongs to (an unpacked `make dist` tarball) onto
    /// the node: its programs, guest image, man pages and completions, vmlet's CRI runtime in
    /// containerd's config (after a backup), /etc/vmlet/config.toml when absent. Another
    /// installed version is taken off first.
    Install(InstallArgs),
    /// Take off what `install` put on the node; containerd's config gets its bytes back.
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
    /// The pod's id (its sandbox's id for a CRI pod, the task's id for `ctr run`).
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

/// `vmlet-libvirt`: see [`crate::vmm_helper`].
#[derive(Debug, Parser)]
#[command(
    name = "vmlet-libvirt",
    version,
    about = "Make one libvirt call for the vmlet shim",
    long_about = "Make one libvirt call for the vmlet shim, so that the shim never maps \
        libvirt's libraries. The domain XML of `start` comes on stdin; stdout gets `ok` and \
        the answer, or `error` and the message (exit status 1), each after a newline. Called \
        wrongly, it prints usage on stderr and exits with status 2."
)]
pub struct LibvirtHelper {
    /// The libvirt connection URI, e.g. qemu:///system.
    pub uri: String,
    /// The operation and its arguments (the shim's vmm_helper protocol).
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub operation: Vec<String>,
}

/// `containerd-shim-vmlet-v2`'s command line, as containerd calls it (parsed by the
/// containerd-shim crate, described here).
pub fn shim_command() -> clap::Command {
    use clap::{Arg, ArgAction, Command};
    let flag = |name: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .value_name("VALUE")
            .help(help)
            .action(ArgAction::Set)
    };
    Command::new("containerd-shim-vmlet-v2")
        .version(VERSION)
        .about("The vmlet containerd shim v2: runs each pod in its own libvirt/QEMU VM")
        .long_about(
            "The vmlet containerd shim v2 (runtime io.containerd.vmlet.v2): runs each pod in \
             its own libvirt/QEMU VM and talks to vmlet-agent inside it over vsock.\n\n\
             containerd starts it; it is not run by hand. containerd passes its flags with \
             one dash (-namespace NS -id ID ... start). It reads the node config from \
             $VMLET_CONFIG or /etc/vmlet/config.toml.",
        )
        .arg(flag("namespace", "containerd namespace of the task"))
        .arg(flag("id", "id of the task (the pod's sandbox for CRI)"))
        .arg(flag("address", "containerd's GRPC address"))
        .arg(flag(
            "publish-binary",
            "binary that publishes events to containerd",
        ))
        .arg(flag("bundle", "the OCI bundle directory"))
        .arg(flag("socket", "the shim's ttrpc socket"))
        .arg(
            Arg::new("debug")
                .long("debug")
                .action(ArgAction::SetTrue)
                .help("log at debug level"),
        )
        .arg(
            Arg::new("info")
                .long("info")
                .action(ArgAction::SetTrue)
                .help("print the runtime's info (features) for containerd and exit"),
        )
        .arg(Arg::new("action").value_parser(["start", "delete"]).help(
            "start: start the shim's server and print its address; delete: clean up after a shim",
        ))
}

/// `vmlet-vmwrapper`'s command line, as libvirt calls it (QEMU's, passed on).
pub fn wrapper_command() -> clap::Command {
    use clap::{Arg, ArgAction, Command};
    Command::new("vmlet-vmwrapper")
        .version(VERSION)
        .about("The emulator of vmlet's libvirt domains: adds the pod's taps, then runs QEMU")
        .long_about(
            "The emulator of vmlet's libvirt domains. libvirt runs it with QEMU's command line. \
             For a pod's domain (whose <qemu:env> names VMLET_QEMU and the shim's tap socket) it \
             fetches the pod's tap fds from the shim and appends their -netdev/-device \
             arguments; then it executes QEMU ($VMLET_QEMU, else /usr/bin/qemu-system-x86_64) \
             with every argument. Only a lone --help or --version is its own.",
        )
        .arg(
            Arg::new("qemu-args")
                .value_name("QEMU_ARGS")
                .num_args(0..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .action(ArgAction::Append)
                .help("QEMU's arguments"),
        )
}

/// The clap commands of this crate's programs, for man pages and completions.
pub fn commands() -> Vec<clap::Command> {
    vec![
        shim_command(),
        Vmletctl::command(),
        LibvirtHelper::command(),
        wrapper_command(),
    ]
}

/// For a program whose arguments are someone else's: when `args` (without the program's
/// name) is one help or version argument, prints `command`'s help or version and returns
/// true. Both the GNU and Go spellings are taken (`--help`, `-help`, `-h`; `--version`,
/// `-version`, `-v`).
pub fn answer_help_or_version(mut command: clap::Command, args: &[std::ffi::OsString]) -> bool {
    let [arg] = args else {
        return false;
    };
    match arg.to_str() {
        Some("--help" | "-help" | "-h") => {
            let _ = command.print_long_help();
            true
        }
        Some("--version" | "-version" | "-v") => {
            print!("{}", command.render_version());
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_well_formed() {
        for command in commands() {
            command.debug_assert();
        }
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

    #[test]
    fn the_libvirt_helper_takes_its_operation_whole() {
        let h =
            LibvirtHelper::try_parse_from(["vmlet-libvirt", "qemu:///system", "remove", "vmlet-a"])
                .unwrap();
        assert_eq!(h.uri, "qemu:///system");
        assert_eq!(h.operation, ["remove", "vmlet-a"]);
        assert!(LibvirtHelper::try_parse_from(["vmlet-libvirt", "qemu:///system"]).is_err());
    }

    #[test]
    fn only_a_lone_help_or_version_argument_is_answered() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(!answer_help_or_version(
            wrapper_command(),
            &args(&["-S", "-help"])
        ));
        assert!(!answer_help_or_version(
            shim_command(),
            &args(&["-namespace", "k8s.io"])
        ));
        assert!(!answer_help_or_version(shim_command(), &args(&[])));
    }
}
