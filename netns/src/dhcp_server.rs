//! The DHCP responder's socket and thread: a packet socket bound to the VM's tap, made in
//! the pod's network namespace, read by one thread that answers with
//! [`crate::dhcp::Responder`] and stops when the [`DhcpServer`] is dropped.
//!
//! The socket sees the guest's frames on the tap before tc redirects them to the pod
//! interface: it is an `ETH_P_ALL` socket, which the kernel gives a frame before the ingress
//! qdisc (an `ETH_P_IP` socket, which comes after it, never saw a real guest's DISCOVER in
//! a CRI pod), and a reply sent on the tap goes to the guest only. A socket filter keeps the frames the guest
//! sends to UDP port 67 and drops the rest of the pod's traffic in the kernel. Reads are
//! bounded ([`crate::dhcp::MAX_FRAME`]; a longer frame is dropped) and the thread checks for
//! its stop at least every [`POLL_INTERVAL`].

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::dhcp::{Responder, MAX_FRAME};
use crate::Error;

/// How long the thread waits for a frame before it looks at its stop flag.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// A running responder; dropping it stops the thread (within [`POLL_INTERVAL`]) and
/// closes the socket.
pub struct DhcpServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for DhcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::Worker(format!("DHCP responder: {what}: {e}"))
}

/// `ETH_P_ALL`: a packet socket of this protocol sees frames before the ingress qdisc.
const ETH_P_ALL: u16 = 0x0003;

/// The socket filter (classic BPF, as `tcpdump -dd 'inbound and udp dst port 67'` writes
/// it, on the Ethernet frame): an IPv4 frame that is not a fragment's tail, UDP, to port 67,
/// and not one the host sends on the tap. Each instruction: code, jt, jf, k.
/// A jump's offset counts from the next instruction; every "no" goes to [`DROP`] (12).
const DHCP_REQUESTS: [(u16, u8, u8, u32); 12] = [
    // The host's own frames (the replies, and what tc redirects to the guest): out.
    (0x28, 0, 0, 0xffff_f004), // ldh [SKF_AD_OFF + SKF_AD_PKTTYPE]
    (0x15, 10, 0, libc::PACKET_OUTGOING as u32),
    (0x28, 0, 0, 12), // ldh [12]: the EtherType
    (0x15, 0, 8, 0x0800),
    (0x30, 0, 0, 23), // ldb [23]: the IP protocol
    (0x15, 0, 6, 17),
    (0x28, 0, 0, 20), // ldh [20]: flags and fragment offset
    (0x45, 4, 0, 0x1fff),
    (0xb1, 0, 0, 14), // ldxb 4*([14]&0xf): the IP header's length
    (0x48, 0, 0, 16), // ldh [x + 16]: the UDP destination port
    (0x15, 0, 1, 67),
    (0x06, 0, 0, 0xffff), // keep
];
/// Drops the frame (the instruction after the program's keep).
const DROP: (u16, u8, u8, u32) = (0x06, 0, 0, 0);

