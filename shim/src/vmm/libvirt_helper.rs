//! The shim's VM manager: each libvirt call runs in `vmlet-libvirt`, a short-lived helper
//! that links libvirt, so that the shim (one per pod, alive as long as the pod) maps none
//! of libvirt's ~55 shared libraries. A pod makes three calls (start, the live XML,
//! remove); each costs a process start. The helper's answers are bounded and every call
//! has a deadline.
//!
//! The helper's interface: `vmlet-libvirt URI OPERATION [ARGS]`, for `start` the request on
//! stdin ([`StartDomain`] as JSON: the domain XML and the files of the pod's AppArmor
//! profile); on stdout `ok` and the answer, or `error` and the message, each after a
//! newline. The shim names the interface's version it speaks in the environment
//! ([`PROTOCOL_ENV`]); the helper answers the versions from [`OLDEST_PROTOCOL`] to
//! [`PROTOCOL`] and refuses another by name ([`check_protocol`]). After an upgrade a running
//! pod's shim calls the new helper, so a new helper keeps answering the versions the
//! releases before it spoke; a shim that names none is of those before the version was
//! named, which spoke version 1.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::vmm::{StartDomain, VmManager, VmletDomain};
use crate::Error;

/// The most a helper may print on stdout (a domain's XML, or the list of domains).
const ANSWER_LIMIT: usize = 8 << 20;
/// The most of its stderr an error carries.
const ERROR_LIMIT: usize = 16 << 10;
/// How long one call may take (libvirt's define and start of a domain takes ~0.3 s).
const CALL_DEADLINE: Duration = Duration::from_secs(120);

/// The version of the helper's interface this shim speaks and this helper answers.
pub const PROTOCOL: u32 = 1;
/// The oldest version this helper answers.
pub const OLDEST_PROTOCOL: u32 = 1;
/// The environment variable a shim names its version in.
pub const PROTOCOL_ENV: &str = "VMLET_HELPER_PROTOCOL";

/// The helper's side: whether it answers the version the shim named (`sent`, none from a
/// shim before the version was named); an error that says which side to upgrade otherwise.
pub fn check_protocol(sent: Option<&str>) -> Result<(), Error> {
    let version = match sent {
        None => 1,
        Some(text) => text.trim().parse::<u32>().map_err(|_| {
            Error::InvalidArgument(format!("{PROTOCOL_ENV}={text:?}: expected a number"))
        })?,
    };
    if version > PROTOCOL {
        return Err(Error::FailedPrecondition(format!(
            "the vmlet shim speaks the helper's interface version {version}, this vmlet-libvirt \
             {OLDEST_PROTOCOL} to {PROTOCOL}: the node's vmlet-libvirt is older than the shim \
             (install the shim's release)"
        )));
    }
    if version < OLDEST_PROTOCOL {
        return Err(Error::FailedPrecondition(format!(
            "the vmlet shim speaks the helper's interface version {version}, this vmlet-libvirt \
             {OLDEST_PROTOCOL} to {PROTOCOL}: the pod's shim is from a release this one no \
             longer answers (restart the pod)"
        )));
    }
    Ok(())
}

/// libvirt through `vmlet-libvirt`.
pub struct LibvirtHelper {
    binary: PathBuf,
    uri: String,
    deadline: Duration,
}

impl LibvirtHelper {
    pub fn new(binary: impl Into<PathBuf>, uri: &str) -> Self {
        Self {
            binary: binary.into(),
            uri: uri.into(),
            deadline: CALL_DEADLINE,
        }
    }

