//! A VM-mode pod's DNS for its cloud-init seed ([`super::nocloud`]): the name servers and
//! search domains of the resolv.conf containerd wrote for the pod, read only when it is a
//! regular file (not through a link), bounded in size and time.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use crate::Error;

/// At most this many name servers and search domains are taken from the pod's resolv.conf
/// (glibc's own limits are 3 and 6).
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCH: usize = 6;

/// The pod's DNS, from the resolv.conf containerd wrote for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub nameservers: Vec<IpAddr>,
    pub search: Vec<String>,
}

/// The longest resolv.conf read (glibc reads at most 3 servers and 6 domains of it).
const MAX_RESOLV_CONF: u64 = 64 * 1024;
/// How long reading it may take.
const RESOLV_CONF_DEADLINE: Duration = Duration::from_secs(5);

/// The first `max` bytes of the regular file at `path`: looked at through an `O_PATH`
/// descriptor that does not follow a trailing link, and opened for reading (through that
/// descriptor, so the same file) only when it is a regular file.
fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, Error> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let what = || format!("the pod's DNS from {}", path.display());
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(format!("read {}", what()), e))?;
    let kind = handle
        .metadata()
        .map_err(|e| Error::io(format!("read {}", what()), e))?
        .file_type();
    if !kind.is_file() {
        let is = if kind.is_symlink() {
            "a symbolic link"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device node"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(Error::InvalidArgument(format!(
            "{}: the file bound at /etc/resolv.conf is {is}, not a regular file",
            path.display()
        )));
    }
    let mut text = Vec::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .and_then(|f| f.take(max).read_to_end(&mut text))
        .map_err(|e| Error::io(format!("read {}", what()), e))?;
    Ok(text)
}

impl Dns {
    /// Reads the resolv.conf at `path` (its first [`MAX_RESOLV_CONF`] bytes). The path is
    /// the spec's (a pod's volume may be bound at `/etc/resolv.conf`): it must be a regular
    /// file, looked at without following a link and before anything opens it for reading
    /// (a FIFO would block the read, a device such as the watchdog acts when opened), and
    /// it is read off the runtime's threads within [`RESOLV_CONF_DEADLINE`].
    pub async fn read(path: &Path) -> Result<Dns, Error> {
        let owned = path.to_owned();
        let read = tokio::task::spawn_blocking(move || read_regular(&owned, MAX_RESOLV_CONF));
        let text = tokio::time::timeout(RESOLV_CONF_DEADLINE, read)
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "the pod's DNS: {} not read within {RESOLV_CONF_DEADLINE:?}",
                    path.display()
                ))
            })?
            .map_err(|e| Error::Internal(format!("reading the pod's DNS: {e}")))??;
        Ok(Dns::from_resolv_conf(&String::from_utf8_lossy(&text)))
    }

    /// Reads `nameserver` and `search` lines; anything else (options, comments, lines that
    /// do not parse) is left out.
    pub fn from_resolv_conf(text: &str) -> Dns {
        let mut dns = Dns::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(Ok(addr)) = words.next().map(str::parse::<IpAddr>) {
                        if dns.nameservers.len() < MAX_NAMESERVERS {
                            dns.nameservers.push(addr);
                        }
                    }
                }
                Some("search") => {
                    dns.search = words.take(MAX_SEARCH).map(str::to_owned).collect();
                }
                _ => {}
            }
        }
        dns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_resolv_conf_is_read_up_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        // A server past the bound is not read.
        let text = format!(
            "nameserver 10.0.0.1\n#{}\nnameserver 10.0.0.2\n",
            "x".repeat(MAX_RESOLV_CONF as usize)
        );
        std::fs::write(&path, text).unwrap();
        let dns = Dns::read(&path).await.unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(dns.nameservers, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        let err = Dns::read(&path).await.unwrap_err();
        assert!(err.message().contains("read the pod's DNS"), "{err}");
    }

    /// What a pod's volume can put at `/etc/resolv.conf` besides a file is refused by
    /// name, without opening it: a FIFO (whose open or read would wait for a writer), a
    /// device node (the watchdog acts when opened), a link.
    #[tokio::test]
    async fn only_a_regular_file_is_read_for_the_pods_dns() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let link = dir.path().join("link");
        let target = dir.path().join("target");
        std::fs::write(&target, "nameserver 10.0.0.1\n").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for (path, named) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/null"), "a device node"),
            (link.as_path(), "a symbolic link"),
            (dir.path(), "a directory"),
        ] {
            let err = tokio::time::timeout(Duration::from_secs(2), Dns::read(path))
                .await
                .expect("refused at once, not blocked")
                .unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(err.message().contains(named), "{path:?}: {err}");
        }
        assert_eq!(Dns::read(&target).await.unwrap().nameservers.len(), 1);
    }
}
