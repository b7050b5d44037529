//! A VM-mode pod's cloud-init seed: the NoCloud data source's files (`meta-data`,
//! `user-data`, `network-config`) on an ISO 9660 volume labelled `cidata`, which cloud-init
//! finds on any block device; or, with `VirtletCloudInitImageType: configdrive`, OpenStack's
//! config drive (`openstack/latest/meta_data.json`, `user_data`, `network_data.json` on a
//! volume labelled `config-2`), as Virtlet makes them.
//!
//! - `meta-data`: `instance-id` (the pod's UID, so a new pod is a new instance) and
//!   `local-hostname` (the pod's host name), with the pod's `VirtletCloudInitMetaData`
//!   keys set over them (on a config drive, both also as `uuid` and `hostname`);
//! - `user-data`: the pod's `vmlet.io/cloud-init-user-data`, with the keys of
//!   `vmlet.io/ssh-keys` appended to its `ssh_authorized_keys` and the container spec's
//!   environment written to `/etc/cloud/environment` (one `NAME=value` line each), as
//!   Virtlet does;
//! - `network-config` (version 2): each pod interface matched by its MAC, with the
//!   addresses, routes and MTU CNI gave it and the pod's DNS servers and search domains
//!   (on a config drive, `network_data.json`: links, networks and DNS servers; OpenStack's
//!   format has no search domains).
//!
//! A `VirtletCloudInitUserDataScript` is the user-data as written (Virtlet's
//! `@virtlet-mount-script@` in it becomes a comment: vmlet has no volumes to mount), beside
//! vmlet's part when there is one; `VirtletCloudInitUserDataOverwrite: "true"` makes the
//! pod's keys replace vmlet's instead of being merged with them.
//!
//! vmlet's files and parts are JSON (which YAML reads) built from typed values, never
//! pasted together, so no annotation can add a key the seed did not mean to have, and
//! every string stays a string under cloud-init's YAML 1.1 (a MAC address unquoted would
//! read as a base-60 number). The pod's own user-data goes in as written, as one part of a
//! MIME multipart beside vmlet's (cloud-init merges them).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};
use vmlet_config::SeedSource;
use vmlet_netns::{Interface, IpNet};

use super::pod_dns::Dns;
use crate::host::host_command;
use crate::Error;

/// The seed volume's label, which cloud-init's NoCloud source looks for.
pub const VOLUME_LABEL: &str = "cidata";
/// A config drive's label, which cloud-init's ConfigDrive source looks for.
pub const CONFIG_DRIVE_LABEL: &str = "config-2";
/// Where a config drive's files are.
const CONFIG_DRIVE_DIR: &str = "openstack/latest";
/// What Virtlet replaced with its volume-mounting commands in a user-data script.
const VIRTLET_MOUNT_SCRIPT: &str = "@virtlet-mount-script@";
/// Where the container spec's environment is written in the guest (Virtlet's path).
pub const ENVIRONMENT_FILE: &str = "/etc/cloud/environment";
/// How long `xorrisofs` may take.
const XORRISOFS_DEADLINE: Duration = Duration::from_secs(30);
/// What a seed is made of.
#[derive(Debug, Clone, Copy)]
pub struct SeedInput<'a> {
    pub instance_id: &'a str,
    pub hostname: &'a str,
    /// `vmlet.io/cloud-init-user-data` (a YAML mapping, checked by the config crate).
    pub user_data: Option<&'a str>,
    /// `VirtletCloudInitUserDataScript`: the whole user-data, not a cloud-config.
    pub user_data_script: Option<&'a str>,
    /// `VirtletCloudInitUserDataOverwrite`: the pod's keys replace vmlet's.
    pub overwrite: bool,
    /// `VirtletCloudInitMetaData`: keys over vmlet's meta-data (a JSON object's text,
    /// checked by the config crate).
    pub meta_data: Option<&'a str>,
    /// NoCloud or a config drive.
    pub source: SeedSource,
    pub ssh_keys: &'a [String],
    /// The container spec's environment (`NAME=value`).
    pub env: &'a [String],
    pub interfaces: &'a [Interface],
    pub dns: &'a Dns,
    /// Whether the seed has a `network-config` (without it, cloud-init falls back to DHCP
    /// on the first interface).
    pub network_config: bool,
    /// The container's filesystem volumes, mounted by vmlet's `bootcmd`.
    pub volumes: &'a [crate::vm_mode::volumes::GuestVolume],
}