    /// Runs the helper for one operation and returns its answer. The answer is what it
    /// printed, not its exit status: the shim's reaper may collect the helper's exit first.
    fn call(&self, args: &[&str], input: &[u8]) -> Result<String, Error> {
        let what = format!("{} {}", self.binary.display(), args.join(" "));
        let mut child = Command::new(&self.binary)
            .arg(&self.uri)
            .args(args)
            .env(PROTOCOL_ENV, PROTOCOL.to_string())
            .stdin(if input.is_empty() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("run {}", self.binary.display()), e))?;
        if let Some(mut stdin) = child.stdin.take() {
            let input = input.to_vec();
            // A thread each: the helper may fill one pipe while we write another.
            std::thread::spawn(move || stdin.write_all(&input));
        }
        let (tx, rx) = mpsc::channel();
        read_bounded(
            child.stdout.take().expect("piped"),
            ANSWER_LIMIT,
            0,
            tx.clone(),
        );
        read_bounded(child.stderr.take().expect("piped"), ERROR_LIMIT, 1, tx);
        let deadline = Instant::now() + self.deadline;
        let mut streams: [Option<Bounded>; 2] = [None, None];
        while streams.iter().any(Option::is_none) {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((i, read)) => streams[i] = Some(read),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Error::Libvirt(format!(
                        "{what}: no answer within {} s (killed)",
                        self.deadline.as_secs_f32()
                    )));
                }
            }
        }
        // Both streams ended: the helper is exiting. Collect it unless the reaper did.
        let _ = child.wait();
        let [answer, complaint] = streams.map(Option::unwrap_or_default);
        parse_answer(&what, answer, &complaint)
    }
}

/// The helper's stdout: `ok` or `error` on the first line, then the answer or the error.
fn parse_answer(what: &str, answer: Bounded, complaint: &Bounded) -> Result<String, Error> {
    if answer.truncated {
        return Err(Error::Libvirt(format!(
            "{what}: answered more than {ANSWER_LIMIT} bytes"
        )));
    }
    let text = String::from_utf8(answer.bytes)
        .map_err(|_| Error::Libvirt(format!("{what}: answered bytes that are not UTF-8")))?;
    match text.split_once('\n') {
        Some(("ok", answer)) => Ok(answer.to_owned()),
        Some(("error", message)) => Err(Error::Libvirt(message.trim().to_owned())),
        _ => Err(Error::Libvirt(format!(
            "{what}: ended without an answer{}",
            match String::from_utf8_lossy(&complaint.bytes).trim() {
                "" => String::new(),
                said => format!(": {said}"),
            }
        ))),
    }
}

/// What a pipe gave, at most a limit; `truncated` when there was more.
#[derive(Default)]
struct Bounded {
    bytes: Vec<u8>,
    truncated: bool,
}

/// Reads `pipe` to its end on a thread, keeping at most `limit` bytes (the rest is read and
/// dropped, so that the writer never blocks on it), and sends it as stream `index`.
fn read_bounded(
    mut pipe: impl Read + Send + 'static,
    limit: usize,
    index: usize,
    done: mpsc::Sender<(usize, Bounded)>,
) {
    std::thread::spawn(move || {
        let mut kept = Bounded::default();
        let mut buf = [0u8; 16 << 10];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = limit - kept.bytes.len();
            kept.bytes.extend_from_slice(&buf[..n.min(room)]);
            kept.truncated |= n > room;
        }
        let _ = done.send((index, kept));
    });
}

fn yes_no(answer: &str, what: &str) -> Result<bool, Error> {
    match answer.trim() {
        "yes" => Ok(true),
        "no" => Ok(false),
        other => Err(Error::Libvirt(format!(
            "{what}: the helper answered {other:?}, not yes or no"
        ))),
    }
}

impl VmManager for LibvirtHelper {
    fn kvm_usable(&self, emulator: &str, machine: &str) -> bool {
        self.call(&["kvm-usable", emulator, machine], b"")
            .and_then(|a| yes_no(&a, "kvm-usable"))
            .unwrap_or(false)
    }

    fn start(&self, domain: &StartDomain) -> Result<(), Error> {
        let request = serde_json::to_vec(domain)
            .map_err(|e| Error::Internal(format!("encode the start request: {e}")))?;
        self.call(&["start"], &request)
            .map(drop)
            .map_err(|e| match e {
                // What libvirt says of JSON where it expects XML: a helper older than the shim.
                Error::Libvirt(text) if text.contains("Start tag expected") => Error::Libvirt(
                    format!("{text} (is vmlet-libvirt older than the shim? Install them together)"),
                ),
                other => other,
            })
    }

    fn remove(&self, name: &str) -> Result<(), Error> {
        self.call(&["remove", name], b"").map(drop)
    }

    fn live_xml(&self, name: &str) -> Result<String, Error> {
        self.call(&["live-xml", name], b"")
    }

