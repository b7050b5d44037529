//! The node's `vmlet.io/runtime` label, set by `vmletctl install --node NAME` and removed by
//! `vmletctl uninstall --node NAME`: the RuntimeClass `vmlet` schedules pods only onto nodes
//! that carry it (`deploy/runtimeclass.yaml`), so a pod never lands where vmlet is not
//! installed.
//!
//! The installer runs in a DaemonSet's pod, so the label is set with the pod's service
//! account: one JSON merge patch of the Node over HTTPS to the API server
//! (`KUBERNETES_SERVICE_HOST`/`_PORT`), its certificate checked against the account's
//! `ca.crt`, the account's token as bearer. The RBAC in `deploy/vmlet-deploy.yaml` lets it
//! get and patch nodes, nothing else, and its ValidatingAdmissionPolicy narrows that to the
//! `vmlet.io/` labels of the node its pod runs on. The exchange is bounded: 10 s to connect, read and
//! write, and at most 64 KiB of answer.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use vmlet_shim::Error;

/// The label a node with vmlet installed carries (value [`LABEL_VALUE`]).
pub const LABEL: &str = "vmlet.io/runtime";
pub const LABEL_VALUE: &str = "true";
/// The accelerator the node's pods get (`kvm` or `tcg`, `vmletctl check --accel`), so that a
/// RuntimeClass can keep pods to KVM nodes.
pub const ACCEL_LABEL: &str = "vmlet.io/accel";
/// Where a pod's service account is mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long connecting, each read and each write to the API server may take.
const DEADLINE: Duration = Duration::from_secs(10);
/// The most of an answer that is read.
const MAX_ANSWER: u64 = 64 * 1024;

/// The seam to the Kubernetes API: one label of one node set (`Some`) or removed (`None`).
pub trait NodeApi {
    fn label(&self, node: &str, key: &str, value: Option<&str>) -> Result<(), Error>;
}

/// The API server as a pod reaches it, with the pod's service account.
pub struct InCluster {
    host: String,
    port: u16,
    token: String,
    tls: Arc<rustls::ClientConfig>,
}

impl InCluster {
    /// The API server named by `KUBERNETES_SERVICE_HOST`/`_PORT` (from `env`), with the
    /// token and CA of the service account mounted at `account`.
    pub fn new(env: impl Fn(&str) -> Option<String>, account: &Path) -> Result<Self, Error> {
        let not_in_pod = |what: &str| {
            Error::FailedPrecondition(format!(
                "labelling the node needs the API server and a service account, as a pod has them: {what}"
            ))
        };
        let host = env("KUBERNETES_SERVICE_HOST")
            .filter(|h| !h.is_empty())
            .ok_or_else(|| not_in_pod("KUBERNETES_SERVICE_HOST is not set"))?;
        let port = match env("KUBERNETES_SERVICE_PORT") {
            None => 443,
            Some(p) => p.parse().map_err(|_| {
                Error::InvalidArgument(format!("KUBERNETES_SERVICE_PORT={p:?} is not a port"))
            })?,
        };
        let read = |name: &str| {
            let path = account.join(name);
            std::fs::read(&path).map_err(|e| not_in_pod(&format!("{}: {e}", path.display())))
        };
        let token = String::from_utf8(read("token")?)
            .map_err(|_| Error::InvalidArgument("the service account's token is not text".into()))?
            .trim()
            .to_owned();
        if token.is_empty() || token.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(Error::InvalidArgument(
                "the service account's token is empty or not one word".into(),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        let pem = read("ca.crt")?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| {
                Error::InvalidArgument(format!("{}/ca.crt: {e}", account.display()))
            })?;
            roots.add(cert).map_err(|e| {
                Error::InvalidArgument(format!("{}/ca.crt: {e}", account.display()))
            })?;
        }
        if roots.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{}/ca.crt holds no certificate",
                account.display()
            )));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Internal(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(InCluster {
            host,
            port,
            token,
            tls: Arc::new(tls),
        })
    }

    /// One request; the answer's status and body.
    fn exchange(&self, request: &[u8]) -> Result<(u16, String), Error> {
        let failed = |what: String| Error::FailedPrecondition(format!("the API server: {what}"));
        let address = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| failed(format!("{}:{}: {e}", self.host, self.port)))?
            .next()
            .ok_or_else(|| failed(format!("{} has no address", self.host)))?;
        let tcp = TcpStream::connect_timeout(&address, DEADLINE)
            .map_err(|e| failed(format!("connect to {address}: {e}")))?;
        tcp.set_read_timeout(Some(DEADLINE))
            .and_then(|_| tcp.set_write_timeout(Some(DEADLINE)))
            .map_err(|e| failed(e.to_string()))?;
        let name = match self.host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(self.host.clone())
                .map_err(|e| failed(format!("{}: {e}", self.host)))?,
        };
        let connection = rustls::ClientConnection::new(self.tls.clone(), name)
            .map_err(|e| failed(format!("TLS: {e}")))?;
        let mut stream = rustls::StreamOwned::new(connection, tcp);
        stream
            .write_all(request)
            .and_then(|_| stream.flush())
            .map_err(|e| failed(format!("{address}: {e}")))?;
        let mut answer = Vec::new();
        // `Connection: close`: the answer ends with the stream (or at the bound).
        match (&mut stream).take(MAX_ANSWER).read_to_end(&mut answer) {
            Ok(_) => {}
            // A server that closes without close_notify still gave its whole answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
            Err(e) => return Err(failed(format!("{address}: {e}"))),
        }
        parse_answer(&answer).ok_or_else(|| failed(format!("{address}: not an HTTP answer")))
    }
}

