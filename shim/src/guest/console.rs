//! The guest's serial console log, read by the shim and `vmletctl`: its tail (for errors),
//! the agent's ready line (while booting), and what `vmletctl console --follow` prints. The
//! guest writes that file as fast as it likes, so nothing here reads more of it than a
//! bounded amount at a time.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How much of the console's end an error quotes.
pub const CONSOLE_TAIL: u64 = 2048;
/// Most bytes one [`ReadyWatch::shows_ready`] call reads.
const READ_PER_CHECK: u64 = 1 << 20;

/// The last [`CONSOLE_TAIL`] bytes of the console log (empty when there is none).
pub fn tail(path: &Path) -> String {
    tail_of(path, CONSOLE_TAIL)
}

/// The last `max` bytes of a console log (empty when there is none).
pub fn tail_of(path: &Path, max: u64) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(len.saturating_sub(max))).is_ok() {
        let _ = file.take(max).read_to_end(&mut bytes);
    }
    // The guest wrote it: no control characters (terminal escapes) pass on.
    crate::guest::guest_text::clean(&String::from_utf8_lossy(&bytes), 3 * bytes.len())
}

/// Looks for a line in the console log, reading only what was added since the last look. A
/// needle that starts with `\n` matches only at a line's start, the log's own start too.
pub struct ReadyWatch {
    path: PathBuf,
    needle: &'static [u8],
    offset: u64,
    /// The end of what was read, in case the needle straddles two reads.
    carry: Vec<u8>,
}

impl ReadyWatch {
    pub fn new(path: &Path, needle: &'static str) -> Self {
        Self {
            path: path.to_owned(),
            needle: needle.as_bytes(),
            offset: 0,
            carry: b"\n".to_vec(),
        }
    }

    /// Looks every 10 ms until the needle has appeared (true) or `deadline` passed (false).
    pub async fn wait_until(&mut self, deadline: std::time::Instant) -> bool {
        loop {
            if self.shows_ready() {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Whether the needle has appeared (reads at most [`READ_PER_CHECK`] new bytes).
    pub fn shows_ready(&mut self) -> bool {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return false;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Rotated or truncated: start again.
            self.offset = 0;
            self.carry = b"\n".to_vec();
        }
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return false;
        }
        let mut fresh = Vec::new();
        if file.take(READ_PER_CHECK).read_to_end(&mut fresh).is_err() {
            return false;
        }
        self.offset += fresh.len() as u64;
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(&fresh);
        if window.windows(self.needle.len()).any(|w| w == self.needle) {
            return true;
        }
        let keep = window.len().min(self.needle.len().saturating_sub(1));
        self.carry = window.split_off(window.len() - keep);
        false
    }
}

/// Reads a console log as it grows, for `vmletctl console --follow`: each
/// [`ConsoleFollower::read_new`] returns the text added since the last (at most
/// [`READ_PER_CHECK`] bytes of it), cleaned like [`tail`], and starts again from the top when
/// the log was restarted (a VM image's console log starts again at 2 MiB).
pub struct ConsoleFollower {
    path: PathBuf,
    offset: u64,
    /// The start of a UTF-8 character the last read cut.
    partial: Vec<u8>,
}

impl ConsoleFollower {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// How far into the log it has read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads on from the log's last `keep` bytes (what is there now).
    pub fn start_near_end(&mut self, keep: u64) {
        let len = std::fs::symlink_metadata(&self.path).map_or(0, |m| m.len());
        self.offset = len.saturating_sub(keep);
        self.partial.clear();
    }

