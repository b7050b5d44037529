//! The checks of annotation values that are free text (kernel parameters, names,
//! cloud-init user-data and meta-data, SSH keys), with their bounds: what
//! [`crate::annotations`] calls for each key that takes one.

/// Longest value accepted for free-form annotations (kernel parameters).
pub(crate) const MAX_KERNEL_PARAMS: usize = 1024;
/// Longest CPU model or machine type name.
pub(crate) const MAX_NAME: usize = 64;
/// Longest cloud-init user-data (Kubernetes keeps all of a pod's annotations under 256 KiB).
pub(crate) const MAX_USER_DATA: usize = 64 * 1024;
/// Most SSH keys, and the longest one (an RSA 16384-bit key is ~2.8 KiB).
pub(crate) const MAX_SSH_KEYS: usize = 64;
pub(crate) const MAX_SSH_KEY: usize = 8 * 1024;
/// The key types an SSH public key line may start with (OpenSSH's).
pub(crate) const SSH_KEY_TYPES: &[&str] = &["ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-sha2-"];

/// The kinds of user-data cloud-init tells apart by their first line, with the MIME type of
/// each as a part of a multipart (a `#!` script is `text/x-shellscript`).
pub const USER_DATA_KINDS: &[(&str, &str)] = &[
    ("#cloud-config", "text/cloud-config"),
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#include", "text/x-include-url"),
    ("#include-once", "text/x-include-once-url"),
    ("#part-handler", "text/part-handler"),
];

/// The MIME type of a user-data whose first line is cloud-init's mark of its kind: a `#!`
/// script, or one of [`USER_DATA_KINDS`]; `None` for anything else.
pub fn user_data_kind(user_data: &str) -> Option<&'static str> {
    let first = user_data.lines().next().unwrap_or_default().trim_end();
    if first.starts_with("#!") {
        return Some("text/x-shellscript");
    }
    USER_DATA_KINDS
        .iter()
        .find(|(mark, _)| *mark == first)
        .map(|(_, kind)| *kind)
}

/// cloud-init user-data: a YAML mapping (cloud-config, merged with what vmlet writes) of at
/// most [`MAX_USER_DATA`] bytes.
pub(crate) fn check_user_data(value: &str) -> Result<String, String> {
    if value.len() > MAX_USER_DATA {
        return Err(format!("longer than {MAX_USER_DATA} bytes"));
    }
    match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(value) {
        Ok(serde_yaml_ng::Value::Mapping(_)) => Ok(value.to_owned()),
        Ok(_) => Err("expected a YAML mapping (cloud-config keys such as runcmd)".into()),
        Err(e) => Err(format!("not YAML: {e}")),
    }
}

/// cloud-init meta-data keys: a YAML (or JSON) mapping with string keys, at most
/// [`MAX_USER_DATA`] bytes, returned as a JSON object's text.
pub(crate) fn check_meta_data(value: &str) -> Result<String, String> {
    if value.len() > MAX_USER_DATA {
        return Err(format!("longer than {MAX_USER_DATA} bytes"));
    }
    let yaml = match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(value) {
        Ok(yaml @ serde_yaml_ng::Value::Mapping(_)) => yaml,
        Ok(_) => return Err("expected a YAML mapping (meta-data keys such as instance-id)".into()),
        Err(e) => return Err(format!("not YAML: {e}")),
    };
    let json = serde_json::to_value(&yaml).map_err(|e| format!("not meta-data: {e}"))?;
    if !json
        .as_object()
        .is_some_and(|o| o.keys().all(|k| !k.is_empty()))
    {
        return Err("expected a mapping with string keys".into());
    }
    Ok(json.to_string())
}

/// SSH public keys, one per line (blank lines skipped): each starts with an OpenSSH key
/// type, is printable ASCII, at most [`MAX_SSH_KEY`] bytes; at most [`MAX_SSH_KEYS`] keys.
pub(crate) fn check_ssh_keys(value: &str) -> Result<Vec<String>, String> {
    let keys: Vec<String> = value
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Err("no key".into());
    }
    if keys.len() > MAX_SSH_KEYS {
        return Err(format!("more than {MAX_SSH_KEYS} keys"));
    }
    for (n, key) in keys.iter().enumerate() {
        let line = n + 1;
        if key.len() > MAX_SSH_KEY {
            return Err(format!("key {line} is longer than {MAX_SSH_KEY} bytes"));
        }
        if !SSH_KEY_TYPES.iter().any(|t| key.starts_with(t)) || key.split_whitespace().count() < 2 {
            return Err(format!(
                "key {line} is not an OpenSSH public key line (type, then the key: ssh-ed25519 AAAA...)"
            ));
        }
        if let Some(c) = key.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
            return Err(format!("key {line}: {c:?} is not allowed"));
        }
    }
    Ok(keys)
}

/// A CPU model or machine type name: letters, digits, `.`, `_`, `-`.
pub(crate) fn check_name(name: &str, what: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err(format!("expected {what} name"));
    }
    if name.len() > MAX_NAME {
        return Err(format!("longer than {MAX_NAME} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("{c:?} is not allowed in {what} name"));
    }
    Ok(name.to_owned())
}

/// Kernel parameters: printable ASCII words without quotes, none of vmlet's own (`vmlet.*`,
/// `console`, `panic`), at most [`MAX_KERNEL_PARAMS`] bytes in all.
pub(crate) fn check_kernel_params(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("empty".into());
    }
    if value.len() > MAX_KERNEL_PARAMS {
        return Err(format!("longer than {MAX_KERNEL_PARAMS} bytes"));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_graphic() || *c == ' ') || matches!(c, '"' | '\'' | '\\'))
    {
        return Err(format!("{c:?} is not allowed in kernel parameters"));
    }
    for word in value.split_whitespace() {
        let name = word.split('=').next().unwrap_or(word);
        if name.starts_with("vmlet.") || name == "console" || name == "panic" {
            return Err(format!("{name} is set by vmlet itself"));
        }
    }
    Ok(value.split_whitespace().collect::<Vec<_>>().join(" "))
}
