//! Fencing tokens in action: a lock holder that pauses past its lease loses the lock, and its
//! late write is rejected by the protected resource because its token is lower than one the
//! resource has already seen.
//!
//! ```sh
//! cargo run --release &                                    # a Concord server on :2379
//! cargo run --example fencing [http://127.0.0.1:2379]
//! ```

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::{LeaseGrantRequest, RangeRequest};
use concord::pb::v3lockpb::lock_client::LockClient;
use concord::pb::v3lockpb::{LockRequest, UnlockRequest};
use std::time::Duration;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The protected resource (say, a storage service): it remembers the highest fencing token it
/// has seen and rejects any write carrying a lower one.
#[derive(Default)]
struct Storage {
    highest_token: i64,
    data: Vec<String>,
}

impl Storage {
    fn write(&mut self, token: i64, what: &str) -> std::result::Result<(), String> {
        if token < self.highest_token {
            return Err(format!(
                "rejected {what:?}: token {token} < highest seen {}",
                self.highest_token
            ));
        }
        self.highest_token = token;
        self.data.push(what.to_string());
        Ok(())
    }
}

/// Takes lock `name` with a lease of `ttl` seconds; returns the lock key and its fencing token
/// (the key's create_revision).
async fn acquire(endpoint: &str, name: &str, ttl: i64) -> Result<(Vec<u8>, i64)> {
    let lease = LeaseClient::connect(endpoint.to_string())
        .await?
        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
        .await?
        .into_inner()
        .id;
    let key = LockClient::connect(endpoint.to_string())
        .await?
        .lock(LockRequest {
            name: name.as_bytes().to_vec(),
            lease,
        })
        .await?
        .into_inner()
        .key;
    let token = KvClient::connect(endpoint.to_string())
        .await?
        .range(RangeRequest {
            key: key.clone(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .kvs
        .first()
        .map(|kv| kv.create_revision)
        .ok_or("lock key vanished")?;
    Ok((key, token))
}

#[tokio::main]
async fn main() -> Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:2379".to_string());
    let mut storage = Storage::default();

    // Client A takes the lock with a 2 s lease and never keeps it alive.
    let (_, token_a) = acquire(&endpoint, "fencing-demo", 2).await?;
    println!("A holds the lock with token {token_a}");
    storage.write(token_a, "A: first write")?;

    // A pauses (a long GC, a stopped VM...) past its lease. Meanwhile B asks for the lock and
    // gets it as soon as A's lease expires.
    println!("A pauses...");
    let (key_b, token_b) = acquire(&endpoint, "fencing-demo", 30).await?;
    println!("B holds the lock with token {token_b}");
    storage.write(token_b, "B: write")?;

    // A wakes up, still believing it holds the lock, and writes: the resource says no.
    tokio::time::sleep(Duration::from_millis(100)).await;
    match storage.write(token_a, "A: late write") {
        Ok(()) => println!("BUG: the stale write was accepted"),
        Err(e) => println!("A's late write {e}"),
    }
    LockClient::connect(endpoint.clone())
        .await?
        .unlock(UnlockRequest { key: key_b })
        .await?;
    println!("resource holds: {:?}", storage.data);
    Ok(())
}
