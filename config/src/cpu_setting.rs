//! Virtlet's `VirtletLibvirtCPUSetting`: libvirt's `<cpu>` element written as YAML, whose
//! keys are the element's attributes and children (any case, as Virtlet reads them; a
//! model's name is its `value`):
//!
//! ```yaml
//! mode: custom
//! match: exact
//! model:
//!   fallback: forbid
//!   value: Nehalem
//! features:
//!   - policy: disable
//!     name: sse4.2
//! ```
//!
//! vmlet takes `mode`, `match`, `check`, `model`, `vendor` and `features`; anything else
//! (topology, NUMA, cache) is refused by name, as is a value libvirt would not take.

use serde_yaml_ng::{Mapping, Value};

/// The parsed setting; each value is one libvirt accepts for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuSetting {
    /// `custom` (libvirt's default), `host-model`, `host-passthrough` or `maximum`.
    pub mode: Option<String>,
    /// `minimum`, `exact` or `strict`.
    pub match_: Option<String>,
    /// `none`, `partial` or `full`.
    pub check: Option<String>,
    pub model: Option<CpuSettingModel>,
    pub vendor: Option<String>,
    pub features: Vec<CpuFeature>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSettingModel {
    pub name: String,
    /// `allow` or `forbid`.
    pub fallback: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuFeature {
    /// `force`, `require`, `optional`, `disable` or `forbid`.
    pub policy: String,
    pub name: String,
}

const MODES: &[&str] = &["custom", "host-model", "host-passthrough", "maximum"];
const MATCHES: &[&str] = &["minimum", "exact", "strict"];
const CHECKS: &[&str] = &["none", "partial", "full"];
const FALLBACKS: &[&str] = &["allow", "forbid"];
const POLICIES: &[&str] = &["force", "require", "optional", "disable", "forbid"];
/// Longest name of a model, vendor or feature.
const MAX_NAME: usize = 64;
/// Most features one setting may list.
const MAX_FEATURES: usize = 64;

impl CpuSetting {
    /// libvirt's mode name when it is one of the host's CPU (needs KVM).
    pub fn host_mode(&self) -> Option<&'static str> {
        match self.mode.as_deref() {
            Some("host-model") => Some("host-model"),
            Some("host-passthrough") => Some("host-passthrough"),
            _ => None,
        }
    }
}

/// Parses the annotation's value; the error says what is wrong, naming the field.
pub fn parse(value: &str) -> Result<CpuSetting, String> {
    let yaml: Value = serde_yaml_ng::from_str(value).map_err(|e| format!("not YAML: {e}"))?;
    let Value::Mapping(top) = yaml else {
        return Err("expected a mapping of libvirt <cpu> fields (mode, match, model, ...)".into());
    };
    let mut setting = CpuSetting::default();
    for (key, value) in fields(&top, "the setting")? {
        match key.as_str() {
            "mode" => setting.mode = Some(one_of(&value, "mode", MODES)?),
            "match" => setting.match_ = Some(one_of(&value, "match", MATCHES)?),
            "check" => setting.check = Some(one_of(&value, "check", CHECKS)?),
            "vendor" => setting.vendor = Some(name(&value, "vendor")?),
            "model" => setting.model = Some(model(&value)?),
            "features" | "feature" => setting.features = features(&value)?,
            other => {
                return Err(format!(
                    "field {other:?} is not supported (vmlet takes mode, match, check, model, vendor, features)"
                ))
            }
        }
    }
    let custom = setting.mode.as_deref().is_none_or(|m| m == "custom");
    if custom && setting.model.is_none() {
        return Err("mode custom needs a model".into());
    }
    if setting.mode.as_deref() == Some("host-passthrough") && setting.model.is_some() {
        return Err("mode host-passthrough takes no model".into());
    }
    Ok(setting)
}

/// A mapping's entries with lower-cased string keys (each once).
fn fields(map: &Mapping, what: &str) -> Result<Vec<(String, Value)>, String> {
    let mut out: Vec<(String, Value)> = Vec::new();
    for (key, value) in map {
        let Value::String(key) = key else {
            return Err(format!("{what} has a key that is not a name: {key:?}"));
        };
        let key = key.to_ascii_lowercase();
        if out.iter().any(|(k, _)| *k == key) {
            return Err(format!("{what} sets {key:?} twice"));
        }
        out.push((key, value.clone()));
    }
    Ok(out)
}

/// A scalar as written (QEMU has models named `486`; YAML reads that as a number).
fn text(value: &Value, field: &str) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.trim().to_owned()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("{field} must be a string, not {other:?}")),
    }
}

fn one_of(value: &Value, field: &str, allowed: &[&str]) -> Result<String, String> {
    let v = text(value, field)?;
    if allowed.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(format!(
            "{field} {v:?} is not one of {}",
            allowed.join(", ")
        ))
    }
}