/// The seed's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub source: SeedSource,
    pub meta_data: String,
    pub user_data: String,
    pub network_config: Option<String>,
}

/// The boundary between user-data's parts; a user-data that contains it is refused.
const BOUNDARY: &str = "==vmlet-nocloud-boundary==";
/// How cloud-init merges vmlet's part into the pod's: lists are appended to, mappings merged.
const MERGE_TYPE: &str = "list(append)+dict(recurse_array)+str()";

fn bad_user_data(what: &str) -> Error {
    Error::InvalidArgument(format!("vmlet.io/cloud-init-user-data: {what}"))
}

impl Seed {
    /// Builds the seed's files; a user-data that holds the MIME boundary vmlet uses is an
    /// error that says so.
    pub fn build(input: &SeedInput) -> Result<Seed, Error> {
        let mut meta = json!({
            "instance-id": input.instance_id,
            "local-hostname": input.hostname,
        });
        if let Some(theirs) = input.meta_data {
            let Ok(Value::Object(theirs)) = serde_json::from_str::<Value>(theirs) else {
                return Err(Error::Internal(
                    "the pod's cloud-init meta-data is not a JSON object".into(),
                ));
            };
            if let Value::Object(meta) = &mut meta {
                meta.extend(theirs);
            }
        }
        if let (SeedSource::ConfigDrive, Value::Object(meta)) = (input.source, &mut meta) {
            // cloud-init's ConfigDrive takes the instance from `uuid` and the host name
            // from `hostname`: the pod's own, else its instance-id and local-hostname.
            for (key, from) in [("uuid", "instance-id"), ("hostname", "local-hostname")] {
                if !meta.contains_key(key) {
                    let value = meta[from].clone();
                    meta.insert(key.into(), value);
                }
            }
        }
        let network = match input.source {
            SeedSource::NoCloud => network_config(input.interfaces, input.dns),
            SeedSource::ConfigDrive => network_data(input.interfaces, input.dns),
        };
        Ok(Seed {
            source: input.source,
            meta_data: meta.to_string(),
            user_data: user_data(input)?,
            network_config: input.network_config.then_some(network),
        })
    }

    /// Writes the files into `dir` (a directory of the shim's own, which must not hold
    /// them yet) and makes the ISO 9660 volume `iso` of them with `xorrisofs`.
    pub async fn write_iso(&self, dir: &Path, iso: &Path) -> Result<(), Error> {
        let (label, files) = match self.source {
            SeedSource::NoCloud => (
                VOLUME_LABEL,
                [
                    ("meta-data", Some(&self.meta_data)),
                    ("user-data", Some(&self.user_data)),
                    ("network-config", self.network_config.as_ref()),
                ],
            ),
            SeedSource::ConfigDrive => {
                let mut path = dir.to_path_buf();
                for part in CONFIG_DRIVE_DIR.split('/') {
                    path.push(part);
                    std::fs::create_dir(&path)
                        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
                }
                (
                    CONFIG_DRIVE_LABEL,
                    [
                        ("openstack/latest/meta_data.json", Some(&self.meta_data)),
                        ("openstack/latest/user_data", Some(&self.user_data)),
                        (
                            "openstack/latest/network_data.json",
                            self.network_config.as_ref(),
                        ),
                    ],
                )
            }
        };
        for (name, content) in files {
            let Some(content) = content else { continue };
            let path = dir.join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, content.as_bytes()))
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        }
        let args = [
            "-quiet".as_ref(),
            "-volid".as_ref(),
            label.as_ref(),
            "-joliet".as_ref(),
            "-rock".as_ref(),
            "-output".as_ref(),
            iso.as_os_str(),
            dir.as_os_str(),
        ];
        let what = format!("{} (the cloud-init seed)", iso.display());
        host_command::run_tool("xorrisofs", &args, XORRISOFS_DEADLINE, &what).await
    }
}

