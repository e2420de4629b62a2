//! Message-size errors as grpc-go (and so etcd) reports them: a request over the server's
//! receive limit fails with `ResourceExhausted` "grpc: received message larger than max (N vs.
//! M)", where tonic would say `OutOfRange`, a code etcd clients read as "revision compacted".

use http::{HeaderValue, Response};

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
const OUT_OF_RANGE: &[u8] = b"11";
const RESOURCE_EXHAUSTED: &str = "8";
const TONIC_TOO_LARGE: &str = "decoded message length too large";

/// Rewrites tonic's oversized-message status (always a trailers-only response) to grpc-go's.
pub fn grpc_go_size_errors<B>(mut resp: Response<B>) -> Response<B> {
    let headers = resp.headers_mut();
    if headers.get(GRPC_STATUS).map(HeaderValue::as_bytes) != Some(OUT_OF_RANGE) {
        return resp;
    }
    let Some(msg) = headers
        .get(GRPC_MESSAGE)
        .and_then(|m| m.to_str().ok())
        .map(percent_decode)
    else {
        return resp;
    };
    if !msg.contains(TONIC_TOO_LARGE) {
        return resp;
    }
    let numbers: Vec<&str> = msg
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let text = match numbers.as_slice() {
        [found, limit, ..] => {
            format!("grpc: received message larger than max ({found} vs. {limit})")
        }
        _ => "grpc: received message larger than max".to_string(),
    };
    headers.insert(GRPC_STATUS, HeaderValue::from_static(RESOURCE_EXHAUSTED));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(&text)) {
        headers.insert(GRPC_MESSAGE, v);
    }
    resp
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_tonic_size_errors() {
        let resp = Response::builder()
            .header(GRPC_STATUS, "11")
            .header(
                GRPC_MESSAGE,
                "Error,%20decoded%20message%20length%20too%20large:%20found%203000011%20bytes,%20the%20limit%20is:%202097152%20bytes",
            )
            .body(())
            .unwrap_or_default();
        let out = grpc_go_size_errors(resp);
        assert_eq!(
            out.headers().get(GRPC_STATUS).map(|v| v.as_bytes()),
            Some(&b"8"[..])
        );
        let msg = out
            .headers()
            .get(GRPC_MESSAGE)
            .and_then(|v| v.to_str().ok());
        assert_eq!(
            msg.map(percent_decode).as_deref(),
            Some("grpc: received message larger than max (3000011 vs. 2097152)")
        );
        let compacted = Response::builder()
            .header(GRPC_STATUS, "11")
            .header(
                GRPC_MESSAGE,
                "etcdserver: mvcc: required revision has been compacted",
            )
            .body(())
            .unwrap_or_default();
        let out = grpc_go_size_errors(compacted);
        assert_eq!(
            out.headers().get(GRPC_STATUS).map(|v| v.as_bytes()),
            Some(OUT_OF_RANGE)
        );
    }
}
