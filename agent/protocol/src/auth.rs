//! Every connection to the agent, on every port, proves first that it comes from the pod's
//! own shim, and the agent proves that it is that pod's agent.
//!
//! The shim makes a random [`AgentKey`] for each VM and hands it to the guest out of band:
//! QEMU's firmware configuration device (`-fw_cfg name=`[`FW_CFG_NAME`]`,file=...`, read by
//! the agent from sysfs), never on the kernel command line, which `/proc/PID/cmdline` shows
//! to every user of the node. Nothing else on the node has the key: not another pod's
//! shim, not a local user, not root without the shim's memory.
//!
//! The handshake, before any other byte of the connection (fixed-length text lines):
//!
//! 1. the agent, as it accepts: `VMLET1 <guest nonce>\n` ([`Hello`]);
//! 2. the host: `AUTH <host nonce> <host proof>\n` ([`Auth`]);
//! 3. the agent, when the proof is right: `OK <guest proof>\n` ([`Accept`]); otherwise it
//!    closes the connection, having read nothing past the proof.
//!
//! Each proof is HMAC-SHA256 under the key of its side's label, the guest port and both
//! nonces, so a proof answers one challenge on one port only, and a VM that does not have
//! the key (another pod's VM behind a reused CID) can neither pass nor fake the agent.
//! The guest's nonces come from the key and a counter (unique for the VM's life without an
//! entropy source early in boot); the host's are random.

use std::fmt;
use std::io;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes of an [`AgentKey`].
pub const KEY_LEN: usize = 32;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// The fw_cfg entry that carries the key into the guest.
pub const FW_CFG_NAME: &str = "opt/vmlet/agent-key";
/// Where the guest kernel shows that entry (`CONFIG_FW_CFG_SYSFS`).
pub const FW_CFG_SYSFS_PATH: &str = "/sys/firmware/qemu_fw_cfg/by_name/opt/vmlet/agent-key/raw";

const HELLO_TAG: &str = "VMLET1 ";
const AUTH_TAG: &str = "AUTH ";
const ACCEPT_TAG: &str = "OK ";
/// Length of the [`Hello`] line, newline included.
pub const HELLO_LEN: usize = HELLO_TAG.len() + 2 * NONCE_LEN + 1;
/// Length of the [`Auth`] line, newline included.
pub const AUTH_LEN: usize = AUTH_TAG.len() + 2 * NONCE_LEN + 1 + 2 * PROOF_LEN + 1;
/// Length of the [`Accept`] line, newline included.
pub const ACCEPT_LEN: usize = ACCEPT_TAG.len() + 2 * PROOF_LEN + 1;

pub type Nonce = [u8; NONCE_LEN];
pub type Proof = [u8; PROOF_LEN];

/// What went wrong in a handshake. Neither side says more to the peer than closing.
#[derive(Debug)]
pub enum AuthError {
    /// The agent closed the connection before its challenge: it did not take it (every
    /// handshake slot busy) or nothing serves the port. Worth another try.
    NoChallenge,
    /// The agent closed the connection after the shim's proof, without its own: a newer
    /// connection took its handshake's slot (a flood), or the proof was not its key's.
    ClosedAfterProof,
    /// The connection failed or closed before the handshake was done.
    Io(io::Error),
    /// A line that is not the handshake's (what, and why).
    Malformed(&'static str),
    /// A well-formed line whose proof is not the key's.
    WrongProof,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::NoChallenge => write!(
                f,
                "the agent closed the connection before its challenge (busy, or not listening)"
            ),
            AuthError::ClosedAfterProof => write!(
                f,
                "the agent closed the connection after the shim's proof (its handshake slot taken by a newer connection, or another key)"
            ),
            AuthError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                write!(f, "the peer closed the connection during the handshake")
            }
            AuthError::Io(e) => write!(f, "handshake: {e}"),
            AuthError::Malformed(what) => write!(f, "not a vmlet handshake: {what}"),
            AuthError::WrongProof => write!(f, "the proof is not this VM's key's"),
        }
    }
}

