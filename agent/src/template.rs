//! A template guest ([`vmlet_protocol::TEMPLATE_PARAM`]): booted once for a VM shape, saved
//! by the host, and restored into the VM of each pod of that shape. What the saved memory
//! holds is then the same in every such pod, so before it is saved the agent holds nothing
//! that belongs to one pod: no key, no shared directory, no vsock device (the host plugs the
//! pod's in after the restore).
//!
//! Before the save ([`prepare`]) the agent makes sure the kernel's random number generator
//! is seeded, so that the restore's reseeds below take effect, and says so on the console.
//! After the restore ([`await_restore`]) it waits for the pod's vsock device, and once it
//! has the pod's key it mixes it into the generator and reseeds it ([`reseed`]): whatever
//! the template's generator state was, what each pod's guest draws from then on depends on
//! a secret of that pod alone. (QEMU's vmgenid reseeds it too, where the VM has one.)

use std::io::Write;
use std::time::Duration;

use crate::Error;

/// How often the restored guest looks for its vsock device: the longest the agent adds
/// to a template start.
pub const POLL: Duration = Duration::from_millis(2);

/// The guest's vsock address, as the kernel knows it.
pub trait LocalCid {
    /// The CID of the guest's vsock device; `None` while it has none.
    fn local_cid(&mut self) -> Result<Option<u32>, Error>;
}

/// [`LocalCid`] of the running kernel: `/dev/vsock`'s `IOCTL_VM_SOCKETS_GET_LOCAL_CID`,
/// which answers `VMADDR_CID_ANY` until a virtio-vsock device is probed.
pub struct KernelCid(std::fs::File);

impl KernelCid {
    pub fn open() -> Result<Self, Error> {
        std::fs::File::open("/dev/vsock")
            .map(KernelCid)
            .map_err(|e| Error::io("open /dev/vsock", e))
    }
}

// IOCTL_VM_SOCKETS_GET_LOCAL_CID: _IO(7, 0xb9), the CID written through the argument.
nix::ioctl_read_bad!(get_local_cid, 0x7b9, u32);
// RNDRESEEDCRNG: _IO('R', 0x07).
nix::ioctl_none!(reseed_crng, b'R', 0x07);

impl LocalCid for KernelCid {
    fn local_cid(&mut self) -> Result<Option<u32>, Error> {
        use std::os::fd::AsRawFd;
        let mut cid = 0u32;
        // SAFETY: the descriptor is open, and the kernel writes one u32 into `cid`.
        unsafe { get_local_cid(self.0.as_raw_fd(), &mut cid) }
            .map_err(|e| Error::Boot(format!("read the guest's vsock CID: {e}")))?;
        Ok((cid != libc::VMADDR_CID_ANY).then_some(cid))
    }
}

/// What the template does before it may be saved: waits until the kernel's random number
/// generator is seeded (a reseed of one that is not does not take), then says on the
/// console that it is ready.
pub fn prepare() -> Result<(), Error> {
    let mut byte = [0u8; 1];
    // Blocks until the generator is seeded: the kernel gathers jitter entropy meanwhile.
    nix::errno::Errno::result(unsafe {
        // SAFETY: the buffer is valid for its length.
        libc::getrandom(byte.as_mut_ptr().cast(), byte.len(), 0)
    })
    .map_err(|e| Error::Boot(format!("getrandom: {e}")))?;
    log::info!("{}", vmlet_protocol::TEMPLATE_READY_LINE);
    Ok(())
}

/// Waits, looking every `poll`, until the guest has a vsock CID, i.e. until it has been
/// restored into a pod's VM and the pod's vsock device plugged in; returns that CID.
/// No deadline of its own: a template that is never restored is ended by its host.
pub fn await_restore(cid: &mut impl LocalCid, poll: Duration) -> Result<u32, Error> {
    loop {
        if let Some(cid) = cid.local_cid()? {
            return Ok(cid);
        }
        std::thread::sleep(poll);
    }
}

/// Mixes `secret` (the pod's own) into the kernel's random number generator and reseeds it
/// from that at once.
pub fn reseed(secret: &[u8]) -> Result<(), Error> {
    use std::os::fd::AsRawFd;
    let mut urandom = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(|e| Error::io("open /dev/urandom", e))?;
    urandom
        .write_all(secret)
        .map_err(|e| Error::io("mix the pod's key into the random pool", e))?;
    // SAFETY: the descriptor is open; the ioctl takes no argument.
    unsafe { reseed_crng(urandom.as_raw_fd()) }
        .map_err(|e| Error::Boot(format!("reseed the random number generator: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel whose vsock device appears after `absent` looks.
    struct Plugged {
        absent: usize,
        looks: usize,
    }

    impl LocalCid for Plugged {
        fn local_cid(&mut self) -> Result<Option<u32>, Error> {
            self.looks += 1;
            Ok((self.looks > self.absent).then_some(7))
        }
    }

    #[test]
    fn the_restore_is_awaited_until_the_device_is_plugged() {
        let mut kernel = Plugged {
            absent: 5,
            looks: 0,
        };
        assert_eq!(
            await_restore(&mut kernel, Duration::from_micros(1)).unwrap(),
            7
        );
        assert_eq!(kernel.looks, 6);
    }

    struct Broken;

    impl LocalCid for Broken {
        fn local_cid(&mut self) -> Result<Option<u32>, Error> {
            Err(Error::Boot("no /dev/vsock".into()))
        }
    }

    #[test]
    fn a_kernel_that_cannot_say_ends_the_wait_with_its_error() {
        let err = await_restore(&mut Broken, Duration::from_micros(1)).unwrap_err();
        assert!(err.to_string().contains("no /dev/vsock"), "{err}");
    }
}
