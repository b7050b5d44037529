//! Steering every TCP connection to the loopback of a network namespace into one listening
//! socket, whatever its port: a `BPF_PROG_TYPE_SK_LOOKUP` program (Linux 5.9) attached to
//! the namespace picks the socket from a one-entry `SOCKMAP`. The accepted connection keeps
//! the address it was made to, so its local port is the port the client dialled.
//!
//! The program is 21 eBPF instructions written out here (no compiler, no libbpf); the
//! kernel's verifier checks it at load. Closing the link's fd detaches it, so
//! nothing outlives the process that set it up.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

// From <linux/bpf.h>.
const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_PROG_LOAD: u32 = 5;
const BPF_LINK_CREATE: u32 = 28;
const BPF_MAP_TYPE_SOCKMAP: u32 = 15;
const BPF_PROG_TYPE_SK_LOOKUP: u32 = 30;
const BPF_SK_LOOKUP: u32 = 36;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_SK_RELEASE: i32 = 86;
const BPF_FUNC_SK_ASSIGN: i32 = 124;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// The program's verdict: let the kernel go on (with the socket it was given, if any).
const SK_PASS: i32 = 1;
/// Offsets in `struct bpf_sk_lookup`.
const CTX_PROTOCOL: i16 = 12;
const CTX_LOCAL_IP4: i16 = 40;
const IPPROTO_TCP: i32 = 6;
/// 127.0.0.1 as the context holds it (network byte order, read as a little-endian u32).
const LOOPBACK_IP4: i32 = i32::from_le_bytes([127, 0, 0, 1]);

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

// Opcodes.
const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const LDX_W: u8 = 0x61;
const ST_W: u8 = 0x62;
const LD_IMM64: u8 = 0x18;
const JNE_IMM: u8 = 0x55;
const JEQ_IMM: u8 = 0x15;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
// Registers.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R6: u8 = 6;
const R7: u8 = 7;
const FP: u8 = 10;