    fn is_active(&self, name: &str) -> Result<bool, Error> {
        yes_no(&self.call(&["is-active", name], b"")?, "is-active")
    }

    fn qemu_pid_file(&self, name: &str) -> Result<PathBuf, Error> {
        super::libvirt_daemon::qemu_pid_file(&self.uri, name)
    }

    fn vmlet_domains(&self) -> Result<Vec<VmletDomain>, Error> {
        let answer = self.call(&["vmlet-domains"], b"")?;
        serde_json::from_str(&answer)
            .map_err(|e| Error::Libvirt(format!("vmlet-domains: the helper's answer: {e}")))
    }
}

/// The helper's side: runs one operation against `vmm` and returns what to print.
pub fn serve(vmm: &dyn VmManager, args: &[String], input: &str) -> Result<String, Error> {
    let say = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["kvm-usable", emulator, machine] => Ok(say(vmm.kvm_usable(emulator, machine))),
        ["start"] => vmm.start(&start_request(input)?).map(|()| String::new()),
        ["remove", name] => vmm.remove(name).map(|()| String::new()),
        ["live-xml", name] => vmm.live_xml(name),
        ["is-active", name] => vmm.is_active(name).map(say),
        ["vmlet-domains"] => serde_json::to_string(&vmm.vmlet_domains()?)
            .map_err(|e| Error::Internal(format!("encode the domains: {e}"))),
        _ => Err(Error::InvalidArgument(format!(
            "unknown operation {:?} (kvm-usable EMULATOR MACHINE, start, remove NAME, \
             live-xml NAME, is-active NAME, vmlet-domains)",
            args.join(" ")
        ))),
    }
}