/// vmlet's own cloud-config: the SSH keys, the environment file and the volumes' mounts.
fn vmlet_part(input: &SeedInput) -> Option<Value> {
    let mut part = Map::new();
    if let Some(script) = crate::vm_mode::volumes::mount_script(input.volumes) {
        part.insert("bootcmd".into(), json!([["sh", "-c", script]]));
    }
    if !input.ssh_keys.is_empty() {
        part.insert("ssh_authorized_keys".into(), json!(input.ssh_keys));
    }
    if !input.env.is_empty() {
        let mut content = String::new();
        for var in input.env {
            // One line per variable: a newline in a value is written as `\n`.
            content.push_str(&var.replace('\n', "\\n"));
            content.push('\n');
        }
        part.insert(
            "write_files".into(),
            json!([{"path": ENVIRONMENT_FILE, "content": content, "permissions": "0644"}]),
        );
    }
    (!part.is_empty()).then_some(Value::Object(part))
}

/// The pod's user-data as it was written (cloud-init reads it as YAML 1.1, which vmlet
/// does not re-serialize), and vmlet's part beside it in a MIME multipart: after the pod's,
/// with a merge type that appends vmlet's keys and files to the pod's own lists; with
/// overwrite, before the pod's, whose keys then replace vmlet's (cloud-init's default).
fn user_data(input: &SeedInput) -> Result<String, Error> {
    let ours = vmlet_part(input);
    let theirs = match (input.user_data, input.user_data_script) {
        (Some(text), _) if text.starts_with("#cloud-config") => Some(text.to_owned()),
        (Some(text), _) => Some(format!("#cloud-config\n{text}")),
        (None, Some(script)) => Some(script.replace(
            VIRTLET_MOUNT_SCRIPT,
            "# vmlet: volumes are mounted at boot (bootcmd); block volumes are under /dev/disk/by-id/",
        )),
        (None, None) => None,
    };
    match (theirs, ours) {
        (None, None) => Ok("#cloud-config\n{}\n".into()),
        (None, Some(ours)) => Ok(format!("#cloud-config\n{ours}\n")),
        (Some(theirs), None) => Ok(theirs),
        (Some(theirs), Some(ours)) => {
            if theirs.contains(BOUNDARY) {
                return Err(bad_user_data(&format!(
                    "contains {BOUNDARY}, the boundary vmlet puts between its parts"
                )));
            }
            let kind = content_type(&theirs)?;
            let theirs =
                format!("--{BOUNDARY}\nContent-Type: {kind}; charset=\"utf-8\"\n\n{theirs}\n");
            let ours = |merge: &str| {
                format!(
                    "--{BOUNDARY}\nContent-Type: text/cloud-config; charset=\"utf-8\"\n{merge}\n\
                     #cloud-config\n{ours}\n"
                )
            };
            let parts = if input.overwrite {
                format!("{}{theirs}", ours(""))
            } else {
                format!("{theirs}{}", ours(&format!("Merge-Type: {MERGE_TYPE}\n")))
            };
            Ok(format!(
                "Content-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\nMIME-Version: 1.0\n\n\
                 {parts}--{BOUNDARY}--\n"
            ))
        }
    }
}

/// The MIME type of a user-data that goes beside vmlet's part, from its first line as
/// cloud-init tells them apart (the config crate refused a script that says no kind).
fn content_type(user_data: &str) -> Result<&'static str, Error> {
    vmlet_config::user_data_kind(user_data).ok_or_else(|| {
        Error::InvalidArgument(
            "VirtletCloudInitUserDataScript: its first line says no kind cloud-init knows".into(),
        )
    })
}

fn cidr(net: &IpNet) -> String {
    format!("{}/{}", net.addr, net.prefix)
}

