//! `vmletctl`: vmlet's debug and cleanup tool, reading the node config like the shim
//! (`--config`, `VMLET_CONFIG` or `/etc/vmlet/config.toml`). Its command line is
//! [`vmletctl::cli::Vmletctl`]; what it does is [`vmletctl::ctl`].

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use vmlet_config::NodeConfig;
use vmlet_libvirt::Libvirt;
use vmlet_shim::guest::console::ConsoleFollower;
use vmlet_shim::host::pod_paths::PodPaths;
use vmletctl::cli::{ConsoleArgs, CtlCommand, InstallArgs, NodeArgs, OutputFormat, Vmletctl};
use vmletctl::containerd_config::{self, ConfigLayout};
use vmletctl::containerd_imports::Release;
use vmletctl::host_check::{self, HostFacts, Verdict};
use vmletctl::node_install::{self, NodeContainerd, Steps};
use vmletctl::node_label::{self, InCluster, NodeApi};
use vmletctl::{ctl, pod_listing};

/// How long the installed vmletctl may take to tell the accelerator (a KVM probe guest
/// boots within 10 s; libvirt and the programs' versions are asked with deadlines too).
const ACCEL_DEADLINE: Duration = Duration::from_secs(90);

/// How often `console --follow` looks for more.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

fn main() -> ExitCode {
    let cli = Vmletctl::parse();
    // libvirt would print each error to stderr itself as well; vmletctl says what failed.
    virt::error::clear_error_callback();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vmletctl: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Vmletctl) -> Result<(), String> {
    // The node config, for the commands that look at the node's pods.
    let node = || {
        match &cli.config {
            Some(path) => NodeConfig::load_from(path),
            None => NodeConfig::load(),
        }
        .map_err(|e| format!("node config: {}", vmlet_shim::Error::Config(e).message()))
    };
    let netns_dir = Path::new(ctl::NAMED_NETNS_DIR);
    match &cli.command {
        CtlCommand::Completion { shell } => {
            clap_complete::generate(
                *shell,
                &mut Vmletctl::command(),
                "vmletctl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        CtlCommand::Install(args) => install(args),
        CtlCommand::Uninstall(args) => {
            if !args.force {
                refuse_with_pods(&args.root, &node)?;
            }
            // The labels first: no pod is scheduled here for vmlet from now on.
            label(&args.node, node_label::LABEL, None)?;
            label(&args.node, node_label::ACCEL_LABEL, None)?;
            let steps = node_install::uninstall(&args.root).map_err(|e| e.message())?;
            report(&steps, args.restart_containerd)
        }
        CtlCommand::Ps { output } => {
            let config = node()?;
            let vmm = Libvirt::new(&config.libvirt_uri);
            let pods = ctl::survey(&config.state_dir, netns_dir, &vmm).map_err(|e| e.message())?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            match output {
                OutputFormat::Json => {
                    let all: Vec<_> = pods.iter().map(|p| p.to_json(now)).collect();
                    println!("{}", serde_json::Value::Array(all));
                }
                OutputFormat::Table => print!("{}", pod_listing::table(&pods, now)),
            }
            Ok(())
        }
        CtlCommand::Console(args) => console(&node()?, args),
        CtlCommand::Gc { dry_run } => {
            let config = node()?;
            let vmm = Libvirt::new(&config.libvirt_uri);
            let removed = ctl::gc(&config, netns_dir, &vmm, *dry_run).map_err(|e| e.message())?;
            for what in &removed {
                println!(
                    "{}{what}",
                    if *dry_run {
                        "would remove "
                    } else {
                        "removed "
                    }
                );
            }
            Ok(())
        }
        CtlCommand::Check(args) => {
            let config = node()?;
            let facts = HostFacts::gather(
                &config,
                &Libvirt::new(&config.libvirt_uri),
                args.containerd.as_deref(),
                &args.containerd_config,
            );
            if args.accel {
                return match host_check::accelerator(&config, &facts) {
                    Some(word) => {
                        println!("{word}");
                        Ok(())
                    }
                    None => Err(
                        "no accelerator: accel = \"kvm\" in the node config, but KVM \
                                 runs no guest here (vmletctl check says why)"
                            .into(),
                    ),
                };
            }
            let findings = host_check::assess(&config, &facts);
            for finding in &findings {
                println!("{finding}");
            }
            match findings
                .iter()
                .filter(|f| f.verdict == Verdict::Fail)
                .count()
            {
                0 => Ok(()),
                n => Err(format!(
                    "{n} check(s) failed: a pod cannot start on this node"
                )),
            }
        }
        CtlCommand::Metrics { listen, state_dir } => {
            let state_dir = match state_dir {
                Some(dir) => dir.clone(),
                None => node()?.state_dir,
            };
            match listen {
                None => {
                    print!("{}", ctl::metrics(&state_dir));
                    Ok(())
                }
                Some(address) => {
                    vmletctl::metrics_server::listen(*address, move || ctl::metrics(&state_dir))
                }
            }
        }
    }
}

fn install(args: &InstallArgs) -> Result<(), String> {
    let release = match &args.release {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.to_owned()))
            .ok_or("cannot tell which release this vmletctl is in: give --release DIR")?,
    };
    // The node's containerd, asked in order until one answers (each said, for the message).
    let mut said = Vec::new();
    let mut version = None;
    for program in ["/usr/local/bin/containerd", "/usr/bin/containerd"] {
        match vmletctl::node_program::version_line_under(&args.root, Path::new(program)) {
            Ok(line) => {
                said.push(format!("{program}: {line:?}"));
                version = Some(line);
                break;
            }
            Err(e) => said.push(format!("{program}: {e}")),
        }
    }
    let release_line = Release::of_version_line(version.as_deref().unwrap_or_default());
    if release_line == Release::Unknown {
        println!(
            "containerd's version is unknown under {} ({}): vmlet takes it for 1.6 or 1.7 where a `version = 2` config's CRI settings are concerned, and writes a new config in version {} (--config-version says otherwise)",
            args.root.display(),
            said.join("; "),
            if args.config_version.as_deref() == Some("2") { 2 } else { 3 },
        );
    }
    let default_layout = match (args.config_version.as_deref(), release_line) {
        (Some("2"), _) | (None, Release::One) => ConfigLayout::V2,
        _ => ConfigLayout::V3,
    };
    let containerd = NodeContainerd {
        release: release_line,
        default_layout,
    };
    let steps = node_install::install(&release, &args.root, containerd).map_err(|e| e.message())?;
    report(&steps, args.restart_containerd)?;
    if args.node.node.is_some() {
        // What the installed vmletctl finds on the node, run there (chrooted into the root).
        let asked = vmletctl::node_program::run_under(
            &args.root,
            Path::new("/usr/local/bin/vmletctl"),
            &["check".as_ref(), "--accel".as_ref()],
            ACCEL_DEADLINE,
        );
        match asked.as_deref().map(str::trim) {
            Ok(word @ ("kvm" | "tcg")) => label(&args.node, node_label::ACCEL_LABEL, Some(word))?,
            Ok(other) => println!(
                "vmletctl check --accel said {other:?}: node left without {}",
                node_label::ACCEL_LABEL
            ),
            Err(e) => println!(
                "vmletctl check --accel: {e}: node left without {}",
                node_label::ACCEL_LABEL
            ),
        }
    }
    // The runtime's label last: pods come once containerd can start them.
    label(&args.node, node_label::LABEL, Some(node_label::LABEL_VALUE))?;
    if args.wait {
        wait_for_termination()?;
    }
    Ok(())
}