/// Opens a packet socket for the guest's DHCP requests on `tap` in the namespace at `netns`.
fn open_socket(netns: &Path, tap: &str) -> Result<(OwnedFd, i32), Error> {
    let tap =
        std::ffi::CString::new(tap).map_err(|_| Error::Worker("tap name has a NUL".into()))?;
    crate::worker::in_netns(netns, move |_| async move {
        // SAFETY: a plain syscall; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                ETH_P_ALL.to_be() as i32,
            )
        };
        if fd < 0 {
            return Err(io_error("socket", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        attach_filter(&socket)?;
        // SAFETY: `tap` is NUL-terminated.
        let ifindex = unsafe { libc::if_nametoindex(tap.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(io_error("find the tap", std::io::Error::last_os_error()));
        }
        let addr = link_addr(ifindex, ETH_P_ALL, [0; 6]);
        // SAFETY: `addr` is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(io_error("bind", std::io::Error::last_os_error()));
        }
        Ok((socket, ifindex))
    })
}

/// Attaches [`DHCP_REQUESTS`] to `socket`, before it is bound (so no other frame is queued).
fn attach_filter(socket: &OwnedFd) -> Result<(), Error> {
    let mut program: Vec<libc::sock_filter> = DHCP_REQUESTS
        .iter()
        .chain(std::iter::once(&DROP))
        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect();
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points to `program`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if rc < 0 {
        return Err(io_error(
            "attach the socket filter",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The link-layer address of `mac` on `ifindex`, for frames of `protocol`.
fn link_addr(ifindex: i32, protocol: u16, mac: [u8; 6]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol.to_be();
    addr.sll_ifindex = ifindex;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&mac);
    addr
}

/// Starts answering DHCP for `responder`'s VM on `tap` in the namespace at `netns`.
pub fn start(netns: &Path, tap: &str, responder: Responder) -> Result<DhcpServer, Error> {
    let (socket, ifindex) = open_socket(netns, tap)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("vmlet-dhcp".into())
        .spawn(move || serve(&socket, ifindex, &responder, &flag))
        .map_err(|e| io_error("start its thread", e))?;
    Ok(DhcpServer {
        stop,
        thread: Some(thread),
    })
}

fn serve(socket: &OwnedFd, ifindex: i32, responder: &Responder, stop: &AtomicBool) {
    let mut buf = vec![0u8; MAX_FRAME + 1];
    let timeout = nix::poll::PollTimeout::try_from(POLL_INTERVAL).expect("a short interval");
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [nix::poll::PollFd::new(
            socket.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                log::warn!("DHCP responder on ifindex {ifindex}: poll: {e}; stopping");
                return;
            }
        }
        // SAFETY: `buf` is valid for its length; no source address is asked for.
        let n = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            continue;
        }
        let n = n as usize;
        if n > MAX_FRAME {
            continue;
        }
        let Some(reply) = responder.answer(&buf[..n]) else {
            continue;
        };
        let dst: [u8; 6] = reply[..6].try_into().expect("a frame has a destination");
        let addr = link_addr(ifindex, libc::ETH_P_IP as u16, dst);
        // SAFETY: `reply` and `addr` are valid for the sizes given.
        let sent = unsafe {
            libc::sendto(
                socket.as_raw_fd(),
                reply.as_ptr().cast(),
                reply.len(),
                0,
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if sent < 0 {
            log::warn!(
                "DHCP responder on ifindex {ifindex}: send: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp::Lease;
    use std::io::{Read, Write};

    const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
    /// The `virtio_net_hdr` before each frame on a tap opened with `IFF_VNET_HDR`.
    const VNET_HDR: usize = 10;

    /// A DHCPDISCOVER from `VM_MAC`, as dhclient sends it.
    fn discover() -> Vec<u8> {
        let mut msg = vec![0u8; 240];
        msg[..3].copy_from_slice(&[1, 1, 6]);
        msg[4..8].copy_from_slice(&[1, 2, 3, 4]);
        msg[28..34].copy_from_slice(&VM_MAC);
        msg[236..240].copy_from_slice(&[99, 130, 83, 99]);
        msg.extend_from_slice(&[53, 1, 1, 255]);
        let udp_len = 8 + msg.len();
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&VM_MAC);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255]);
        f.extend_from_slice(&[0, 68, 0, 67]);
        f.extend_from_slice(&(udp_len as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&msg);
        f
    }

    /// Runs `cmd` (an `ip` command line) in the calling thread's namespace.
    fn ip(args: &str) {
        let status = std::process::Command::new("ip")
            .args(args.split(' '))
            .status()
            .unwrap();
        assert!(status.success(), "ip {args}");
    }

    /// In a new network namespace of a thread, a pod interface wired to a real tap as a
    /// pod's is (tc mirred both ways): a DISCOVER the "guest" writes comes back as an offer
    /// of the lease's address. Needs root (as the shim).
    #[test]
    fn a_guest_on_a_wired_tap_gets_an_offer() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            ip("link add eth0 type veth peer name peer0");
            ip("addr add 10.77.0.5/24 dev eth0");
            ip("link set eth0 up");
            ip("link set peer0 up");
            let netns = format!("/proc/self/task/{}/ns/net", nix::unistd::gettid());
            let mut wired = crate::wire(Path::new(&netns), "dhcp-test").unwrap();
            assert_eq!(wired.wirings[0].tap_name, "vmtap0");
            let tap = wired.taps.remove(0);
            let lease = Lease {
                mac: VM_MAC,
                address: "10.77.0.5".parse().unwrap(),
                prefix: 24,
                router: Some("10.77.0.1".parse().unwrap()),
                routes: vec![],
                mtu: 1500,
                dns: vec![],
                domain: None,
                hostname: None,
            };
            let server = start(Path::new(&netns), "vmtap0", Responder { lease }).unwrap();
            let mut tap = std::fs::File::from(tap);
            let mut frame = vec![0u8; VNET_HDR];
            frame.extend_from_slice(&discover());
            tap.write_all(&frame).unwrap();
            // The kernel's own IPv6 frames come out of the tap too: look for the offer.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let mut buf = vec![0u8; 2048];
            loop {
                assert!(std::time::Instant::now() < deadline, "no offer within 5 s");
                let mut fds = [nix::poll::PollFd::new(
                    tap.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(500u16)).unwrap() == 0 {
                    continue;
                }
                let n = tap.read(&mut buf).unwrap();
                let f = &buf[VNET_HDR..n];
                if f.len() > 42 && f[12..14] == [0x08, 0x00] && f[36..38] == [0, 68] {
                    assert_eq!(&f[..6], &VM_MAC);
                    assert_eq!(&f[42 + 16..42 + 20], &[10, 77, 0, 5]); // yiaddr
                    break;
                }
            }
            drop(server);
        })
        .join()
        .unwrap();
    }
}