/// Version 2 network config, as JSON (which YAML reads): every value a quoted string or a
/// number, so no MAC address reads as a YAML 1.1 base-60 integer.
fn network_config(interfaces: &[Interface], dns: &Dns) -> String {
    let mut ethernets = Map::new();
    for iface in interfaces {
        let addresses: Vec<String> = iface
            .addresses
            .iter()
            .filter(|a| !vmlet_netns::is_link_local(&a.addr))
            .map(cidr)
            .collect();
        // The default routes as gateway4 / gateway6 (which every renderer applies;
        // ifupdown's needs no net-tools for them), other routes through a gateway as
        // routes; the kernel makes the on-link ones from the addresses.
        let mut gateways = Map::new();
        let mut routes = Vec::new();
        for route in &iface.routes {
            let Some(via) = route.gateway else { continue };
            match &route.destination {
                None if via.is_ipv4() => {
                    gateways.insert("gateway4".into(), json!(via.to_string()));
                }
                None => {
                    gateways.insert("gateway6".into(), json!(via.to_string()));
                }
                Some(net) => routes.push(json!({"to": cidr(net), "via": via.to_string()})),
            }
        }
        let mut eth = json!({
            "match": {"macaddress": iface.mac_string()},
            "set-name": iface.name,
            "mtu": iface.mtu,
            "addresses": addresses,
        });
        if let Value::Object(eth) = &mut eth {
            eth.extend(gateways);
        }
        if !routes.is_empty() {
            eth["routes"] = Value::Array(routes);
        }
        if !dns.nameservers.is_empty() || !dns.search.is_empty() {
            let servers: Vec<String> = dns.nameservers.iter().map(|a| a.to_string()).collect();
            eth["nameservers"] = json!({"addresses": servers, "search": dns.search});
        }
        ethernets.insert(iface.name.clone(), eth);
    }
    json!({"version": 2, "ethernets": ethernets}).to_string()
}

/// The netmask of a prefix, as OpenStack's network data writes it.
fn netmask(addr: &IpAddr, prefix: u8) -> String {
    match addr {
        IpAddr::V4(_) => {
            let bits = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            std::net::Ipv4Addr::from(bits).to_string()
        }
        IpAddr::V6(_) => {
            let bits = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            std::net::Ipv6Addr::from(bits).to_string()
        }
    }
}