/// The program: a TCP connection to 127.0.0.1 gets the socket in `map_fd`'s slot 0;
/// everything else (and a connection when the slot is empty) goes on as usual.
fn program(map_fd: i32) -> Vec<Insn> {
    const PASS: usize = 19;
    let to_pass = |at: usize| (PASS - at - 1) as i16;
    vec![
        /* 0 */ insn(MOV64_REG, R6, R1, 0, 0),
        /* 1 */ insn(LDX_W, R2, R6, CTX_PROTOCOL, 0),
        /* 2 */ insn(JNE_IMM, R2, 0, to_pass(2), IPPROTO_TCP),
        /* 3 */ insn(LDX_W, R2, R6, CTX_LOCAL_IP4, 0),
        /* 4 */ insn(JNE_IMM, R2, 0, to_pass(4), LOOPBACK_IP4),
        // key = 0, on the stack
        /* 5 */ insn(ST_W, FP, 0, -4, 0),
        /* 6 */ insn(MOV64_REG, R2, FP, 0, 0),
        /* 7 */ insn(ADD64_IMM, R2, 0, 0, -4),
        /* 8 */ insn(LD_IMM64, R1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        /* 9 */ insn(0, 0, 0, 0, 0),
        /* 10 */ insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),
        /* 11 */ insn(JEQ_IMM, R0, 0, to_pass(11), 0),
        // bpf_sk_assign(ctx, sk, 0); bpf_sk_release(sk)
        /* 12 */
        insn(MOV64_REG, R7, R0, 0, 0),
        /* 13 */ insn(MOV64_REG, R1, R6, 0, 0),
        /* 14 */ insn(MOV64_REG, R2, R7, 0, 0),
        /* 15 */ insn(MOV64_IMM, R3, 0, 0, 0),
        /* 16 */ insn(CALL, 0, 0, 0, BPF_FUNC_SK_ASSIGN),
        /* 17 */ insn(MOV64_REG, R1, R7, 0, 0),
        /* 18 */ insn(CALL, 0, 0, 0, BPF_FUNC_SK_RELEASE),
        /* 19 */ insn(MOV64_IMM, R0, 0, 0, SK_PASS),
        /* 20 */ insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr`, as bytes (the kernel zero-checks what it does not know).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn u32(mut self, at: usize, v: u32) -> Self {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, at: usize, v: u64) -> Self {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: u32, attr: &Attr, what: &str) -> io::Result<i64> {
    // SAFETY: attr is a valid, initialised bpf_attr of the given size; the pointers in it
    // point at buffers that outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(ret)
}

/// A command that returns a new fd.
fn bpf_fd(cmd: u32, attr: &Attr, what: &str) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr, what)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches the program to the network namespace `netns` with `listener` (a listening TCP
/// socket of that namespace) as the target, and returns the link: connections are steered
/// while it is open.
pub fn steer_loopback_tcp(netns: BorrowedFd, listener: BorrowedFd) -> io::Result<OwnedFd> {
    let map = bpf_fd(
        BPF_MAP_CREATE,
        &Attr::new()
            .u32(0, BPF_MAP_TYPE_SOCKMAP)
            .u32(4, 4) // key: u32
            .u32(8, 4) // value: the socket's fd
            .u32(12, 1),
        "create the sockmap",
    )?;
    let (key, value) = (0u32, listener.as_raw_fd() as u32);
    bpf(
        BPF_MAP_UPDATE_ELEM,
        &Attr::new()
            .u32(0, map.as_raw_fd() as u32)
            .u64(8, &key as *const u32 as u64)
            .u64(16, &value as *const u32 as u64),
        "put the listener in the sockmap",
    )?;
    let insns = program(map.as_raw_fd());
    let license = c"Apache-2.0";
    let load = |log: Option<&mut [u8]>| {
        let mut attr = Attr::new()
            .u32(0, BPF_PROG_TYPE_SK_LOOKUP)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(68, BPF_SK_LOOKUP);
        if let Some(log) = log {
            attr = attr
                .u32(24, 1)
                .u32(28, log.len() as u32)
                .u64(32, log.as_mut_ptr() as u64);
        }
        bpf_fd(BPF_PROG_LOAD, &attr, "load the sk_lookup program")
    };
    let prog = match load(None) {
        Ok(prog) => prog,
        Err(e) => {
            // Again with the verifier's log, to say why.
            let mut log = vec![0u8; 16 * 1024];
            let _ = load(Some(&mut log));
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let last = text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
            return Err(io::Error::new(e.kind(), format!("{e} (verifier: {last})")));
        }
    };
    bpf_fd(
        BPF_LINK_CREATE,
        &Attr::new()
            .u32(0, prog.as_raw_fd() as u32)
            .u32(4, netns.as_raw_fd() as u32)
            .u32(8, BPF_SK_LOOKUP),
        "attach the sk_lookup program to the network namespace",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn jumps_land_on_the_pass_verdict() {
        let p = program(7);
        for (at, i) in p.iter().enumerate() {
            if matches!(i.code, JNE_IMM | JEQ_IMM) {
                let target = at as i16 + 1 + i.off;
                assert_eq!(p[target as usize], insn(MOV64_IMM, R0, 0, 0, SK_PASS));
            }
        }
        assert_eq!(p[8].imm, 7);
    }

    /// In a new network namespace of a thread: connections to any port of 127.0.0.1 reach
    /// the one listener, and say which port they were made to. Needs root (as the shim).
    #[test]
    fn connections_to_any_loopback_port_reach_the_listener() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .unwrap();
            assert!(up.success());
            let netns = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let link = {
                use std::os::fd::AsFd;
                steer_loopback_tcp(netns.as_fd(), listener.as_fd()).unwrap()
            };
            for port in [80, 8080, 12001] {
                let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let (mut conn, _) = listener.accept().unwrap();
                assert_eq!(conn.local_addr().unwrap().port(), port);
                client.write_all(b"hi").unwrap();
                let mut buf = [0; 2];
                conn.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"hi");
            }
            drop(link);
            assert!(TcpStream::connect(("127.0.0.1", 80)).is_err());
        })
        .join()
        .unwrap();
    }
}
