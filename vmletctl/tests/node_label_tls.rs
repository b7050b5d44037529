//! The node label over real TLS and HTTP: `InCluster` against a stand-in API server
//! (`integration/fake-apiserver`: Python's HTTPS server with a CA-signed certificate made by
//! openssl, one token, merge patches applied as the real server applies them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use vmletctl::node_label::{InCluster, NodeApi, LABEL, LABEL_VALUE};

const TOKEN: &str = "vmlet-test-token";

struct ApiServer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../integration/fake-apiserver")
        .join(name)
}

fn api_server(name: &str) -> ApiServer {
    let dir = std::env::temp_dir().join(format!("vmlet-apiserver-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let status = Command::new(tool("make-certs"))
        .arg(&dir)
        .status()
        .expect("run make-certs (openssl)");
    assert!(status.success(), "make-certs: {status}");
    let child = Command::new("/usr/bin/python3")
        .arg(tool("fake-apiserver.py"))
        .args([dir.join("server.crt"), dir.join("server.key")])
        .arg(TOKEN)
        .arg(&dir)
        .args(["node-1", "node-2"])
        .spawn()
        .expect("run /usr/bin/python3");
    let mut server = ApiServer {
        child,
        dir,
        port: 0,
    };
    let start = Instant::now();
    while server.port == 0 {
        match std::fs::read_to_string(server.dir.join("port")) {
            Ok(port) => server.port = port.trim().parse().unwrap(),
            Err(_) if start.elapsed() < Duration::from_secs(20) => {
                assert!(
                    server.child.try_wait().unwrap().is_none(),
                    "the stand-in API server exited"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the stand-in API server did not start: {e}"),
        }
    }
    server
}

/// A service account directory with `token` and the CA `ca`.
fn account(server: &ApiServer, token: &str, ca: &str) -> PathBuf {
    let dir = server.dir.join(format!("account-{ca}-{}", token.len()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), format!("{token}\n")).unwrap();
    std::fs::copy(server.dir.join(ca), dir.join("ca.crt")).unwrap();
    dir
}

fn client(server: &ApiServer, host: &str, account: &Path) -> InCluster {
    let port = server.port.to_string();
    let host = host.to_owned();
    InCluster::new(
        move |k| match k {
            "KUBERNETES_SERVICE_HOST" => Some(host.clone()),
            "KUBERNETES_SERVICE_PORT" => Some(port.clone()),
            _ => None,
        },
        account,
    )
    .unwrap()
}

fn labels(server: &ApiServer) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(server.dir.join("labels.json")).unwrap()).unwrap()
}

#[test]
fn the_label_is_set_and_removed_with_the_service_account() {
    let server = api_server("label");
    let api = client(&server, "127.0.0.1", &account(&server, TOKEN, "ca.crt"));
    api.label("node-1", LABEL, Some(LABEL_VALUE)).unwrap();
    assert_eq!(
        labels(&server)["node-1"],
        serde_json::json!({ LABEL: LABEL_VALUE })
    );
    assert_eq!(labels(&server)["node-2"], serde_json::json!({}));
    // Twice is the same.
    api.label("node-1", LABEL, Some(LABEL_VALUE)).unwrap();
    api.label("node-1", LABEL, None).unwrap();
    assert_eq!(labels(&server)["node-1"], serde_json::json!({}));
    // By name too (the certificate names localhost).
    client(&server, "localhost", &account(&server, TOKEN, "ca.crt"))
        .label("node-2", LABEL, Some(LABEL_VALUE))
        .unwrap();
    assert_eq!(
        labels(&server)["node-2"],
        serde_json::json!({ LABEL: LABEL_VALUE })
    );
}

#[test]
fn refusals_name_what_was_wrong() {
    let server = api_server("refusals");
    let api = client(&server, "127.0.0.1", &account(&server, TOKEN, "ca.crt"));
    let e = api.label("node-9", LABEL, Some(LABEL_VALUE)).unwrap_err();
    assert!(e.to_string().contains("node node-9 not found"), "{e}");

    let wrong = client(
        &server,
        "127.0.0.1",
        &account(&server, "another-token", "ca.crt"),
    );
    let e = wrong.label("node-1", LABEL, Some(LABEL_VALUE)).unwrap_err();
    assert!(
        e.to_string().contains("(401)") && e.to_string().contains("get and patch on nodes"),
        "{e}"
    );

    // An API server whose certificate the account's CA did not sign gets no token.
    let before = std::fs::read_to_string(server.dir.join("requests.log")).unwrap();
    let spoofed = client(
        &server,
        "127.0.0.1",
        &account(&server, TOKEN, "other-ca.crt"),
    );
    let e = spoofed
        .label("node-1", LABEL, Some(LABEL_VALUE))
        .unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
    let after = std::fs::read_to_string(server.dir.join("requests.log")).unwrap();
    assert_eq!(
        before, after,
        "a request reached a server the CA does not vouch for"
    );
    assert_eq!(labels(&server)["node-1"], serde_json::json!({}));
}
