//! Tap devices through `/dev/net/tun`.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::Error;

/// Name prefix of vmlet's taps (`vmtap0`, `vmtap1`, ...).
pub const TAP_PREFIX: &str = "vmtap";

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

nix::ioctl_write_ptr_bad!(tun_set_iff, libc::TUNSETIFF, IfReq);

/// The tap name for the `n`th pod interface.
pub fn tap_name(n: usize) -> String {
    format!("{TAP_PREFIX}{n}")
}

/// Creates tap `name` in the calling thread's network namespace and returns its queue fd
/// (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, as QEMU's `-netdev tap,fd=` expects). The tap
/// is not persistent: it disappears when the last fd is closed.
pub fn open_tap(name: &str) -> Result<OwnedFd, Error> {
    let tap_error = |source| Error::Tap {
        name: name.to_owned(),
        source,
    };
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(tap_error(std::io::Error::from(
            std::io::ErrorKind::InvalidInput,
        )));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(tap_error)?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    for (dst, src) in req.name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: the fd is an open /dev/net/tun; `req` is a valid, initialised ifreq that
    // outlives the call.
    unsafe { tun_set_iff(file.as_raw_fd(), &req) }.map_err(|e| tap_error(e.into()))?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz() {
        assert_eq!(tap_name(0), "vmtap0");
        assert!(tap_name(999).len() < libc::IFNAMSIZ);
    }

    #[test]
    fn overlong_name_is_refused_before_any_syscall() {
        assert!(open_tap("a-name-that-is-far-too-long").is_err());
    }

    #[test]
    fn ifreq_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }
}
