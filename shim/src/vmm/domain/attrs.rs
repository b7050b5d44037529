//! The domain XML's small elements of one attribute (`type`, `mode`, `name`, `socket`,
//! `dir`) or none, which its larger elements share.

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct TypeAttr {
    #[serde(rename = "@type")]
    pub kind: String,
}

#[derive(Debug, Serialize)]
pub struct ModeAttr {
    #[serde(rename = "@mode")]
    pub mode: String,
}

#[derive(Debug, Serialize)]
pub struct NameAttr {
    #[serde(rename = "@name")]
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct SocketAttr {
    #[serde(rename = "@socket")]
    pub socket: String,
}

#[derive(Debug, Serialize)]
pub struct DirAttr {
    #[serde(rename = "@dir")]
    pub dir: String,
}

#[derive(Debug, Serialize, Default)]
pub struct Empty {}