/// A model, vendor or feature name: letters, digits, `.`, `_`, `-`.
fn name(value: &Value, field: &str) -> Result<String, String> {
    let v = text(value, field)?;
    if v.is_empty() || v.len() > MAX_NAME {
        return Err(format!("{field} must be 1 to {MAX_NAME} characters"));
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("{c:?} is not allowed in {field} {v:?}"));
    }
    Ok(v)
}

/// `model: Nehalem` or `model: {value: Nehalem, fallback: forbid}`.
fn model(value: &Value) -> Result<CpuSettingModel, String> {
    let Value::Mapping(map) = value else {
        return Ok(CpuSettingModel {
            name: name(value, "model")?,
            fallback: None,
        });
    };
    let mut model_name = None;
    let mut fallback = None;
    for (key, value) in fields(map, "model")? {
        match key.as_str() {
            "value" => model_name = Some(name(&value, "model value")?),
            "fallback" => fallback = Some(one_of(&value, "model fallback", FALLBACKS)?),
            other => {
                return Err(format!(
                    "model field {other:?} is not supported (value, fallback)"
                ))
            }
        }
    }
    Ok(CpuSettingModel {
        name: model_name.ok_or("model needs a value (the model's name)")?,
        fallback,
    })
}

fn features(value: &Value) -> Result<Vec<CpuFeature>, String> {
    let Value::Sequence(items) = value else {
        return Err("features must be a list of {policy, name}".into());
    };
    if items.len() > MAX_FEATURES {
        return Err(format!("more than {MAX_FEATURES} features"));
    }
    items
        .iter()
        .map(|item| {
            let Value::Mapping(map) = item else {
                return Err(format!("a feature must be {{policy, name}}, not {item:?}"));
            };
            let (mut policy, mut feature) = (None, None);
            for (key, value) in fields(map, "a feature")? {
                match key.as_str() {
                    "policy" => policy = Some(one_of(&value, "feature policy", POLICIES)?),
                    "name" => feature = Some(name(&value, "feature name")?),
                    other => {
                        return Err(format!(
                            "feature field {other:?} is not supported (policy, name)"
                        ))
                    }
                }
            }
            let name = feature.ok_or("a feature needs a name")?;
            Ok(CpuFeature {
                policy: policy.ok_or_else(|| format!("feature {name} needs a policy"))?,
                name,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtlets_examples_parse() {
        assert_eq!(
            parse("mode: host-passthrough\n").unwrap(),
            CpuSetting {
                mode: Some("host-passthrough".into()),
                ..Default::default()
            }
        );
        let s = parse("Match: exact\nModel:\n  Fallback: allow\n  Value: core2duo\n").unwrap();
        assert_eq!(s.match_.as_deref(), Some("exact"));
        assert_eq!(
            s.model,
            Some(CpuSettingModel {
                name: "core2duo".into(),
                fallback: Some("allow".into())
            })
        );
        assert_eq!(s.host_mode(), None);
    }

    #[test]
    fn features_and_a_plain_model_name() {
        let s = parse(
            "mode: custom\nmodel: Nehalem\nvendor: Intel\nfeatures:\n- policy: disable\n  name: sse4.2\n- {policy: require, name: vmx}\n",
        )
        .unwrap();
        assert_eq!(s.model.unwrap().name, "Nehalem");
        assert_eq!(s.vendor.as_deref(), Some("Intel"));
        assert_eq!(
            s.features,
            [
                CpuFeature {
                    policy: "disable".into(),
                    name: "sse4.2".into()
                },
                CpuFeature {
                    policy: "require".into(),
                    name: "vmx".into()
                }
            ]
        );
    }

    #[test]
    fn each_bad_value_is_named() {
        for (yaml, expected) in [
            ("", "expected a mapping"),
            ("- a", "expected a mapping"),
            ("mode: [", "not YAML"),
            ("mode: turbo", "mode \"turbo\" is not one of"),
            ("match: exact", "mode custom needs a model"),
            ("mode: host-passthrough\nmodel: Nehalem", "takes no model"),
            (
                "mode: host-model\ntopology: {sockets: 2}",
                "field \"topology\" is not supported",
            ),
            ("model: {value: 'a b'}", "' ' is not allowed in model value"),
            ("model: {fallback: allow}", "model needs a value"),
            (
                "model: {value: x, fallback: maybe}",
                "model fallback \"maybe\"",
            ),
            ("model: x\nfeatures: vmx", "features must be a list"),
            (
                "model: x\nfeatures: [{name: vmx}]",
                "feature vmx needs a policy",
            ),
            (
                "model: x\nfeatures: [{policy: want, name: vmx}]",
                "feature policy \"want\"",
            ),
            (
                "model: x\nMode: custom\nmode: custom",
                "sets \"mode\" twice",
            ),
            ("model: [a]", "model must be a string"),
            ("model: ~", "model must be a string"),
        ] {
            let err = parse(yaml).unwrap_err();
            assert!(err.contains(expected), "{yaml:?}: {err}");
        }
    }
}
