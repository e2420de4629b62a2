//! etcd's YAML configuration file (`--config-file`, `ETCD_CONFIG_FILE`): its keys are the flag
//! names, except the `client-transport-security` and `peer-transport-security` sections (and
//! `socket-options`), whose keys map to the TLS flags. Durations are Go's `time.Duration` in
//! JSON: integer nanoseconds (a Go duration string is accepted too). As in etcd, a
//! configuration file replaces the command line and the environment entirely.

use std::path::Path;

use serde_yaml_ng::Value;

use super::etcd_flags::{self, Kind};

/// The section keys of the transport sections, and the flags they set.
const CLIENT_SECURITY: &[(&str, &str)] = &[
    ("cert-file", "cert-file"),
    ("key-file", "key-file"),
    ("client-cert-file", "client-cert-file"),
    ("client-key-file", "client-key-file"),
    ("client-cert-auth", "client-cert-auth"),
    ("trusted-ca-file", "trusted-ca-file"),
    ("auto-tls", "auto-tls"),
    ("allowed-hostname", "client-cert-allowed-hostname"),
];
const PEER_SECURITY: &[(&str, &str)] = &[
    ("cert-file", "peer-cert-file"),
    ("key-file", "peer-key-file"),
    ("client-cert-file", "peer-client-cert-file"),
    ("client-key-file", "peer-client-key-file"),
    ("client-cert-auth", "peer-client-cert-auth"),
    ("trusted-ca-file", "peer-trusted-ca-file"),
    ("auto-tls", "peer-auto-tls"),
    ("allowed-cn", "peer-cert-allowed-cn"),
    ("allowed-hostname", "peer-cert-allowed-hostname"),
];
const SOCKET: &[(&str, &str)] = &[
    ("reuse-port", "socket-reuse-port"),
    ("reuse-address", "socket-reuse-address"),
];

/// What a configuration file sets.
#[derive(Debug, Default)]
pub struct Settings {
    /// (flag name, value as the command line would give it).
    pub set: Vec<(String, String)>,
    /// Keys that name no setting.
    pub unknown: Vec<String>,
}

/// Reads a configuration file.
///
/// # Errors
/// When the file cannot be read or is not a YAML mapping of settings.
pub fn read(path: &Path) -> Result<Settings, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --config-file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("--config-file {}: {e}", path.display()))
}

/// [`read`], from the file's text.
///
/// # Errors
/// When the text is not a YAML mapping of settings.
pub fn parse(text: &str) -> Result<Settings, String> {
    let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let mut set = Vec::new();
    let mut unknown = Vec::new();
    let Value::Mapping(top) = doc else {
        return if doc.is_null() {
            Ok(Settings { set, unknown })
        } else {
            Err("not a mapping of settings".into())
        };
    };
    for (key, value) in top {
        let Some(key) = key.as_str() else {
            return Err(format!("key {key:?} is not text"));
        };
        let section = match key {
            "client-transport-security" => Some(CLIENT_SECURITY),
            "peer-transport-security" => Some(PEER_SECURITY),
            "socket-options" => Some(SOCKET),
            _ => None,
        };
        match (section, value) {
            (Some(_), Value::Null) => {}
            (Some(names), Value::Mapping(m)) => {
                for (k, v) in m {
                    let k = k.as_str().unwrap_or_default().to_string();
                    match names.iter().find(|(from, _)| *from == k) {
                        Some((_, flag)) => push(&mut set, flag, &v)?,
                        None => unknown.push(format!("{key}.{k}")),
                    }
                }
            }
            (Some(_), _) => return Err(format!("{key}: not a mapping")),
            (None, v) => {
                // etcd's file spells the catch-up entries setting differently from its flag.
                let flag = match key {
                    "experimental-snapshot-catch-up-entries" => {
                        "experimental-snapshot-catchup-entries"
                    }
                    other => other,
                };
                if flag == "config-file" || etcd_flags::lookup(flag).is_none() {
                    unknown.push(key.to_string());
                } else {
                    push(&mut set, flag, &v)?;
                }
            }
        }
    }
    Ok(Settings { set, unknown })
}

/// Adds flag `flag` with `value` rendered as command-line text.
fn push(set: &mut Vec<(String, String)>, flag: &str, value: &Value) -> Result<(), String> {
    let kind = etcd_flags::lookup(flag).map_or(Kind::Text, |f| f.kind);
    let text = match value {
        Value::Null => return Ok(()),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if kind == Kind::Duration => match n.as_u64() {
            Some(0) => "0".to_string(),
            Some(nanos) => format!("{nanos}ns"),
            None => return Err(format!("{flag}: {n} is not a duration in nanoseconds")),
        },
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Sequence(items) => {
            let mut parts = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => parts.push(s.clone()),
                    Value::Number(n) => parts.push(n.to_string()),
                    _ => return Err(format!("{flag}: a list of text expected")),
                }
            }
            parts.join(",")
        }
        _ => return Err(format!("{flag}: unexpected value")),
    };
    set.push((flag.to_string(), text));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_sample_shape_is_read() {
        let text = r#"
name: 'n1'
data-dir: /var/lib/etcd
snapshot-count: 10000
heartbeat-interval: 100
listen-client-urls: https://127.0.0.1:2379
initial-cluster-state: 'new'
experimental-watch-progress-notify-interval: 5000000000
experimental-initial-corrupt-check: true
cipher-suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
log-outputs: [stderr]
wal-dir:
client-transport-security:
  cert-file: /etc/etcd/server.crt
  client-cert-auth: true
  allowed-hostname: [a.example]
peer-transport-security:
  key-file: /etc/etcd/peer.key
  allowed-cn: [node-a, node-b]
socket-options:
  reuse-port: false
colour: blue
"#;
        let Settings { set, unknown } = parse(text).unwrap_or_default();
        let get = |k: &str| set.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
        assert_eq!(get("name"), Some("n1"));
        assert_eq!(get("snapshot-count"), Some("10000"));
        assert_eq!(
            get("experimental-watch-progress-notify-interval"),
            Some("5000000000ns")
        );
        assert_eq!(get("experimental-initial-corrupt-check"), Some("true"));
        assert_eq!(get("cert-file"), Some("/etc/etcd/server.crt"));
        assert_eq!(get("client-cert-auth"), Some("true"));
        assert_eq!(get("client-cert-allowed-hostname"), Some("a.example"));
        assert_eq!(get("peer-key-file"), Some("/etc/etcd/peer.key"));
        assert_eq!(get("peer-cert-allowed-cn"), Some("node-a,node-b"));
        assert_eq!(get("socket-reuse-port"), Some("false"));
        assert_eq!(get("wal-dir"), None);
        assert_eq!(unknown, ["colour"]);
        assert!(parse("- just\n- a list\n").is_err());
        assert!(parse("client-transport-security: 3\n").is_err());
    }
}