impl NodeApi for InCluster {
    fn label(&self, node: &str, key: &str, value: Option<&str>) -> Result<(), Error> {
        let request = patch_request(&self.host, node, &self.token, &label_patch(key, value))?;
        match self.exchange(&request)? {
            (200, _) => Ok(()),
            (404, _) => Err(Error::NotFound(format!("node {node}"))),
            (status @ (401 | 403), body) => Err(Error::PermissionDenied(format!(
                "the API server refused to patch node {node} ({status}): {}; the service account needs get and patch on nodes, and its ValidatingAdmissionPolicy lets it patch only the node its pod runs on (deploy/vmlet-deploy.yaml)",
                brief(&body)
            ))),
            (status, body) => Err(Error::FailedPrecondition(format!(
                "the API server answered {status} to patching node {node}: {}",
                brief(&body)
            ))),
        }
    }
}

/// The JSON merge patch that sets (or, with `None`, removes) one label.
pub fn label_patch(key: &str, value: Option<&str>) -> String {
    serde_json::json!({ "metadata": { "labels": { key: value } } }).to_string()
}

/// Whether `name` is a node's name: a DNS subdomain (RFC 1123, at most 253 characters), so
/// it is safe in a URL path.
pub fn is_node_name(name: &str) -> bool {
    name.len() <= 253
        && !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// The HTTP/1.1 request that merge-patches node `node`.
pub fn patch_request(host: &str, node: &str, token: &str, patch: &str) -> Result<Vec<u8>, Error> {
    if !is_node_name(node) {
        return Err(Error::InvalidArgument(format!(
            "{node:?} is not a node name (a lowercase DNS subdomain)"
        )));
    }
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    Ok(format!(
        "PATCH /api/v1/nodes/{node} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/merge-patch+json\r\nAccept: application/json\r\nUser-Agent: vmletctl/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{patch}",
        env!("CARGO_PKG_VERSION"),
        patch.len()
    )
    .into_bytes())
}

/// The status code and body of an HTTP/1.1 answer (a chunked body is returned as sent; only
/// its gist is shown to the user).
pub fn parse_answer(answer: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_line = head.lines().next()?;
    let mut words = status_line.split_whitespace();
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status = words.next()?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The gist of an API server's answer: its `message`, or its first 200 characters.
fn brief(body: &str) -> String {
    let json = body.find('{').map(|at| &body[at..]).unwrap_or(body);
    let json = json.rfind('}').map(|at| &json[..=at]).unwrap_or(json);
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(v) if v["message"].is_string() => v["message"].as_str().unwrap_or_default().to_owned(),
        _ => body.chars().take(200).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_or_removes_one_label() {
        assert_eq!(
            label_patch(LABEL, Some(LABEL_VALUE)),
            r#"{"metadata":{"labels":{"vmlet.io/runtime":"true"}}}"#
        );
        assert_eq!(
            label_patch(LABEL, None),
            r#"{"metadata":{"labels":{"vmlet.io/runtime":null}}}"#
        );
    }

    #[test]
    fn only_node_names_reach_the_url() {
        for good in ["node-1", "a", "ip-10-0-0-1.ec2.internal"] {
            assert!(is_node_name(good), "{good}");
        }
        for bad in [
            "",
            "Node",
            "a/../b",
            "a b",
            "-a",
            "a.",
            "a..b",
            "n?x=1",
            &"a".repeat(64),
        ] {
            assert!(!is_node_name(bad), "{bad}");
            let e = patch_request("h", bad, "t", "{}").unwrap_err();
            assert!(e.to_string().contains("is not a node name"), "{e}");
        }
    }

    #[test]
    fn the_request_is_one_merge_patch_of_the_node() {
        let request = patch_request("10.96.0.1", "node-1", "tok", "{}").unwrap();
        let text = String::from_utf8(request).unwrap();
        assert!(text.starts_with("PATCH /api/v1/nodes/node-1 HTTP/1.1\r\nHost: 10.96.0.1\r\n"));
        assert!(text.contains("\r\nAuthorization: Bearer tok\r\n"));
        assert!(text.contains("\r\nContent-Type: application/merge-patch+json\r\n"));
        assert!(text.ends_with("\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"));
        let v6 = String::from_utf8(patch_request("fd00::1", "n", "t", "{}").unwrap()).unwrap();
        assert!(v6.contains("\r\nHost: [fd00::1]\r\n"));
    }

    #[test]
    fn answers_are_read_for_their_status_and_message() {
        let answer = b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n\r\n{\"kind\":\"Status\",\"message\":\"nodes \\\"n\\\" is forbidden\"}";
        let (status, body) = parse_answer(answer).unwrap();
        assert_eq!(status, 403);
        assert_eq!(brief(&body), "nodes \"n\" is forbidden");
        let chunked = "HTTP/1.1 422 X\r\nTransfer-Encoding: chunked\r\n\r\n1f\r\n{\"message\":\"bad\"}\r\n0\r\n\r\n";
        assert_eq!(brief(&parse_answer(chunked.as_bytes()).unwrap().1), "bad");
        assert_eq!(parse_answer(b"SSH-2.0-x\r\n"), None);
        assert_eq!(parse_answer(b""), None);
    }

    #[test]
    fn outside_a_pod_the_error_says_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("vmlet-node-label-{}", std::process::id()));
        let e = InCluster::new(|_| None, &dir).err().unwrap();
        assert!(
            e.to_string().contains("KUBERNETES_SERVICE_HOST is not set"),
            "{e}"
        );
        let env = |k: &str| (k == "KUBERNETES_SERVICE_HOST").then(|| "10.96.0.1".to_owned());
        let e = InCluster::new(env, &dir).err().unwrap();
        assert!(e.to_string().contains("token"), "{e}");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), "tok\n").unwrap();
        std::fs::write(dir.join("ca.crt"), "not a certificate").unwrap();
        let e = InCluster::new(env, &dir).err().unwrap();
        assert!(e.to_string().contains("holds no certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
