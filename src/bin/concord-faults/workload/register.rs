//! Registers: linearizable gets, puts and compare-and-set txns on a few keys. Keys change every
//! few seconds (a new generation), which keeps each key's history small for the checker.

use std::collections::HashMap;
use std::sync::Arc;

use concord::pb::etcdserverpb::{compare, request_op, Compare, PutRequest, RequestOp, TxnRequest};

use super::Ctx;
use crate::client::{bounded, Outcome, CALL_TIMEOUT};
use crate::history::{RegInput, RegOp, RegOutput, NEVER};
use crate::rng::Rng;

/// Keys per generation.
const KEYS: usize = 3;
/// How long a generation lasts, in µs.
const GENERATION_US: u64 = 4_000_000;

/// One register client, until stopped.
pub async fn run(ctx: Arc<Ctx>, client: u32, mut rng: Rng) {
    let mut seq = 0u64;
    let mut last_seen: HashMap<String, u64> = HashMap::new();
    while !ctx.stopped() {
        let key = format!("r/{}/{}", ctx.clock.now() / GENERATION_US, rng.below(KEYS));
        let m = rng.below(ctx.clients.len());
        seq += 1;
        let fresh = (u64::from(client) << 32) | seq;
        let input = match rng.below(10) {
            0..=3 => RegInput::Read,
            4..=6 => RegInput::Write(fresh),
            _ => RegInput::Cas(last_seen.get(&key).copied().unwrap_or(0), fresh),
        };
        let call = ctx.clock.now();
        let output = execute(&ctx, m, &key, input).await;
        let ret = if output == RegOutput::Unknown {
            NEVER
        } else {
            ctx.clock.now()
        };
        match (input, output) {
            (_, RegOutput::Read(v)) => {
                last_seen.insert(key.clone(), v);
            }
            (RegInput::Write(v), RegOutput::Written)
            | (RegInput::Cas(_, v), RegOutput::Cas(true)) => {
                last_seen.insert(key.clone(), v);
            }
            _ => {}
        }
        ctx.rec.get().registers.push(RegOp {
            client,
            key,
            call,
            ret,
            input,
            output,
        });
        super::think(&mut rng, 15).await;
    }
}

/// Performs one register operation through member `m`.
pub async fn execute(ctx: &Ctx, m: usize, key: &str, input: RegInput) -> RegOutput {
    match input {
        RegInput::Read => match ctx.get(m, key).await {
            Outcome::Ok(r) => RegOutput::Read(
                r.kvs
                    .first()
                    .and_then(|kv| String::from_utf8_lossy(&kv.value).parse().ok())
                    .unwrap_or(0),
            ),
            _ => RegOutput::Unknown,
        },
        RegInput::Write(v) => match ctx.put(m, key, &v.to_string(), 0).await {
            Outcome::Ok(_) => RegOutput::Written,
            _ => RegOutput::Unknown,
        },
        RegInput::Cas(from, to) => {
            let compare = if from == 0 {
                Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Create as i32,
                    key: key.into(),
                    target_union: Some(compare::TargetUnion::CreateRevision(0)),
                    range_end: Vec::new(),
                }
            } else {
                Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Value as i32,
                    key: key.into(),
                    target_union: Some(compare::TargetUnion::Value(from.to_string().into())),
                    range_end: Vec::new(),
                }
            };
            let put = RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.into(),
                    value: to.to_string().into(),
                    ..Default::default()
                })),
            };
            let txn = TxnRequest {
                compare: vec![compare],
                success: vec![put],
                failure: Vec::new(),
            };
            let call = ctx.clock.now();
            let out = bounded(CALL_TIMEOUT, ctx.clients.kv(m).txn(txn)).await;
            ctx.note(m, "txn", call, out.call_outcome());
            match out {
                Outcome::Ok(r) => RegOutput::Cas(r.succeeded),
                _ => RegOutput::Unknown,
            }
        }
    }
}
