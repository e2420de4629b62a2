//! Durability: puts of unique keys; every acknowledged one must be there after the final
//! full-cluster restart.

use std::sync::Arc;

use super::Ctx;
use crate::client::Outcome;
use crate::history::AckedPut;
use crate::rng::Rng;

/// The prefix of the unique keys.
pub const PREFIX: &str = "d/";

/// One writer of unique keys, until stopped.
pub async fn run(ctx: Arc<Ctx>, client: u32, mut rng: Rng) {
    let mut seq = 0u64;
    while !ctx.stopped() {
        seq += 1;
        let key = format!("{PREFIX}{client}/{seq:08}");
        let m = rng.below(ctx.clients.len());
        if let Outcome::Ok(revision) = ctx.put(m, &key, "durable", 0).await {
            let at = ctx.clock.now();
            ctx.rec.get().durable_puts.push(AckedPut {
                key,
                value: "durable".into(),
                revision,
                at,
            });
        }
        super::think(&mut rng, 20).await;
    }
}
