//! The shim's VM manager: each libvirt call runs in `vmlet-libvirt`, a short-lived helper
//! that links libvirt, so that the shim (one per pod, alive as long as the pod) maps none
//! of libvirt's ~55 shared libraries. A pod makes three calls (start, the live XML,
//! remove); each costs a process start. The helper's answers are bounded and every call
//! has a deadline.
//!
//! The helper's interface: `vmlet-libvirt URI OPERATION [ARGS]`, the domain XML on stdin
//! for `start`; the answer on stdout; exit 1 with the error on stderr.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::vmm::{VmManager, VmletDomain};
use crate::Error;

/// The most a helper may print on stdout (a domain's XML, or the list of domains).
const ANSWER_LIMIT: usize = 8 << 20;
/// The most of its stderr an error carries.
const ERROR_LIMIT: usize = 16 << 10;
/// How long one call may take (libvirt's define and start of a domain takes ~0.3 s).
const CALL_DEADLINE: Duration = Duration::from_secs(120);

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

    /// Runs the helper for one operation and returns what it printed.
    fn call(&self, args: &[&str], input: &[u8]) -> Result<String, Error> {
        let what = format!("{} {}", self.binary.display(), args.join(" "));
        let mut child = Command::new(&self.binary)
            .arg(&self.uri)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("run {}", self.binary.display()), e))?;
        let mut stdin = child.stdin.take().expect("piped");
        let input = input.to_vec();
        // A thread each: the helper may fill one pipe while we write another.
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let answer = read_bounded(child.stdout.take().expect("piped"), ANSWER_LIMIT);
        let complaint = read_bounded(child.stderr.take().expect("piped"), ERROR_LIMIT);
        let status = wait_until(&mut child, Instant::now() + self.deadline)
            .map_err(|e| Error::Libvirt(format!("{what}: {e}")))?;
        let _ = writer.join();
        let answer = answer.join().unwrap_or_default();
        let complaint = complaint.join().unwrap_or_default();
        if !status.success() {
            let message = String::from_utf8_lossy(&complaint.bytes).trim().to_owned();
            return Err(Error::Libvirt(if message.is_empty() {
                format!("{what}: {status}")
            } else {
                message
            }));
        }
        if answer.truncated {
            return Err(Error::Libvirt(format!(
                "{what}: answered more than {ANSWER_LIMIT} bytes"
            )));
        }
        String::from_utf8(answer.bytes)
            .map_err(|_| Error::Libvirt(format!("{what}: answered bytes that are not UTF-8")))
    }
}

/// What a pipe gave, at most a limit; `truncated` when there was more.
#[derive(Default)]
struct Bounded {
    bytes: Vec<u8>,
    truncated: bool,
}

/// Reads `pipe` to its end on a thread, keeping at most `limit` bytes (the rest is read and
/// dropped, so that the writer never blocks on it).
fn read_bounded(
    mut pipe: impl Read + Send + 'static,
    limit: usize,
) -> std::thread::JoinHandle<Bounded> {
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
        kept
    })
}

/// Waits for `child` until `deadline`; past it, kills the child and says so.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<std::process::ExitStatus, String> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return Err(format!("wait: {e}")),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("no answer before the deadline (killed)".into());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
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

    fn start(&self, xml: &str) -> Result<(), Error> {
        self.call(&["start"], xml.as_bytes()).map(drop)
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

    fn vmlet_domains(&self) -> Result<Vec<VmletDomain>, Error> {
        let answer = self.call(&["vmlet-domains"], b"")?;
        serde_json::from_str(&answer)
            .map_err(|e| Error::Libvirt(format!("vmlet-domains: the helper's answer: {e}")))
    }
}

/// The helper's side: runs one operation against `vmm` and returns what to print.
pub fn serve(vmm: &dyn VmManager, args: &[String], input: &str) -> Result<String, Error> {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["kvm-usable", emulator, machine] => Ok(yes_no(vmm.kvm_usable(emulator, machine))),
        ["start"] => vmm.start(input).map(|()| String::new()),
        ["remove", name] => vmm.remove(name).map(|()| String::new()),
        ["live-xml", name] => vmm.live_xml(name),
        ["is-active", name] => vmm.is_active(name).map(yes_no),
        ["vmlet-domains"] => serde_json::to_string(&vmm.vmlet_domains()?)
            .map_err(|e| Error::Internal(format!("encode the domains: {e}"))),
        _ => Err(Error::InvalidArgument(format!(
            "unknown operation {:?} (kvm-usable EMULATOR MACHINE, start, remove NAME, \
             live-xml NAME, is-active NAME, vmlet-domains)",
            args.join(" ")
        ))),
    }
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
    fn the_fakes_answers_cross_the_helper_interface() {
        let fake = FakeVmm::default();
        let arg = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        serve(&fake, &arg(&["start"]), "<name>vmlet-p1</name>").unwrap();
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
        let (helper, dir) =
            script(r#"[ "$1 $2 $3" = "test:///uri is-active vmlet-p1" ] && echo yes"#);
        assert!(helper.is_active("vmlet-p1").unwrap());
        let (helper, dir2) = script(r#"[ "$2" = start ] && grep -q '<name>vmlet-p2</name>'"#);
        helper
            .start("<domain><name>vmlet-p2</name></domain>")
            .unwrap();
        for d in [dir, dir2] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_failing_slow_or_chatty_helper_is_an_error_that_says_so() {
        let (helper, dir) = script("echo 'define domain: XML error: no name' >&2; exit 1");
        let err = helper.start("<domain/>").unwrap_err();
        assert_eq!(err.message(), "libvirt: define domain: XML error: no name");
        let (mut helper, dir2) = script("sleep 30");
        helper.deadline = Duration::from_millis(200);
        let started = Instant::now();
        let err = helper.live_xml("vmlet-p").unwrap_err();
        assert!(err.to_string().contains("deadline"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let (helper, dir3) = script("head -c 9000000 /dev/zero");
        let err = helper.live_xml("vmlet-p").unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        let (helper, dir4) = script("echo maybe");
        let err = helper.is_active("vmlet-p").unwrap_err();
        assert!(err.to_string().contains("\"maybe\""), "{err}");
        for d in [dir, dir2, dir3, dir4] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
