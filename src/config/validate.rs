//! The checks etcd's `embed.Config.Validate` makes before it starts, with its messages: listen
//! URLs must name an IP (or `localhost`), advertised URLs must be `host:port`, the timing flags
//! must make sense together, and cipher suites cannot be chosen for TLS 1.3 alone.

use super::{split_urls, Config};

/// etcd's largest election timeout, in milliseconds.
const MAX_ELECTION_MS: u64 = 50_000;

/// Checks `cfg` as etcd does.
///
/// # Errors
/// etcd's message for the first problem found.
pub fn validate(cfg: &Config) -> Result<(), String> {
    for urls in [
        &cfg.listen_peer_urls,
        &cfg.listen_client_urls,
        &cfg.listen_client_http_urls,
        &cfg.listen_metrics_urls,
    ] {
        check_bind_urls(urls)?;
    }
    if let Err(e) = check_host_urls(&cfg.initial_advertise_peer_urls) {
        return Err(format!(
            "--initial-advertise-peer-urls {:?} must be \"host:port\" ({e})",
            cfg.initial_advertise_peer_urls
        ));
    }
    if let Err(e) = check_host_urls(&cfg.advertise_client_urls) {
        return Err(format!(
            "--advertise-client-urls {:?} must be \"host:port\" ({e})",
            cfg.advertise_client_urls
        ));
    }
    let (tick, election) = (cfg.heartbeat_interval, cfg.election_timeout);
    if tick == 0 {
        return Err(format!("--heartbeat-interval must be >0 (set to {tick}ms)"));
    }
    if election == 0 {
        return Err(format!(
            "--election-timeout must be >0 (set to {election}ms)"
        ));
    }
    if 5 * tick > election {
        return Err(format!(
            "--election-timeout[{election}ms] should be at least as 5 times as --heartbeat-interval[{tick}ms]"
        ));
    }
    if election > MAX_ELECTION_MS {
        return Err(format!(
            "--election-timeout[{election}ms] is too long, and should be set less than {MAX_ELECTION_MS}ms"
        ));
    }
    if cfg.tls_min_version == "TLS1.3" && !split_urls(&cfg.cipher_suites).is_empty() {
        return Err("cipher suites cannot be configured when only TLS1.3 is enabled".into());
    }
    Ok(())
}

/// etcd's `checkBindURLs`: a listen URL names an IP address or `localhost` (Unix sockets aside).
fn check_bind_urls(urls: &str) -> Result<(), String> {
    for url in split_urls(urls) {
        if super::unix_socket(&url).is_some() {
            continue;
        }
        let host = host_port(&url)?.0;
        if host == "localhost" {
            continue;
        }
        if host.parse::<std::net::IpAddr>().is_err() {
            return Err(format!("expected IP in URL for binding ({url})"));
        }
    }
    Ok(())
}

/// etcd's `checkHostURLs`: every URL has a host and a port.
fn check_host_urls(urls: &str) -> Result<(), String> {
    for url in split_urls(urls) {
        if super::unix_socket(&url).is_some() {
            continue;
        }
        let (host, _) = host_port(&url)?;
        if host.is_empty() {
            return Err(format!("unexpected empty host ({url})"));
        }
    }
    Ok(())
}

/// The host (brackets removed) and port of `scheme://host:port[/path]`.
fn host_port(url: &str) -> Result<(&str, u16), String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = hostport
        .rsplit_once(':')
        .ok_or_else(|| format!("address {hostport}: missing port in address"))?;
    let port = port
        .parse()
        .map_err(|_| format!("address {hostport}: invalid port"))?;
    Ok((host.trim_start_matches('[').trim_end_matches(']'), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn check(args: &[&str]) -> Result<(), String> {
        let mut all = vec!["concord"];
        all.extend_from_slice(args);
        validate(&Config::try_parse_from(all).map_err(|e| e.to_string())?)
    }

    #[test]
    fn etcds_start_up_checks() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(
            check(&["--listen-client-urls", "http://node-a:2379"]),
            Err("expected IP in URL for binding (http://node-a:2379)".into())
        );
        assert!(check(&["--listen-peer-urls", "http://[::1]:2380,unix://p:1"]).is_ok());
        assert!(check(&["--advertise-client-urls", "http://node-a"])
            .is_err_and(|e| e.contains("must be \"host:port\"")));
        assert!(check(&["--advertise-client-urls", "https://node-a:2379"]).is_ok());
        assert_eq!(
            check(&["--heartbeat-interval", "300"]),
            Err("--election-timeout[1000ms] should be at least as 5 times as --heartbeat-interval[300ms]".into())
        );
        assert!(check(&["--election-timeout", "60000"]).is_err_and(|e| e.contains("too long")));
        assert!(check(&[
            "--tls-min-version",
            "TLS1.3",
            "--cipher-suites",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
        ])
        .is_err());
    }
}
