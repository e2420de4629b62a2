//! etcd's command line as Go's `flag` package reads it, and its `ETCD_*` variables: `-flag` or
//! `--flag`, `--flag=value` or `--flag value`, booleans as `--flag` or `--flag=false` only;
//! parsing stops at the first argument that is not a flag; an unknown flag, a missing value or
//! a bad number fails with the message etcd prints. The result is a canonical
//! `--flag=value` list for the typed parser (`clap`), and the notes to log once logging is up.

use std::collections::BTreeMap;

use super::etcd_flags::{self, Kind, Support};

/// A command line etcd would refuse: what to print and the exit code etcd uses.
#[derive(Debug, PartialEq, Eq)]
pub struct ArgError {
    /// The message, as etcd prints it.
    pub message: String,
    /// Whether etcd prints its usage text after the message (Go's flag errors).
    pub usage: bool,
    /// The process exit code.
    pub code: i32,
}

impl ArgError {
    fn flag(message: String) -> Self {
        ArgError {
            message,
            usage: true,
            code: 2,
        }
    }
}

/// What parsing found worth a log line once logging is set up.
#[derive(Debug, PartialEq, Eq)]
pub enum Note {
    /// A flag accepted without effect, and why.
    NoEffect {
        /// The flag.
        flag: &'static str,
        /// Why it has none.
        reason: &'static str,
    },
    /// An `ETCD_*` variable set a flag.
    EnvUsed {
        /// The variable.
        var: String,
    },
    /// An `ETCD_*` variable ignored because the command line set its flag.
    EnvShadowed {
        /// The variable.
        var: String,
    },
    /// The configuration came from a file; the command line and environment were ignored.
    ConfigFile {
        /// The file.
        path: String,
        /// Its keys that name no setting.
        unknown: Vec<String>,
    },
    /// An `ETCD_*` variable that names no flag.
    EnvUnrecognized {
        /// The variable.
        var: String,
    },
}

/// The outcome of reading the command line.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these canonical arguments (program name first) and notes.
    Run(Vec<String>, Vec<Note>),
    /// `-h`/`--help`: print the usage and exit 0.
    Help,
    /// `--version`: print the version and exit 0.
    Version,
}

/// Variables etcd reads itself rather than as flags.
const SPECIAL_ENV: &[&str] = &["ETCD_VERSION", "ETCD_UNSUPPORTED_ARCH", "ETCD_CONFIG_FILE"];

/// Reads `args` (without the program name) and the environment `env` as etcd does.
///
/// # Errors
/// The [`ArgError`] etcd would report.
pub fn parse(args: &[String], env: &[(String, String)]) -> Result<Parsed, ArgError> {
    let mut set: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let s = &args[i];
        if s.len() < 2 || !s.starts_with('-') {
            break;
        }
        let body = if let Some(rest) = s.strip_prefix("--") {
            if rest.is_empty() {
                i += 1;
                break;
            }
            rest
        } else {
            &s[1..]
        };
        if body.starts_with('-') || body.starts_with('=') {
            return Err(ArgError::flag(format!("bad flag syntax: {s}")));
        }
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let Some(flag) = etcd_flags::lookup(name) else {
            if name == "h" || name == "help" {
                return Ok(Parsed::Help);
            }
            return Err(ArgError::flag(format!(
                "flag provided but not defined: -{name}"
            )));
        };
        let value = if flag.kind == Kind::Bool {
            match value {
                Some(v) => canonical(Kind::Bool, &v).map_err(|_| {
                    ArgError::flag(format!(
                        "invalid boolean value {v:?} for -{name}: parse error"
                    ))
                })?,
                None => "true".to_string(),
            }
        } else {
            let v = match value {
                Some(v) => v,
                None if i + 1 < args.len() => {
                    i += 1;
                    args[i].clone()
                }
                None => {
                    return Err(ArgError::flag(format!("flag needs an argument: -{name}")));
                }
            };
            canonical(flag.kind, &v).map_err(|why| {
                ArgError::flag(format!("invalid value {v:?} for flag -{name}: {why}"))
            })?
        };
        set.insert(flag.name, value);
        i += 1;
    }
    if let Some(extra) = args.get(i) {
        return Err(ArgError {
            message: format!("'{extra}' is not a valid flag"),
            usage: false,
            code: 1,
        });
    }
    if set.get("version").is_some_and(|v| v == "true") {
        return Ok(Parsed::Version);
    }
    let mut notes = Vec::new();
    let config_file = set.get("config-file").cloned().or_else(|| {
        env.iter()
            .find(|(k, _)| k == "ETCD_CONFIG_FILE")
            .map(|(_, v)| v.clone())
    });
    if let Some(path) = config_file.filter(|p| !p.is_empty()) {
        let super::file::Settings {
            set: settings,
            unknown,
        } = super::file::read(std::path::Path::new(&path)).map_err(|message| ArgError {
            message,
            usage: false,
            code: 1,
        })?;
        set.clear();
        for (name, value) in settings {
            let Some(flag) = etcd_flags::lookup(&name) else {
                continue;
            };
            let value = canonical(flag.kind, &value).map_err(|_| ArgError {
                message: format!("--config-file {path}: invalid value {value:?} for {name}"),
                usage: false,
                code: 1,
            })?;
            set.insert(flag.name, value);
        }
        notes.push(Note::ConfigFile { path, unknown });
        return finish(set, notes);
    }
    for (var, value) in env {
        let Some(flag_name) = var.strip_prefix("ETCD_") else {
            continue;
        };
        if SPECIAL_ENV.contains(&var.as_str()) {
            continue;
        }
        let name = flag_name.to_lowercase().replace('_', "-");
        let Some(flag) = etcd_flags::lookup(&name) else {
            notes.push(Note::EnvUnrecognized { var: var.clone() });
            continue;
        };
        if set.contains_key(flag.name) {
            notes.push(Note::EnvShadowed { var: var.clone() });
            continue;
        }
        let value = canonical(flag.kind, value).map_err(|_| env_error(var, value))?;
        notes.push(Note::EnvUsed { var: var.clone() });
        set.insert(flag.name, value);
    }
    finish(set, notes)
}

