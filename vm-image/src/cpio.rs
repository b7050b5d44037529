//! A writer for the `newc` cpio format the kernel unpacks as an initramfs.

use std::io::{self, Write};

/// File type bits of `c_mode`.
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// Writes an archive entry by entry; [`CpioWriter::finish`] adds the trailer.
pub struct CpioWriter<W: Write> {
    out: W,
    ino: u32,
    offset: u64,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            ino: 1,
            offset: 0,
        }
    }

    pub fn dir(&mut self, name: &str, perm: u32) -> io::Result<()> {
        self.entry(name, S_IFDIR | perm, 2, (0, 0), &[])
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, S_IFREG | perm, 1, (0, 0), data)
    }

    pub fn char_device(&mut self, name: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, S_IFCHR | perm, 1, (major, minor), &[])
    }

    /// Writes the trailer and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[])?;
        Ok(self.out)
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        let name = name.trim_start_matches('/');
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file over 4 GiB"))?;
        let ino = if name == "TRAILER!!!" { 0 } else { self.ino };
        self.ino += 1;
        let header = format!(
            "070701{ino:08x}{mode:08x}{uid:08x}{gid:08x}{nlink:08x}{mtime:08x}{size:08x}\
             {dmaj:08x}{dmin:08x}{rmaj:08x}{rmin:08x}{namesize:08x}{check:08x}",
            uid = 0,
            gid = 0,
            mtime = 0,
            dmaj = 0,
            dmin = 0,
            rmaj = rdev.0,
            rmin = rdev.1,
            namesize = name.len() + 1,
            check = 0,
        );
        self.write(header.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()?;
        self.write(data)?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let rem = (4 - (self.offset % 4)) % 4;
        self.write(&[0u8; 3][..rem as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_named() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("/dev", 0o755).unwrap();
        w.file("init", 0o755, b"hello").unwrap();
        w.char_device("dev/console", 0o600, 5, 1).unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("dev\0"));
        assert!(text.contains("init\0"));
        assert!(text.contains("hello"));
        assert!(text.contains("TRAILER!!!\0"));
        // Header (110 bytes) + "dev\0" (4) = 114, padded to 116: the next magic starts there.
        assert_eq!(&out[116..122], b"070701");
    }

    #[test]
    fn the_system_cpio_reads_it() {
        let Ok(status) = std::process::Command::new("cpio").arg("--version").output() else {
            eprintln!("cpio not installed: format checked by the other test only");
            return;
        };
        assert!(status.status.success());
        let mut w = CpioWriter::new(Vec::new());
        w.dir("a", 0o755).unwrap();
        w.file("a/b", 0o644, b"content").unwrap();
        let out = w.finish().unwrap();
        let mut child = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&out).unwrap();
        let listing = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&listing.stdout), "a\na/b\n");
    }
}
