//! The lines of vmlet's QMP monitor, bounded: QEMU runs the guest's devices, so a line may
//! be as long as a guest makes it. A line longer than the bound is reported once and
//! skipped to its newline, its bytes dropped as they come (never a growing buffer), and
//! reading goes on: one over-long event must not end the monitor, whose end is how the
//! shim learns that the VM ended.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes asked of the socket per read.
const CHUNK: usize = 8 * 1024;

/// Why [`Lines::next`] gave no line.
#[derive(Debug)]
pub enum LineError {
    /// A line longer than the bound began; it is being skipped.
    TooLong,
    Io(std::io::Error),
}

/// Newline-terminated lines of at most `max` bytes from `inner`.
pub struct Lines<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no newline (each byte is looked at once).
    scanned: usize,
    /// Inside a line that was too long: dropping bytes up to its newline.
    skipping: bool,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    pub fn new(inner: R, max: usize) -> Self {
        Lines {
            inner,
            max,
            buf: Vec::with_capacity(CHUNK),
            scanned: 0,
            skipping: false,
        }
    }

    /// The next line (without its newline, invalid UTF-8 replaced), an over-long line's
    /// report, a read error, or `None` at the end of the stream (a last line without a
    /// newline is dropped: QEMU ended mid-line).
    pub async fn next(&mut self) -> Option<Result<String, LineError>> {
        loop {
            let from = self.scanned;
            if let Some(at) = self.buf[from..].iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=from + at).collect();
                self.scanned = 0;
                if std::mem::take(&mut self.skipping) {
                    continue;
                }
                let line = &line[..line.len() - 1];
                if line.len() > self.max {
                    return Some(Err(LineError::TooLong));
                }
                return Some(Ok(String::from_utf8_lossy(line).into_owned()));
            }
            self.scanned = self.buf.len();
            if self.skipping {
                self.buf.clear();
                self.scanned = 0;
            } else if self.buf.len() > self.max {
                self.buf.clear();
                self.scanned = 0;
                self.skipping = true;
                return Some(Err(LineError::TooLong));
            }
            let mut chunk = [0u8; CHUNK];
            match self.inner.read(&mut chunk).await {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Some(Err(LineError::Io(e))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn all(input: Vec<u8>, max: usize) -> Vec<Result<String, String>> {
        let mut lines = Lines::new(&input[..], max);
        let mut out = Vec::new();
        while let Some(line) = lines.next().await {
            out.push(line.map_err(|e| format!("{e:?}")));
        }
        out
    }

    #[tokio::test]
    async fn lines_come_one_by_one() {
        assert_eq!(
            all(b"{\"a\":1}\n\n{\"b\":2}\nunfinished".to_vec(), 64).await,
            vec![
                Ok("{\"a\":1}".into()),
                Ok(String::new()),
                Ok("{\"b\":2}".into())
            ]
        );
    }

    #[tokio::test]
    async fn an_over_long_line_is_reported_once_and_skipped() {
        let mut input = b"first\n".to_vec();
        input.extend(vec![b'x'; 100_000]);
        input.extend_from_slice(b"\nafter\n");
        assert_eq!(
            all(input, 1000).await,
            vec![
                Ok("first".into()),
                Err("TooLong".into()),
                Ok("after".into())
            ]
        );
    }

    #[tokio::test]
    async fn a_line_at_the_bound_is_kept() {
        let mut input = vec![b'y'; 1000];
        input.push(b'\n');
        assert_eq!(all(input, 1000).await, vec![Ok("y".repeat(1000))]);
    }
}
