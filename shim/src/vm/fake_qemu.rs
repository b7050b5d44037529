//! A VM manager for the boot's tests whose `start` runs a fake QEMU (and, for a pod with a
//! network, does what `vmlet-vmwrapper` does first).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::host::taps::TapDescription;
use crate::vmm::{StartDomain, VmManager, VmletDomain};
use crate::Error;

/// A VM manager whose `start` runs a "QEMU": a thread that connects vmlet's QMP monitor at
/// `qmp_socket`, greets and answers the capabilities' negotiation, then holds the
/// connection until `quit` is dropped. `fail` makes the start fail instead. As libvirt
/// does, it writes its "QEMU"'s PID (the test's process) before that QEMU runs, beside the
/// monitor's socket.
pub(super) struct FakeQemu {
    qmp_socket: PathBuf,
    fail: bool,
    pub started: Mutex<Vec<String>>,
    /// The taps the "wrapper" fetched from the domain's tap socket, as QEMU starts.
    pub fetched: Mutex<Option<Result<Vec<TapDescription>, String>>>,
    quit: Mutex<Option<mpsc::Receiver<()>>>,
}

impl FakeQemu {
    /// The fake, the same as the VM manager the boot is given, and the sender whose drop
    /// ends its "QEMU".
    pub(super) fn manager(
        qmp_socket: PathBuf,
        fail: bool,
    ) -> (Arc<Self>, Arc<dyn VmManager>, mpsc::Sender<()>) {
        let (tx, rx) = mpsc::channel();
        let qemu = Arc::new(Self {
            qmp_socket,
            fail,
            started: Mutex::new(Vec::new()),
            fetched: Mutex::new(None),
            quit: Mutex::new(Some(rx)),
        });
        (qemu.clone(), qemu, tx)
    }

    fn pid_file(&self) -> PathBuf {
        self.qmp_socket.with_file_name("fake-libvirt-qemu.pid")
    }

    /// What the wrapper does as QEMU starts: fetches the taps from `socket` (within 5 s: a
    /// tap server not yet serving would hold it forever).
    fn fetch_taps(socket: PathBuf) -> Result<Vec<TapDescription>, String> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(crate::host::taps::fetch(&socket)));
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok((taps, fds))) => {
                for fd in fds {
                    // SAFETY: received just now, owned by nobody else.
                    drop(unsafe { OwnedFd::from_raw_fd(fd) });
                }
                Ok(taps)
            }
            Ok(Err(e)) => Err(e.message()),
            Err(_) => Err("no taps within 5 s".to_owned()),
        }
    }
}

impl VmManager for FakeQemu {
    fn kvm_usable(&self, _: &str, _: &str) -> bool {
        false
    }

    fn start(&self, domain: &StartDomain) -> Result<(), Error> {
        if self.fail {
            return Err(Error::Internal("libvirt refused the domain".into()));
        }
        self.started.lock().unwrap().push(domain.xml.clone());
        std::fs::write(self.pid_file(), format!("{}\n", std::process::id()))
            .map_err(|e| Error::io("write the fake QEMU's PID", e))?;
        // The wrapper, before QEMU runs: the taps from the socket the domain names.
        let tap_socket = domain
            .xml
            .split("name=\"VMLET_TAP_SOCKET\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        if let Some(socket) = tap_socket {
            *self.fetched.lock().unwrap() = Some(Self::fetch_taps(PathBuf::from(socket)));
        }
        let socket = self.qmp_socket.clone();
        let quit = self.quit.lock().unwrap().take().expect("started once");
        std::thread::spawn(move || {
            let mut stream = UnixStream::connect(socket).unwrap();
            stream
                .write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut line = String::new();
            BufReader::new(stream.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            let command: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(command["execute"], "qmp_capabilities");
            let reply = serde_json::json!({"return": {}, "id": command["id"]});
            stream.write_all(format!("{reply}\n").as_bytes()).unwrap();
            // QEMU runs until it is told to end; its end of the monitor then closes.
            let _ = quit.recv();
        });
        Ok(())
    }

    fn remove(&self, _: &str) -> Result<(), Error> {
        Ok(())
    }

    fn live_xml(&self, name: &str) -> Result<String, Error> {
        Err(Error::NotFound(format!("domain {name}")))
    }

    fn is_active(&self, _: &str) -> Result<bool, Error> {
        Ok(false)
    }

    fn vmlet_domains(&self) -> Result<Vec<VmletDomain>, Error> {
        Ok(Vec::new())
    }

    fn qemu_pid_file(&self, _: &str) -> Result<PathBuf, Error> {
        Ok(self.pid_file())
    }
}