/// An error naming the vmlet pods that run under `root` (its node config's state
/// directory; `node` reads the config where the root is `/`), when any does.
fn refuse_with_pods(
    root: &Path,
    node: &dyn Fn() -> Result<NodeConfig, String>,
) -> Result<(), String> {
    let unread = |e: String| format!("{e} (to find the pods that run; --force skips that)");
    let config = if root == Path::new("/") {
        node().map_err(unread)?
    } else {
        let installed = root.join(node_install::NODE_CONFIG);
        match installed.is_file() {
            true => NodeConfig::load_from(&installed).map_err(|e| {
                unread(format!(
                    "node config: {}",
                    vmlet_shim::Error::Config(e).message()
                ))
            })?,
            false => NodeConfig::default(),
        }
    };
    let state_dir = root.join(
        config
            .state_dir
            .strip_prefix("/")
            .unwrap_or(&config.state_dir),
    );
    let running = pod_listing::running(&state_dir);
    if running.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} vmlet pod(s) run on this node: {}. Delete them first, or pass --force (they run \
         on, but without vmlet's programs their removal leaves their VMs behind)",
        running.len(),
        running.join(", ")
    ))
}

/// Prints what install or uninstall did, and restarts containerd when asked and its config
/// changed.
fn report(steps: &Steps, restart: bool) -> Result<(), String> {
    for step in steps.iter() {
        println!("{step}");
    }
    match (restart, steps.containerd_config_changed) {
        (true, true) => {
            containerd_config::restart_containerd().map_err(|e| e.message())?;
            println!("restarted containerd");
        }
        (true, false) => println!("containerd's config is as it was: containerd not restarted"),
        (false, _) => {}
    }
    Ok(())
}

