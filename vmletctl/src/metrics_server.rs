//! `vmletctl metrics --listen`: a small HTTP/1.0 server of `GET /metrics` for Prometheus.
//!
//! Whoever reaches the address is a client, so no client may hold it: each connection is
//! served on a thread of its own with one deadline for the whole exchange
//! ([`REQUEST_DEADLINE`], however slowly the client sends), the request is read to 8 KiB at
//! most, and at most [`MAX_CONNECTIONS`] are served at once (another is answered 503 and
//! closed). The address is loopback unless the operator names another
//! ([`DEFAULT_ADDRESS`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where `--listen` without an address serves.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9464";
/// How long one whole request and its answer may take.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// The longest request (line and headers) read.
const MAX_REQUEST: usize = 8 * 1024;

/// Serves `render()` (Prometheus text) on `listener` for ever.
pub fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    serve_within(listener, REQUEST_DEADLINE, render)
}

/// [`serve`], each exchange within `deadline`.
fn serve_within(
    listener: TcpListener,
    deadline: Duration,
    render: impl Fn() -> String + Send + Sync + 'static,
) {
    let render = Arc::new(render);
    let busy = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(stream) => stream,
            // Out of descriptors: not a loop that spins.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Some(slot) = Slot::take(&busy) else {
            let _ = answer(
                &mut stream,
                "503 Service Unavailable",
                "too many scrapes at once\n",
                Instant::now() + Duration::from_secs(1),
            );
            continue;
        };
        let render = render.clone();
        // A thread that could not start drops its slot with the closure.
        let _ = std::thread::Builder::new()
            .name("metrics-client".into())
            .spawn(move || {
                let _slot = slot;
                serve_one(stream, deadline, &*render);
            });
    }
}

/// One of the [`MAX_CONNECTIONS`] clients served at once, given back when dropped (also
/// when serving it panicked).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(busy: &Arc<AtomicUsize>) -> Option<Slot> {
        if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            busy.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(busy.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Binds `address` and serves on it.
pub fn listen(
    address: SocketAddr,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> Result<(), String> {
    let listener = TcpListener::bind(address).map_err(|e| format!("listen on {address}: {e}"))?;
    eprintln!("vmletctl: serving http://{address}/metrics");
    serve(listener, render);
    Ok(())
}

/// One exchange, within `deadline` from its start.
fn serve_one(mut stream: TcpStream, deadline: Duration, render: &dyn Fn() -> String) {
    let deadline = Instant::now() + deadline;
    let Some(request) = read_request(&mut stream, deadline) else {
        return;
    };
    let line = String::from_utf8_lossy(&request);
    let (status, body) = match line.split_whitespace().take(2).collect::<Vec<_>>()[..] {
        ["GET", "/metrics"] => ("200 OK", render()),
        ["GET", _] => ("404 Not Found", "only /metrics is served\n".to_owned()),
        _ => ("400 Bad Request", "expected GET /metrics\n".to_owned()),
    };
    let _ = answer(&mut stream, status, &body, deadline);
}

/// The request line and headers, up to the blank line; `None` when the deadline passed or
/// the client went away first.
fn read_request(stream: &mut TcpStream, deadline: Instant) -> Option<Vec<u8>> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while request.len() < MAX_REQUEST && !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        stream.set_read_timeout(Some(left)).ok()?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
    request.truncate(MAX_REQUEST);
    Some(request)
}

/// Writes the answer by `deadline`: each write may take only what is left of it, so a
/// client that reads slowly is cut there.
fn answer(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    deadline: Instant,
) -> std::io::Result<()> {
    let text = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(rest)? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => rest = &rest[n..],
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, || "vmlet_pods 1\n".to_owned()));
        address
    }

    fn scrape(address: SocketAddr) -> String {
        let mut s = TcpStream::connect(address).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn a_scrape_gets_the_figures() {
        let answer = scrape(server());
        assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nvmlet_pods 1\n"), "{answer}");
    }

    #[test]
    fn slow_clients_do_not_hold_another_scrape() {
        let address = server();
        // Clients that connect and send a byte now and then, never a whole request.
        let slow: Vec<_> = (0..3)
            .map(|_| {
                let mut s = TcpStream::connect(address).unwrap();
                s.write_all(b"G").unwrap();
                s
            })
            .collect();
        let started = Instant::now();
        let answer = scrape(address);
        assert!(answer.contains("vmlet_pods 1"), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        drop(slow);
    }

    #[test]
    fn a_client_that_trickles_is_cut_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let deadline = Duration::from_millis(300);
        std::thread::spawn(move || serve_within(listener, deadline, || "x\n".to_owned()));
        let mut s = TcpStream::connect(address).unwrap();
        let started = Instant::now();
        // A byte every 50 ms: each read is quick, the request never ends.
        while s.write_all(b"G").is_ok() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
            let mut probe = [0u8; 1];
            s.set_nonblocking(true).unwrap();
            let closed = matches!(s.read(&mut probe), Ok(0));
            s.set_nonblocking(false).unwrap();
            if closed {
                break;
            }
        }
        let took = started.elapsed();
        assert!(
            took >= deadline && took < Duration::from_secs(2),
            "cut after {took:?}"
        );
    }

    #[test]
    fn beyond_the_bound_a_client_is_told_to_come_back() {
        let address = server();
        let held: Vec<_> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(address).unwrap())
            .collect();
        // The server counts them as they are accepted.
        std::thread::sleep(Duration::from_millis(200));
        // Told so (or reset, the request unread): no figures either way.
        let mut s = TcpStream::connect(address).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
        let mut answer = String::new();
        match s.read_to_string(&mut answer) {
            Ok(_) => assert!(answer.starts_with("HTTP/1.0 503"), "{answer}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        drop(held);
        std::thread::sleep(Duration::from_millis(200));
        assert!(scrape(address).starts_with("HTTP/1.0 200"));
    }
}