    /// What the guest wrote since the last call: None when the log does not exist (yet, or
    /// any more). The file is opened without following a symbolic link.
    pub fn read_new(&mut self) -> Option<String> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .ok()?;
        let len = file.metadata().ok()?.len();
        let mut text = String::new();
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
            text.push_str("\n[vmlet: the console log started again]\n");
        }
        file.seek(SeekFrom::Start(self.offset)).ok()?;
        let mut bytes = std::mem::take(&mut self.partial);
        let before = bytes.len();
        file.take(READ_PER_CHECK).read_to_end(&mut bytes).ok()?;
        self.offset += (bytes.len() - before) as u64;
        let valid = match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            // A character cut at the end: keep its start for the next read.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        self.partial = bytes.split_off(valid);
        let raw = String::from_utf8_lossy(&bytes);
        text.push_str(&crate::guest::guest_text::clean(&raw, 3 * raw.len() + 8));
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vmlet-console-{name}-{}", std::process::id()))
    }

    #[test]
    fn the_tail_is_the_end_of_a_long_log() {
        let path = temp("tail");
        let mut text = "x".repeat(10_000);
        text.push_str("Kernel panic - not syncing");
        std::fs::write(&path, &text).unwrap();
        let t = tail(&path);
        assert_eq!(t.len() as u64, CONSOLE_TAIL);
        assert!(t.ends_with("Kernel panic - not syncing"));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(tail(&path), "");
    }

    #[test]
    fn the_ready_line_is_found_across_reads_and_after_a_rotation() {
        let path = temp("ready");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut watch = ReadyWatch::new(&path, "agent ready");
        assert!(!watch.shows_ready());
        file.write_all(b"booting...\nagent re").unwrap();
        assert!(!watch.shows_ready());
        file.write_all(b"ady on vsock\n").unwrap();
        assert!(watch.shows_ready(), "a line split over two reads");

        let mut watch = ReadyWatch::new(&path, "agent ready");
        watch.offset = 1 << 40;
        std::fs::write(&path, "agent ready\n").unwrap();
        assert!(watch.shows_ready(), "a shorter file is read from its start");
        std::fs::remove_file(&path).unwrap();
        assert!(!ReadyWatch::new(&path, "agent ready").shows_ready());
    }

    #[test]
    fn a_needle_at_a_lines_start_matches_there_and_at_the_logs_start_only() {
        let path = temp("line-start");
        std::fs::write(&path, "Kernel command line: quiet ready now\r\n").unwrap();
        let mut watch = ReadyWatch::new(&path, "\nready now");
        assert!(!watch.shows_ready(), "in the middle of a line");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"ready now\r\n")
            .unwrap();
        assert!(watch.shows_ready(), "at a line's start");
        std::fs::write(&path, "ready now\r\n").unwrap();
        assert!(
            ReadyWatch::new(&path, "\nready now").shows_ready(),
            "at the log's start"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_flood_is_read_a_bounded_amount_at_a_time() {
        let path = temp("flood");
        let size = 3 * READ_PER_CHECK as usize;
        let mut text = vec![b'y'; size];
        text.extend_from_slice(b"agent ready");
        std::fs::write(&path, &text).unwrap();
        let mut watch = ReadyWatch::new(&path, "agent ready");
        let mut checks = 1;
        while !watch.shows_ready() {
            checks += 1;
            assert!(watch.carry.len() < "agent ready".len());
        }
        assert_eq!(checks, 4);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_follower_sees_what_is_added_whole_characters_and_a_restart() {
        let path = temp("follow");
        let mut follower = ConsoleFollower::new(&path);
        assert_eq!(follower.read_new(), None, "no log yet");
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(b"boot\x1b[2J\r\ncaf\xc3").unwrap();
        assert_eq!(follower.read_new().unwrap(), "boot?[2J\ncaf");
        file.write_all(b"\xa9!\n").unwrap();
        assert_eq!(follower.read_new().unwrap(), "\u{e9}!\n");
        assert_eq!(follower.read_new().unwrap(), "");
        std::fs::write(&path, "again\n").unwrap();
        let text = follower.read_new().unwrap();
        assert!(
            text.contains("started again") && text.ends_with("again\n"),
            "{text}"
        );
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert_eq!(
            ConsoleFollower::new(&path).read_new(),
            None,
            "a link is not followed"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