/// The request `start` takes on stdin. Bare domain XML is what shims before the request
/// carried the profile's files sent: refused by name, so that a shim older than the helper
/// (an upgrade half done) fails its pod's start with an error that says why.
fn start_request(input: &str) -> Result<StartDomain, Error> {
    if input.trim_start().starts_with('<') {
        return Err(Error::FailedPrecondition(
            "start: the request is bare domain XML, from a vmlet shim older than this \
             vmlet-libvirt; restart the pod once the node's vmlet is upgraded"
                .into(),
        ));
    }
    serde_json::from_str(input)
        .map_err(|e| Error::InvalidArgument(format!("start: the request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::FakeVmm;

    /// A helper that is a shell script running `body`, in a directory of its own.
    fn script(body: &str) -> (LibvirtHelper, PathBuf) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("vmlet-vmm-helper-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("helper");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (LibvirtHelper::new(&path, "test:///uri"), dir)
    }

    #[test]
    fn the_helper_answers_the_versions_it_knows_and_names_the_side_to_upgrade() {
        check_protocol(None).unwrap();
        check_protocol(Some(&PROTOCOL.to_string())).unwrap();
        check_protocol(Some(&OLDEST_PROTOCOL.to_string())).unwrap();
        let newer = check_protocol(Some(&(PROTOCOL + 1).to_string())).unwrap_err();
        assert!(
            newer.message().contains("older than the shim"),
            "{}",
            newer.message()
        );
        assert_eq!(newer.code(), ttrpc::Code::FAILED_PRECONDITION);
        let bad = check_protocol(Some("one")).unwrap_err();
        assert!(
            bad.message().contains("expected a number"),
            "{}",
            bad.message()
        );
    }

    #[test]
    fn the_fakes_answers_cross_the_helper_interface() {
        let fake = FakeVmm::default();
        let arg = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let request = serde_json::to_string(&StartDomain::named("vmlet-p1", "p1")).unwrap();
        serve(&fake, &arg(&["start"]), &request).unwrap();
        // A shim older than the helper sends bare XML: refused, saying why.
        let err = serve(
            &fake,
            &arg(&["start"]),
            "<domain><name>vmlet-p0</name></domain>",
        )
        .unwrap_err();
        assert!(
            err.message()
                .contains("from a vmlet shim older than this vmlet-libvirt"),
            "{err}"
        );
        let err = serve(&fake, &arg(&["start"]), "{}").unwrap_err();
        assert!(
            err.message().contains("start: the request: missing field"),
            "{err}"
        );
        // The profile's files: only with an access vmlet grants a pod's QEMU.
        let mut request = serde_json::to_value(StartDomain::named("vmlet-p3", "p3")).unwrap();
        request["apparmor_files"] = serde_json::json!([{"path": "/w", "access": "rmix"}]);
        serve(&fake, &arg(&["start"]), &request.to_string()).unwrap();
        for odd in [
            serde_json::json!({"path": "/x", "access": "ux"}),
            serde_json::json!({"path": "/x"}),
            serde_json::json!({"access": "rw"}),
        ] {
            request["apparmor_files"] = serde_json::json!([odd]);
            let err = serve(&fake, &arg(&["start"]), &request.to_string()).unwrap_err();
            assert!(err.message().starts_with("start: the request: "), "{err}");
        }
        assert_eq!(
            serve(&fake, &arg(&["is-active", "vmlet-p1"]), "").unwrap(),
            "yes"
        );
        let listed = serve(&fake, &arg(&["vmlet-domains"]), "").unwrap();
        let domains: Vec<VmletDomain> = serde_json::from_str(&listed).unwrap();
        assert_eq!(domains[0].pod_id, "p1");
        serve(&fake, &arg(&["remove", "vmlet-p1"]), "").unwrap();
        assert_eq!(
            serve(&fake, &arg(&["is-active", "vmlet-p1"]), "").unwrap(),
            "no"
        );
        let err = serve(&fake, &arg(&["reboot", "x"]), "").unwrap_err();
        assert!(
            err.to_string().contains("unknown operation \"reboot x\""),
            "{err}"
        );
    }

    #[test]
    fn the_helper_gets_uri_operation_and_input_and_its_answer_comes_back() {
        let (helper, dir) = script(
            r#"[ "$1 $2 $3 $VMLET_HELPER_PROTOCOL" = "test:///uri is-active vmlet-p1 1" ] && printf 'ok\nyes'"#,
        );
        assert!(helper.is_active("vmlet-p1").unwrap());
        let (helper, dir2) =
            script(r#"[ "$2" = start ] && grep -q '<name>vmlet-p2</name>' && echo ok"#);
        helper.start(&StartDomain::named("vmlet-p2", "p2")).unwrap();
        // Its exit status does not matter (the shim's reaper may have taken it).
        let (helper, dir3) = script("printf 'ok\n<domain/>'; exit 3");
        assert_eq!(helper.live_xml("vmlet-p").unwrap(), "<domain/>");
        for d in [dir, dir2, dir3] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_failing_slow_crashing_or_chatty_helper_is_an_error_that_says_so() {
        let (helper, dir) = script("printf 'error\ndefine domain: XML error: no name\n'");
        let err = helper.start(&StartDomain::named("", "p")).unwrap_err();
        assert_eq!(err.message(), "libvirt: define domain: XML error: no name");
        let (old, dir6) =
            script("printf 'error\ndefine domain: (domain_definition):1: Start tag expected, <'");
        let err = old.start(&StartDomain::named("vmlet-p", "p")).unwrap_err();
        assert!(
            err.message()
                .ends_with("(is vmlet-libvirt older than the shim? Install them together)"),
            "{err}"
        );
        std::fs::remove_dir_all(dir6).unwrap();
        let (mut helper, dir2) = script("sleep 30");
        helper.deadline = Duration::from_millis(200);
        let started = Instant::now();
        let err = helper.live_xml("vmlet-p").unwrap_err();
        assert!(err.to_string().contains("no answer within"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let (helper, dir3) = script("echo ok; head -c 9000000 /dev/zero");
        let err = helper.live_xml("vmlet-p").unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        let (helper, dir4) = script("printf 'ok\nmaybe'");
        let err = helper.is_active("vmlet-p").unwrap_err();
        assert!(err.to_string().contains("\"maybe\""), "{err}");
        let (helper, dir5) = script("echo 'cannot load libvirt.so.0' >&2; exit 127");
        let err = helper.remove("vmlet-p").unwrap_err();
        assert!(
            err.to_string()
                .contains("ended without an answer: cannot load libvirt.so.0"),
            "{err}"
        );
        for d in [dir, dir2, dir3, dir4, dir5] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