impl std::error::Error for AuthError {}

impl From<io::Error> for AuthError {
    fn from(e: io::Error) -> Self {
        AuthError::Io(e)
    }
}

/// One VM's secret, shared by its shim and its agent only.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentKey([u8; KEY_LEN]);

impl fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    /// The key in `bytes`, which must be exactly [`KEY_LEN`] long.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AuthError> {
        bytes
            .try_into()
            .map(AgentKey)
            .map_err(|_| AuthError::Malformed("a key is 32 bytes"))
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The guest's `counter`th nonce: unpredictable without the key, never repeated for
    /// one key.
    pub fn guest_nonce(&self, counter: u64) -> Nonce {
        let mac = hmac_sha256(&self.0, &[b"vmlet guest nonce\0", &counter.to_be_bytes()]);
        let mut nonce = [0; NONCE_LEN];
        nonce.copy_from_slice(&mac[..NONCE_LEN]);
        nonce
    }

    fn proof(&self, side: &[u8], port: u32, guest: &Nonce, host: &Nonce) -> Proof {
        hmac_sha256(&self.0, &[side, &port.to_be_bytes(), guest, host])
    }

    /// The shim's proof for guest `port`.
    pub fn host_proof(&self, port: u32, guest: &Nonce, host: &Nonce) -> Proof {
        self.proof(b"vmlet host\0", port, guest, host)
    }

    /// The agent's proof for guest `port`.
    pub fn guest_proof(&self, port: u32, guest: &Nonce, host: &Nonce) -> Proof {
        self.proof(b"vmlet guest\0", port, guest, host)
    }
}

/// HMAC-SHA256 (RFC 2104, RustCrypto's `hmac`) of the concatenated `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Proof {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Compares in time that does not depend on where the inputs differ (`subtle`).
fn same(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case hex of exactly `N` bytes.
fn unhex<const N: usize>(text: &[u8], what: &'static str) -> Result<[u8; N], AuthError> {
    if text.len() != 2 * N {
        return Err(AuthError::Malformed(what));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(AuthError::Malformed(what)),
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(out)
}

/// The body of `line` between `tag` and its newline.
fn body<'a>(line: &'a [u8], tag: &str, what: &'static str) -> Result<&'a [u8], AuthError> {
    line.strip_prefix(tag.as_bytes())
        .and_then(|rest| rest.strip_suffix(b"\n"))
        .ok_or(AuthError::Malformed(what))
}

/// The agent's challenge: `VMLET1 <nonce>\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub nonce: Nonce,
}

impl Hello {
    pub fn to_line(&self) -> String {
        format!("{HELLO_TAG}{}\n", hex(&self.nonce))
    }

    pub fn parse(line: &[u8]) -> Result<Self, AuthError> {
        let nonce = body(line, HELLO_TAG, "the agent's hello")?;
        Ok(Hello {
            nonce: unhex(nonce, "the agent's nonce")?,
        })
    }
}

/// The shim's answer: `AUTH <nonce> <proof>\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auth {
    pub nonce: Nonce,
    pub proof: Proof,
}

impl Auth {
    pub fn to_line(&self) -> String {
        format!("{AUTH_TAG}{} {}\n", hex(&self.nonce), hex(&self.proof))
    }

    pub fn parse(line: &[u8]) -> Result<Self, AuthError> {
        let body = body(line, AUTH_TAG, "the host's proof")?;
        let (nonce, proof) = body.split_at(body.len().min(2 * NONCE_LEN));
        let proof = proof
            .strip_prefix(b" ")
            .ok_or(AuthError::Malformed("the host's proof"))?;
        Ok(Auth {
            nonce: unhex(nonce, "the host's nonce")?,
            proof: unhex(proof, "the host's proof")?,
        })
    }
}

/// The agent's proof: `OK <proof>\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    pub proof: Proof,
}

impl Accept {
    pub fn to_line(&self) -> String {
        format!("{ACCEPT_TAG}{}\n", hex(&self.proof))
    }