/// A config drive's `network_data.json`: each pod interface a link (by MAC, with its MTU),
/// each of its addresses a network with the routes of its family, the DNS servers as
/// services.
fn network_data(interfaces: &[Interface], dns: &Dns) -> String {
    let mut links = Vec::new();
    let mut networks = Vec::new();
    for iface in interfaces {
        links.push(json!({
            "id": iface.name,
            "type": "phy",
            "ethernet_mac_address": iface.mac_string(),
            "mtu": iface.mtu,
        }));
        let addresses = iface
            .addresses
            .iter()
            .filter(|a| !vmlet_netns::is_link_local(&a.addr));
        for (n, address) in addresses.enumerate() {
            let v4 = address.addr.is_ipv4();
            let routes: Vec<Value> = iface
                .routes
                .iter()
                .filter_map(|route| {
                    let via = route.gateway.filter(|g| g.is_ipv4() == v4)?;
                    let (network, mask) = match &route.destination {
                        None if v4 => ("0.0.0.0".to_owned(), "0.0.0.0".to_owned()),
                        None => ("::".to_owned(), "::".to_owned()),
                        Some(net) => (net.addr.to_string(), netmask(&net.addr, net.prefix)),
                    };
                    Some(json!({"network": network, "netmask": mask, "gateway": via.to_string()}))
                })
                .collect();
            networks.push(json!({
                "id": format!("{}-{n}", iface.name),
                "type": if v4 { "ipv4" } else { "ipv6" },
                "link": iface.name,
                "ip_address": address.addr.to_string(),
                "netmask": netmask(&address.addr, address.prefix),
                "routes": routes,
            }));
        }
    }
    let services: Vec<Value> = dns
        .nameservers
        .iter()
        .map(|a| json!({"type": "dns", "address": a.to_string()}))
        .collect();
    json!({"links": links, "networks": networks, "services": services}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmlet_netns::Route;

    fn pod_interface() -> Interface {
        Interface {
            name: "eth0".into(),
            index: 2,
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
            mtu: 1450,
            addresses: vec![
                IpNet {
                    addr: "10.88.0.5".parse().unwrap(),
                    prefix: 16,
                },
                IpNet {
                    addr: "fe80::1".parse().unwrap(),
                    prefix: 64,
                },
            ],
            routes: vec![
                Route {
                    destination: None,
                    gateway: Some("10.88.0.1".parse().unwrap()),
                },
                Route {
                    destination: Some(IpNet {
                        addr: "10.88.0.0".parse().unwrap(),
                        prefix: 16,
                    }),
                    gateway: None,
                },
                Route {
                    destination: Some(IpNet {
                        addr: "10.99.0.0".parse().unwrap(),
                        prefix: 16,
                    }),
                    gateway: Some("10.88.0.254".parse().unwrap()),
                },
            ],
        }
    }

    fn input<'a>(
        user_data: Option<&'a str>,
        ssh_keys: &'a [String],
        env: &'a [String],
        interfaces: &'a [Interface],
        dns: &'a Dns,
    ) -> SeedInput<'a> {
        SeedInput {
            instance_id: "0c5d-uid",
            hostname: "web-0",
            user_data,
            user_data_script: None,
            overwrite: false,
            meta_data: None,
            source: SeedSource::NoCloud,
            ssh_keys,
            env,
            interfaces,
            dns,
            network_config: true,
            volumes: &[],
        }
    }

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    /// vmlet's part of a user-data (its last `#cloud-config` document).
    fn our_part(user_data: &str) -> Value {
        let json = user_data.rsplit("#cloud-config\n").next().unwrap();
        let json = json.split(&format!("\n--{BOUNDARY}--")).next().unwrap();
        parse(json)
    }

    #[test]
    fn meta_data_names_the_instance_and_host() {
        let dns = Dns::default();
        let seed = Seed::build(&input(None, &[], &[], &[], &dns)).unwrap();
        let meta = parse(&seed.meta_data);
        assert_eq!(meta["instance-id"], "0c5d-uid");
        assert_eq!(meta["local-hostname"], "web-0");
        assert_eq!(seed.user_data, "#cloud-config\n{}\n");
    }

    #[test]
    fn user_data_is_kept_as_written_beside_the_keys_and_the_environment() {
        let dns = Dns::default();
        let keys = vec!["ssh-ed25519 AAAAC3Nza new".to_owned()];
        let env = vec!["PATH=/usr/bin".to_owned(), "TWO=a\nb".to_owned()];
        let user = "ssh_pwauth: yes\nruncmd:\n  - echo hi\n";
        let seed = Seed::build(&input(Some(user), &keys, &env, &[], &dns)).unwrap();
        assert!(seed.user_data.starts_with("Content-Type: multipart/mixed"));
        assert!(seed.user_data.contains(&format!("#cloud-config\n{user}\n")));
        assert!(seed
            .user_data
            .contains(&format!("Merge-Type: {MERGE_TYPE}")));
        let ours = our_part(&seed.user_data);
        assert_eq!(
            ours["ssh_authorized_keys"],
            json!(["ssh-ed25519 AAAAC3Nza new"])
        );
        assert_eq!(ours["write_files"][0]["path"], ENVIRONMENT_FILE);
        assert_eq!(
            ours["write_files"][0]["content"],
            "PATH=/usr/bin\nTWO=a\\nb\n"
        );
        assert_eq!(ours["write_files"][0]["permissions"], "0644");

        // Alone, either part is the whole user-data.
        let seed = Seed::build(&input(Some(user), &[], &[], &[], &dns)).unwrap();
        assert_eq!(seed.user_data, format!("#cloud-config\n{user}"));
        let seed = Seed::build(&input(None, &keys, &[], &[], &dns)).unwrap();
        assert_eq!(
            our_part(&seed.user_data)["ssh_authorized_keys"][0],
            "ssh-ed25519 AAAAC3Nza new"
        );
    }

    #[test]
    fn the_volumes_are_mounted_by_vmlets_bootcmd() {
        let dns = Dns::default();
        let volumes = [crate::vm_mode::volumes::GuestVolume {
            destination: "/etc/app".into(),
            readonly: true,
            source: crate::vm_mode::volumes::VolumeSource::Shared {
                path: "1".into(),
                file: false,
            },
        }];
        let mut with_volumes = input(Some("runcmd: [true]"), &[], &[], &[], &dns);
        with_volumes.volumes = &volumes;
        let ours = our_part(&Seed::build(&with_volumes).unwrap().user_data);
        let bootcmd = &ours["bootcmd"][0];
        assert_eq!(bootcmd[0], "sh");
        assert_eq!(bootcmd[1], "-c");
        assert!(
            bootcmd[2]
                .as_str()
                .unwrap()
                .contains("mount --bind '/run/vmlet/volumes/1' '/etc/app'"),
            "{bootcmd}"
        );
    }

    #[test]
    fn user_data_holding_the_boundary_is_refused_by_name() {
        let dns = Dns::default();
        let keys = vec!["ssh-ed25519 AAAA k".to_owned()];
        let user = format!("runcmd: ['echo --{BOUNDARY}']");
        let err = Seed::build(&input(Some(&user), &keys, &[], &[], &dns))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("vmlet.io/cloud-init-user-data: contains"),
            "{err}"
        );
    }

    #[test]
    fn an_annotation_cannot_add_keys_to_meta_data() {
        let dns = Dns::default();
        let mut seed_input = input(None, &[], &[], &[], &dns);
        seed_input.hostname = "x\ninstance-id: other";
        let meta = parse(&Seed::build(&seed_input).unwrap().meta_data);
        assert_eq!(meta["instance-id"], "0c5d-uid");
        assert_eq!(meta["local-hostname"], "x\ninstance-id: other");
    }

    #[test]
    fn network_config_carries_what_cni_gave() {
        let dns = Dns::from_resolv_conf(
            "# written by containerd\nsearch default.svc cluster.local\nnameserver 10.96.0.10\nnameserver bogus\noptions ndots:5\n",
        );
        let interfaces = [pod_interface()];
        let seed = Seed::build(&input(None, &[], &[], &interfaces, &dns)).unwrap();
        let net = parse(seed.network_config.as_deref().unwrap());
        assert_eq!(net["version"], 2);
        let eth = &net["ethernets"]["eth0"];
        assert_eq!(eth["match"]["macaddress"], "52:54:00:12:34:56");
        assert_eq!(eth["set-name"], "eth0");
        assert_eq!(eth["mtu"], 1450);
        assert_eq!(eth["addresses"], json!(["10.88.0.5/16"]));
        assert_eq!(eth["gateway4"], "10.88.0.1");
        assert_eq!(
            eth["routes"],
            json!([{"to": "10.99.0.0/16", "via": "10.88.0.254"}])
        );
        assert_eq!(eth.get("gateway6"), None);
        assert_eq!(eth["nameservers"]["addresses"], json!(["10.96.0.10"]));
        assert_eq!(
            eth["nameservers"]["search"],
            json!(["default.svc", "cluster.local"])
        );

        let mut without = input(None, &[], &[], &interfaces, &dns);
        without.network_config = false;
        assert_eq!(Seed::build(&without).unwrap().network_config, None);
    }

    /// `seed`'s volume made with `xorrisofs` (installed by scripts/install-deps), as
    /// `xorriso` lists its volume id and the directory `dir` of it.
    async fn iso_listing(source: SeedSource, dir_in_iso: &str) -> String {
        let dns = Dns::default();
        let interfaces = [pod_interface()];
        let mut input = input(Some("runcmd: [true]"), &[], &[], &interfaces, &dns);
        input.source = source;
        let seed = Seed::build(&input).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("files")).unwrap();
        let iso = dir.path().join("seed.iso");
        seed.write_iso(&dir.path().join("files"), &iso)
            .await
            .unwrap();
        let listing = std::process::Command::new("xorriso")
            .args(["-indev"])
            .arg(&iso)
            .args(["-pvd_info", "-ls", dir_in_iso])
            .output()
            .unwrap();
        String::from_utf8_lossy(&listing.stdout).into_owned()
            + &String::from_utf8_lossy(&listing.stderr)
    }

    /// The volume has cloud-init's label and the files.
    #[tokio::test]
    async fn the_seed_volume_is_labelled_cidata() {
        let text = iso_listing(SeedSource::NoCloud, "/").await;
        assert!(text.contains("Volume Id    : cidata"), "{text}");
        for name in ["meta-data", "user-data", "network-config"] {
            assert!(text.contains(&format!("'{name}'")), "{name}: {text}");
        }
    }

    #[test]
    fn virtlets_meta_data_goes_over_vmlets_and_a_config_drive_repeats_the_identity() {
        let dns = Dns::default();
        let mut config_drive = input(None, &[], &[], &[], &dns);
        config_drive.source = SeedSource::ConfigDrive;
        config_drive.meta_data = Some(r#"{"instance-id":"foobar","zone":"a"}"#);
        let meta = parse(&Seed::build(&config_drive).unwrap().meta_data);
        assert_eq!(meta["instance-id"], "foobar");
        assert_eq!(meta["zone"], "a");
        assert_eq!(
            meta["uuid"], "foobar",
            "cloud-init's instance id on a config drive"
        );
        assert_eq!(meta["hostname"], "web-0");
        assert_eq!(meta["local-hostname"], "web-0");
    }

    #[test]
    fn a_user_data_script_goes_beside_vmlets_part_and_overwrite_puts_the_pods_keys_last() {
        let dns = Dns::default();
        let keys = ["ssh-ed25519 AAAA k".to_string()];
        let mut script = input(None, &keys, &[], &[], &dns);
        script.user_data_script = Some("#!/bin/sh\n@virtlet-mount-script@\necho hi\n");
        let user_data = Seed::build(&script).unwrap().user_data;
        assert!(
            user_data.contains("Content-Type: text/x-shellscript"),
            "{user_data}"
        );
        assert!(!user_data.contains(VIRTLET_MOUNT_SCRIPT), "{user_data}");
        assert!(user_data.contains("echo hi"), "{user_data}");
        assert_eq!(our_part(&user_data)["ssh_authorized_keys"][0], keys[0]);
        // Alone, the script is the user-data as written.
        let mut alone = input(None, &[], &[], &[], &dns);
        alone.user_data_script = Some("#!/bin/sh\necho hi\n");
        assert_eq!(
            Seed::build(&alone).unwrap().user_data,
            "#!/bin/sh\necho hi\n"
        );
        // Not a kind cloud-init tells apart in a multipart.
        script.user_data_script = Some("echo hi");
        let err = Seed::build(&script).unwrap_err();
        assert_eq!(err.code(), ttrpc::Code::INVALID_ARGUMENT);
        script.user_data_script = Some("#cloud-config-archive\n- type: text/cloud-config\n");
        let user_data = Seed::build(&script).unwrap().user_data;
        assert!(
            user_data.contains("Content-Type: text/cloud-config-archive"),
            "{user_data}"
        );
        // Overwrite: vmlet's part first, the pod's after it without a merge type.
        let mut overwrite = input(Some("runcmd: [true]"), &keys, &[], &[], &dns);
        overwrite.overwrite = true;
        let user_data = Seed::build(&overwrite).unwrap().user_data;
        let (ours, theirs) = (
            user_data.find("ssh_authorized_keys").unwrap(),
            user_data.find("runcmd").unwrap(),
        );
        assert!(ours < theirs, "{user_data}");
        assert!(!user_data.contains("Merge-Type"), "{user_data}");
    }

    #[test]
    fn a_config_drive_has_openstacks_network_data() {
        let dns = Dns {
            nameservers: vec!["10.96.0.10".parse().unwrap()],
            search: vec!["svc.cluster.local".into()],
        };
        let interfaces = [pod_interface()];
        let mut config_drive = input(None, &[], &[], &interfaces, &dns);
        config_drive.source = SeedSource::ConfigDrive;
        let data = parse(&Seed::build(&config_drive).unwrap().network_config.unwrap());
        assert_eq!(
            data["links"][0]["ethernet_mac_address"],
            "52:54:00:12:34:56"
        );
        assert_eq!(data["links"][0]["mtu"], 1450);
        let net = &data["networks"][0];
        assert_eq!(net["type"], "ipv4");
        assert_eq!(net["link"], "eth0");
        assert_eq!(net["ip_address"], "10.88.0.5");
        assert_eq!(net["netmask"], "255.255.0.0");
        assert_eq!(
            net["routes"],
            json!([
                {"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "10.88.0.1"},
                {"network": "10.99.0.0", "netmask": "255.255.0.0", "gateway": "10.88.0.254"},
            ])
        );
        assert_eq!(
            data["networks"].as_array().unwrap().len(),
            1,
            "no link-local"
        );
        assert_eq!(data["services"][0]["address"], "10.96.0.10");
        assert_eq!(
            netmask(&"fd00::1".parse().unwrap(), 64),
            "ffff:ffff:ffff:ffff::"
        );
    }

    /// A config drive is labelled `config-2` with OpenStack's layout.
    #[tokio::test]
    async fn a_config_drive_is_labelled_config_2() {
        let text = iso_listing(SeedSource::ConfigDrive, "/openstack/latest").await;
        assert!(text.contains("Volume Id    : config-2"), "{text}");
        for name in ["meta_data.json", "user_data", "network_data.json"] {
            assert!(text.contains(&format!("'{name}'")), "{name}: {text}");
        }
    }
}