/// Sets (`Some`) or removes the node's label `key`, when a node is named.
fn label(args: &NodeArgs, key: &str, value: Option<&str>) -> Result<(), String> {
    let Some(node) = &args.node else {
        return Ok(());
    };
    let api = InCluster::new(|k| std::env::var(k).ok(), &args.service_account)
        .map_err(|e| e.message())?;
    api.label(node, key, value).map_err(|e| e.message())?;
    match value {
        Some(v) => println!("labelled node {node} {key}={v}"),
        None => println!("removed the label {key} of node {node}"),
    }
    Ok(())
}

/// Blocks until SIGTERM or SIGINT.
fn wait_for_termination() -> Result<(), String> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| format!("block SIGTERM: {e}"))?;
    println!("installed; waiting for SIGTERM");
    let _ = std::io::stdout().flush();
    let signal = signals
        .wait()
        .map_err(|e| format!("wait for SIGTERM: {e}"))?;
    println!("{signal}: leaving vmlet installed (`vmletctl uninstall` takes it off)");
    Ok(())
}

/// Prints the pod's console so far; with `--follow`, then what the guest writes until the
/// pod's state directory is gone; with `--interactive`, a session at it.
fn console(config: &NodeConfig, args: &ConsoleArgs) -> Result<(), String> {
    let pod = pod_listing::resolve(&config.state_dir, &args.pod).map_err(|e| e.message())?;
    let paths = PodPaths::new(&config.state_dir, &pod);
    if args.interactive {
        return vmletctl::operator_console::run(&paths, &pod);
    }
    let mut follower = ConsoleFollower::new(&paths.console);
    let mut out = std::io::stdout().lock();
    let Some(text) = follower.read_new() else {
        return Err(format!(
            "pod {}: no console log at {} (is it a vmlet pod on this node?)",
            args.pod,
            paths.console.display()
        ));
    };
    // Without --follow: what the log held when we looked (the guest may keep writing).
    let end = std::fs::metadata(&paths.console).map_or(0, |m| m.len());
    let mut text = text;
    loop {
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            // The reader went away (a closed pipe): nothing more to print.
            return Ok(());
        }
        if !args.follow && (text.is_empty() || follower.offset() >= end) {
            return Ok(());
        }
        if text.is_empty() {
            if !paths.dir.exists() {
                return Ok(());
            }
            std::thread::sleep(FOLLOW_POLL);
        }
        text = follower.read_new().unwrap_or_default();
    }
}