    pub fn parse(line: &[u8]) -> Result<Self, AuthError> {
        let proof = body(line, ACCEPT_TAG, "the agent's proof")?;
        Ok(Accept {
            proof: unhex(proof, "the agent's proof")?,
        })
    }
}

/// The agent's side, on a connection it accepted on `port`: challenges with `nonce` (see
/// [`AgentKey::guest_nonce`]), reads exactly one [`Auth`] line and nothing after it, and
/// answers only a proof made with `key`. The caller bounds the time and closes the
/// connection on an error.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &AgentKey,
    port: u32,
    nonce: Nonce,
) -> Result<(), AuthError> {
    stream
        .write_all(Hello { nonce }.to_line().as_bytes())
        .await?;
    let mut line = [0u8; AUTH_LEN];
    stream.read_exact(&mut line).await?;
    let auth = Auth::parse(&line)?;
    if !same(&auth.proof, &key.host_proof(port, &nonce, &auth.nonce)) {
        return Err(AuthError::WrongProof);
    }
    let proof = key.guest_proof(port, &nonce, &auth.nonce);
    stream
        .write_all(Accept { proof }.to_line().as_bytes())
        .await?;
    Ok(())
}

/// Whether `e` says the peer closed the connection.
fn closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
    )
}

/// The shim's side, on a connection it made to guest `port`: answers the agent's challenge
/// with `nonce` (random) and checks the agent's proof. Reads nothing past the handshake.
/// The caller bounds the time.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &AgentKey,
    port: u32,
    nonce: Nonce,
) -> Result<(), AuthError> {
    let mut hello = [0u8; HELLO_LEN];
    match stream.read_exact(&mut hello).await {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(AuthError::NoChallenge),
        other => other?,
    };
    let hello = Hello::parse(&hello)?;
    let proof = key.host_proof(port, &hello.nonce, &nonce);
    stream
        .write_all(Auth { nonce, proof }.to_line().as_bytes())
        .await?;
    let mut accept = [0u8; ACCEPT_LEN];
    match stream.read_exact(&mut accept).await {
        Err(e) if closed(&e) => return Err(AuthError::ClosedAfterProof),
        other => other?,
    };
    let accept = Accept::parse(&accept)?;
    if !same(&accept.proof, &key.guest_proof(port, &hello.nonce, &nonce)) {
        return Err(AuthError::WrongProof);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    fn key(byte: u8) -> AgentKey {
        AgentKey([byte; KEY_LEN])
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 1: key 0x0b x 20, "Hi There".
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], &[b"Hi ", b"There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
    }

    #[test]
    fn lines_have_their_fixed_lengths_and_round_trip() {
        let hello = Hello { nonce: [7; 16] };
        assert_eq!(hello.to_line().len(), HELLO_LEN);
        assert_eq!(Hello::parse(hello.to_line().as_bytes()).unwrap(), hello);
        let auth = Auth {
            nonce: [1; 16],
            proof: [0xab; 32],
        };
        assert_eq!(auth.to_line().len(), AUTH_LEN);
        assert_eq!(Auth::parse(auth.to_line().as_bytes()).unwrap(), auth);
        let accept = Accept { proof: [0xfe; 32] };
        assert_eq!(accept.to_line().len(), ACCEPT_LEN);
        assert_eq!(Accept::parse(accept.to_line().as_bytes()).unwrap(), accept);
    }

    #[test]
    fn malformed_lines_are_refused() {
        let good = Auth {
            nonce: [1; 16],
            proof: [0xab; 32],
        }
        .to_line();
        for bad in [
            good.replace("AUTH", "auth"),
            good.replace('\n', " "),
            good.replace("ab", "AB"),
            good.replacen(' ', "", 2),
            format!("{}x\n", good.trim_end()),
            "FORWARD 8080\n".into(),
            String::new(),
        ] {
            assert!(Auth::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(Hello::parse(b"VMLET1 zz\n").is_err());
        assert!(Accept::parse(b"OK \n").is_err());
    }

    #[test]
    fn proofs_depend_on_key_side_port_and_nonces() {
        let (k, g, h) = (key(1), [2; 16], [3; 16]);
        let p = k.host_proof(1024, &g, &h);
        assert_ne!(p, key(9).host_proof(1024, &g, &h));
        assert_ne!(p, k.guest_proof(1024, &g, &h));
        assert_ne!(p, k.host_proof(1025, &g, &h));
        assert_ne!(p, k.host_proof(1024, &[4; 16], &h));
        assert_ne!(p, k.host_proof(1024, &g, &[4; 16]));
        assert_ne!(k.guest_nonce(0), k.guest_nonce(1));
        assert_ne!(k.guest_nonce(0), key(9).guest_nonce(0));
        assert_eq!(format!("{k:?}"), "AgentKey(..)", "the key is never printed");
    }

    #[tokio::test]
    async fn the_shim_and_its_agent_agree_and_the_payload_follows() {
        let (mut host, mut guest) = duplex(1024);
        let k = key(5);
        let agent = {
            let k = k.clone();
            tokio::spawn(async move {
                accept(&mut guest, &k, 1026, k.guest_nonce(0))
                    .await
                    .unwrap();
                let mut rest = [0u8; 13];
                guest.read_exact(&mut rest).await.unwrap();
                rest
            })
        };
        connect(&mut host, &k, 1026, [9; 16]).await.unwrap();
        host.write_all(b"FORWARD 8080\n").await.unwrap();
        assert_eq!(&agent.await.unwrap(), b"FORWARD 8080\n");
    }

    #[tokio::test]
    async fn a_wrong_key_gets_nothing_on_either_side() {
        let (mut host, mut guest) = duplex(1024);
        let agent = tokio::spawn(async move {
            let result = accept(&mut guest, &key(5), 1024, [0; 16]).await;
            drop(guest);
            result
        });
        let host_side = connect(&mut host, &key(6), 1024, [9; 16]).await;
        assert!(matches!(agent.await.unwrap(), Err(AuthError::WrongProof)));
        // The agent closed without a proof of its own.
        assert!(
            matches!(host_side, Err(AuthError::ClosedAfterProof)),
            "{host_side:?}"
        );
    }

    #[tokio::test]
    async fn a_connection_closed_before_the_challenge_says_so() {
        let (mut host, guest) = duplex(1024);
        drop(guest);
        let result = connect(&mut host, &key(5), 1024, [9; 16]).await;
        assert!(matches!(result, Err(AuthError::NoChallenge)), "{result:?}");
    }

    #[tokio::test]
    async fn an_agent_without_the_key_is_not_taken_for_the_pods() {
        let (mut host, mut impostor) = duplex(1024);
        tokio::spawn(async move {
            impostor
                .write_all(Hello { nonce: [1; 16] }.to_line().as_bytes())
                .await
                .unwrap();
            let mut auth = [0u8; AUTH_LEN];
            impostor.read_exact(&mut auth).await.unwrap();
            // Accepts whatever the host says, with a proof it cannot make.
            let fake = Accept { proof: [0; 32] }.to_line();
            impostor.write_all(fake.as_bytes()).await.unwrap();
            impostor
        });
        let result = connect(&mut host, &key(5), 1026, [9; 16]).await;
        assert!(matches!(result, Err(AuthError::WrongProof)), "{result:?}");
    }

    #[tokio::test]
    async fn a_request_without_a_proof_is_not_read_past_the_proof() {
        let (mut host, mut guest) = duplex(4096);
        // A ttrpc client, or a port-forward request, written straight away: the agent
        // reads the proof's length of it and refuses.
        let mut request = b"FORWARD 8080\n".repeat(20);
        request.extend_from_slice(b"the rest");
        host.write_all(&request).await.unwrap();
        let result = accept(&mut guest, &key(5), 1026, [0; 16]).await;
        assert!(matches!(result, Err(AuthError::Malformed(_))), "{result:?}");
        let mut left = vec![0u8; request.len() - AUTH_LEN];
        guest.read_exact(&mut left).await.unwrap();
        assert_eq!(&left[..], &request[AUTH_LEN..]);
    }
}