/// The canonical arguments for the implemented flags of `set`; notes for the others.
fn finish(set: BTreeMap<&'static str, String>, mut notes: Vec<Note>) -> Result<Parsed, ArgError> {
    // etcd drops its default advertised client URL when the listen URLs are given.
    if set.contains_key("listen-client-urls") && !set.contains_key("advertise-client-urls") {
        return Err(ArgError {
            message:
                "--advertise-client-urls is required when --listen-client-urls is set explicitly"
                    .into(),
            usage: false,
            code: 1,
        });
    }
    let mut canonical = vec!["concord".to_string()];
    for (name, value) in set {
        let Some(flag) =
            etcd_flags::lookup(name).filter(|f| f.name != "version" && f.name != "config-file")
        else {
            continue;
        };
        match flag.support {
            Support::Implemented => canonical.push(format!("--{name}={value}")),
            Support::NoEffect(reason) => notes.push(Note::NoEffect { flag: name, reason }),
            Support::DefaultOnly(default, reason) => {
                if value != default {
                    return Err(ArgError {
                        message: format!("--{name}={value} is not supported: {reason}"),
                        usage: false,
                        code: 1,
                    });
                }
            }
        }
    }
    Ok(Parsed::Run(canonical, notes))
}

fn env_error(var: &str, value: &str) -> ArgError {
    ArgError {
        message: format!("invalid value {value:?} for {var}: parse error"),
        usage: false,
        code: 1,
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `v` checked against the flag's Go type, in the form the typed parser takes (booleans as
/// `true`/`false`, whatever Go spelling they came in).
fn canonical(kind: Kind, v: &str) -> Result<String, &'static str> {
    let ok = match kind {
        Kind::Bool => return parse_bool(v).map(|b| b.to_string()).ok_or("parse error"),
        Kind::Text => true,
        Kind::Uint => v.parse::<u64>().is_ok(),
        Kind::Int => v.parse::<i64>().is_ok(),
        Kind::Duration => super::parse_duration(v).is_ok(),
    };
    if ok {
        Ok(v.to_string())
    } else {
        Err("parse error")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<(Vec<String>, Vec<Note>), ArgError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match parse(&args, &env)? {
            Parsed::Run(a, n) => Ok((a[1..].to_vec(), n)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn go_flag_syntax() {
        let (args, notes) = run(
            &[
                "-name",
                "a",
                "--data-dir=d",
                "--client-cert-auth",
                "--auto-tls=false",
                "--pre-vote",
                "--snapshot-count",
                "10000",
            ],
            &[],
        )
        .unwrap_or_default();
        assert_eq!(
            args,
            [
                "--auto-tls=false",
                "--client-cert-auth=true",
                "--data-dir=d",
                "--name=a",
                "--snapshot-count=10000"
            ]
        );
        assert!(matches!(
            notes.as_slice(),
            [Note::NoEffect {
                flag: "pre-vote",
                ..
            }]
        ));
    }

    #[test]
    fn errors_read_as_etcds() {
        let err = |args: &[&str]| run(args, &[]).err().map(|e| (e.message, e.code));
        assert_eq!(
            err(&["--foo"]),
            Some(("flag provided but not defined: -foo".into(), 2))
        );
        assert_eq!(
            err(&["--name"]),
            Some(("flag needs an argument: -name".into(), 2))
        );
        assert_eq!(
            err(&["--auto-tls=maybe"]),
            Some((
                "invalid boolean value \"maybe\" for -auto-tls: parse error".into(),
                2
            ))
        );
        assert_eq!(
            err(&["--auto-tls", "false"]),
            Some(("'false' is not a valid flag".into(), 1))
        );
        assert_eq!(
            err(&["--heartbeat-interval=soon"]),
            Some((
                "invalid value \"soon\" for flag -heartbeat-interval: parse error".into(),
                2
            ))
        );
        assert_eq!(err(&["---x"]), Some(("bad flag syntax: ---x".into(), 2)));
        assert!(err(&["--unsafe-no-fsync"]).is_some_and(|(m, _)| m.contains("not supported")));
        assert!(err(&["--unsafe-no-fsync=false"]).is_none());
    }

    #[test]
    fn environment_as_etcd() {
        let (args, notes) = run(
            &["--name", "flag"],
            &[
                ("ETCD_NAME", "env"),
                ("ETCD_DATA_DIR", "/d"),
                ("ETCD_NOPE", "1"),
                ("ETCD_CLIENT_CERT_AUTH", "true"),
                ("HOME", "/root"),
            ],
        )
        .unwrap_or_default();
        assert_eq!(
            args,
            ["--client-cert-auth=true", "--data-dir=/d", "--name=flag"]
        );
        assert!(notes.contains(&Note::EnvShadowed {
            var: "ETCD_NAME".into()
        }));
        assert!(notes.contains(&Note::EnvUnrecognized {
            var: "ETCD_NOPE".into()
        }));
        assert!(notes.contains(&Note::EnvUsed {
            var: "ETCD_DATA_DIR".into()
        }));
    }

    #[test]
    fn a_config_file_replaces_flags_and_environment() {
        let dir = tempfile::tempdir().unwrap_or_else(|_| std::process::abort());
        let path = dir.path().join("etcd.yml");
        let yaml = "name: from-file\nsnapshot-count: 5\npre-vote: true\n\
                    client-transport-security:\n  client-cert-auth: true\n";
        std::fs::write(&path, yaml).unwrap_or_default();
        let file = path.to_string_lossy().into_owned();
        let (args, notes) = run(
            &["--config-file", &file, "--name", "flag"],
            &[("ETCD_DATA_DIR", "/env")],
        )
        .unwrap_or_default();
        assert_eq!(
            args,
            [
                "--client-cert-auth=true",
                "--name=from-file",
                "--snapshot-count=5"
            ]
        );
        assert!(notes.iter().any(|n| matches!(n, Note::ConfigFile { .. })));
        assert!(notes.contains(&Note::NoEffect {
            flag: "pre-vote",
            reason: "Concord always runs PreVote"
        }));
        // Through the environment too; a bad value is refused.
        std::fs::write(&path, "snapshot-count: lots\n").unwrap_or_default();
        let err = run(&[], &[("ETCD_CONFIG_FILE", &file)]).err();
        assert!(err.is_some_and(|e| e.message.contains("snapshot-count")));
        assert!(run(&["--config-file", "/no/such/file"], &[]).is_err());
    }

    #[test]
    fn kubeadm_command_line_is_accepted() {
        let line = "--advertise-client-urls=https://10.0.0.1:2379 --cert-file=server.crt \
            --client-cert-auth=true --data-dir=/var/lib/etcd \
            --experimental-initial-corrupt-check=true \
            --experimental-watch-progress-notify-interval=5s \
            --initial-advertise-peer-urls=https://10.0.0.1:2380 \
            --initial-cluster=n1=https://10.0.0.1:2380 --key-file=server.key \
            --listen-client-urls=https://127.0.0.1:2379,https://10.0.0.1:2379 \
            --listen-metrics-urls=http://127.0.0.1:2381 --listen-peer-urls=https://10.0.0.1:2380 \
            --name=n1 --peer-cert-file=peer.crt --peer-client-cert-auth=true \
            --peer-key-file=peer.key --peer-trusted-ca-file=ca.crt --snapshot-count=10000 \
            --trusted-ca-file=ca.crt";
        let args: Vec<&str> = line.split_whitespace().collect();
        assert!(run(&args, &[]).is_ok());
    }
}
