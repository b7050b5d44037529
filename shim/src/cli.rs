//! The command lines of the shim crate's programs, as clap commands: what each one's
//! `--help` and `--version` print, what the man pages and completions
//! (`cargo run -p vmlet-integration --bin cli-docs`) are made from.
//!
//! The shim and the domain's emulator wrapper are called by containerd and libvirt with
//! arguments that are not theirs to define (Go-style `-flags`; QEMU's command line): their
//! commands describe those arguments, and only a lone help or version argument is answered
//! by [`answer_help_or_version`]. (`vmletctl`'s and `vmlet-libvirt`'s are in their crates.)

/// The version of every vmlet program (the crates are versioned together).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

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
    vec![shim_command(), wrapper_command()]
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
