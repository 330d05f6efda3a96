//! The Redis side: one multiplexed connection, one Lua script, and the timeout around every
//! call.
//!
//! The script is sent by SHA (`EVALSHA`); when Redis answers `NOSCRIPT` (a restart, a
//! `SCRIPT FLUSH`, a failover to a replica that never saw it) the same call is sent once more
//! as `EVAL` with the script's text, which both runs it and caches it again. `EVAL` is routed
//! by its keys, so this works on Redis Cluster too (unlike `SCRIPT LOAD`, which goes to one
//! node). Every key of a cluster shares one hash tag: one slot per call.

use crate::error::ConfigError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind, Value};

/// The lease script, for one or two scopes of one node in one call (the global budget, and
/// the tenant of the call that asked). Keys: per scope, its window counters (a hash: window
/// index -> units granted) and its proposals (a hash: node -> "rate time_us"); every key of a
/// cluster shares one hash tag, so a call touches one slot. Arguments: node, window (µs),
/// 1 to ask for the next window instead of the current one, then per scope: units wanted,
/// the node's proposed rate (units/s, or `-` for none yet), how proposals combine (`min` or
/// `max`), and how long a proposal counts (µs).
///
/// Per scope it records the proposal, drops stale ones, takes the shared rate (the minimum
/// or maximum of the fresh proposals), and grants `min(wanted, left in the window,
/// limit / nodes)`, rounded up, where the window's limit is its part of `rate x time`: the
/// whole units of `rate x window`, plus one in the windows where the fractions carried so far
/// add up to one (computed from the fraction alone, so the arithmetic stays exact in Lua's
/// doubles). Redis's clock decides the window, so every node agrees.
pub(crate) const LEASE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local node, window = ARGV[1], tonumber(ARGV[2])
local idx = math.floor(now / window) + tonumber(ARGV[3])
local field = string.format('%.0f', idx)
local out = {idx, now}
for s = 0, #KEYS / 2 - 1 do
  local wkey, pkey = KEYS[2 * s + 1], KEYS[2 * s + 2]
  local at = 4 + 4 * s
  local want, rate, agg, ttl = tonumber(ARGV[at]), ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  if rate ~= '-' then
    redis.call('HSET', pkey, node, rate .. ' ' .. string.format('%.0f', now))
  end
  local shared, nodes = nil, 0
  local all = redis.call('HGETALL', pkey)
  for i = 1, #all, 2 do
    local r, seen = string.match(all[i + 1], '^(%S+) (%S+)$')
    r, seen = tonumber(r), tonumber(seen)
    if r and seen and now - seen <= ttl then
      nodes = nodes + 1
      if shared == nil or (agg == 'min' and r < shared) or (agg ~= 'min' and r > shared) then
        shared = r
      end
    else
      redis.call('HDEL', pkey, all[i])
    end
  end
  redis.call('PEXPIRE', pkey, math.ceil(ttl / 1000) * 2)
  if shared == nil then
    table.insert(out, 0)
    table.insert(out, 0)
    table.insert(out, 0)
    table.insert(out, 1)
  else
    local per = shared * window / 1000000
    local whole = math.floor(per)
    local frac = per - whole
    local limit = whole + math.floor(frac * (idx + 1)) - math.floor(frac * idx)
    local used = tonumber(redis.call('HGET', wkey, field) or '0')
    local left = math.max(0, limit - used)
    local grant = math.max(0, math.min(want, left, math.ceil(limit / nodes)))
    if grant > 0 then
      redis.call('HINCRBY', wkey, field, grant)
    end
    for _, f in ipairs(redis.call('HKEYS', wkey)) do
      if tonumber(f) < idx - 1 then
        redis.call('HDEL', wkey, f)
      end
    end
    redis.call('PEXPIRE', wkey, math.ceil(window / 1000) * 4)
    local exhausted = 0
    if left - grant <= 0 then
      exhausted = 1
    end
    table.insert(out, grant)
    table.insert(out, math.floor(shared * 1000))
    table.insert(out, nodes)
    table.insert(out, exhausted)
  end
end
return out
";

/// How the proposals of one scope combine into its shared rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    /// The smallest fresh proposal: any node's decrease binds everyone (the global budget).
    Min,
    /// The largest fresh proposal (a tenant's share: the node that sees most of its demand
    /// knows its share best; the global lease still caps the sum).
    Max,
}

/// One scope of a lease call.
#[derive(Debug, Clone)]
pub(crate) struct ScopeCall<'a> {
    pub(crate) window_key: &'a str,
    pub(crate) proposals_key: &'a str,
    pub(crate) want: u64,
    /// The node's proposal; `None` before it has one (it is then not recorded).
    pub(crate) rate: Option<f64>,
    pub(crate) combine: Combine,
    /// How long a proposal counts, µs.
    pub(crate) ttl_us: u64,
}

/// One lease call: one or two scopes, one round trip.
#[derive(Debug, Clone)]
pub(crate) struct LeaseCall<'a> {
    pub(crate) node: &'a str,
    pub(crate) window_us: u64,
    pub(crate) next: bool,
    pub(crate) scopes: Vec<ScopeCall<'a>>,
}

/// What the script answered for one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) granted: u64,
    /// The shared rate in thousandths of a unit per second.
    pub(crate) rate_milli: u64,
    pub(crate) nodes: u32,
    pub(crate) exhausted: bool,
}

/// What the script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) window: u64,
    pub(crate) redis_us: u64,
    /// One per scope, in the call's order.
    pub(crate) grants: Vec<Grant>,
}

/// Why a call failed.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// No connection (Redis was away at the last attempt).
    Down,
    /// No answer within the timeout.
    Timeout,
    /// Redis or the connection answered with an error.
    Redis(RedisError),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Down => f.write_str("not connected"),
            StoreError::Timeout => f.write_str("timed out"),
            StoreError::Redis(e) => write!(f, "{e}"),
        }
    }
}

/// The connection (replaced whole on reconnection; `generation` tells a failure on an old
/// connection from one on the current) and the script.
pub(crate) struct Store {
    client: Client,
    hash: String,
    timeout: Duration,
    conn: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    /// `NOSCRIPT` answers that were retried as `EVAL`.
    pub(crate) noscript: AtomicU64,
}

impl Store {
    /// A store for `url` (no I/O yet).
    pub(crate) fn new(url: &str, timeout: Duration) -> Result<Self, ConfigError> {
        let client = Client::open(url)
            .map_err(|e| ConfigError::new("distributed.url", format!("{url:?} is invalid: {e}")))?;
        Ok(Store {
            client,
            hash: redis::Script::new(LEASE_SCRIPT).get_hash().to_owned(),
            timeout,
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            noscript: AtomicU64::new(0),
        })
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(u64, MultiplexedConnection)>> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a connection is held.
    pub(crate) fn connected(&self) -> bool {
        self.slot().is_some()
    }

    /// Opens a new connection (each attempt bounded by the timeout, at least 100 ms for the
    /// TCP handshake) and keeps it.
    pub(crate) async fn connect(&self) -> Result<(), StoreError> {
        let limit = self.timeout.max(Duration::from_millis(100));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(limit))
            .set_response_timeout(Some(self.timeout));
        let conn = tokio::time::timeout(
            limit,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| StoreError::Timeout)?
        .map_err(StoreError::Redis)?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.slot() = Some((generation, conn));
        Ok(())
    }

    /// Drops the connection if it is still generation `generation`.
    fn disconnect(&self, generation: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }

    /// Runs the lease script: by SHA, then as `EVAL` on `NOSCRIPT`; never longer than the
    /// timeout in all. A failure drops the connection (the reconnection loop opens another).
    pub(crate) async fn lease(&self, call: &LeaseCall<'_>) -> Result<Reply, StoreError> {
        let Some((generation, mut conn)) = self.slot().clone() else {
            return Err(StoreError::Down);
        };
        let result = match tokio::time::timeout(self.timeout, self.run(&mut conn, call)).await {
            Ok(Ok(value)) => parse(&value, call.scopes.len()).ok_or_else(|| {
                StoreError::Redis(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "lease script answer",
                    format!("{value:?}"),
                )))
            }),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout),
        };
        if result.is_err() {
            self.disconnect(generation);
        }
        result
    }

    async fn run(
        &self,
        conn: &mut MultiplexedConnection,
        call: &LeaseCall<'_>,
    ) -> Result<Value, RedisError> {
        let script = |verb: &str, body: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(body).arg(call.scopes.len() * 2);
            for scope in &call.scopes {
                cmd.arg(scope.window_key).arg(scope.proposals_key);
            }
            cmd.arg(call.node)
                .arg(call.window_us)
                .arg(u8::from(call.next));
            for scope in &call.scopes {
                cmd.arg(scope.want)
                    .arg(match scope.rate {
                        Some(rate) => format!("{rate}"),
                        None => "-".to_owned(),
                    })
                    .arg(match scope.combine {
                        Combine::Min => "min",
                        Combine::Max => "max",
                    })
                    .arg(scope.ttl_us);
            }
            cmd
        };
        match script("EVALSHA", &self.hash).query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.noscript.fetch_add(1, Ordering::Relaxed);
                script("EVAL", LEASE_SCRIPT).query_async(conn).await
            }
            other => other,
        }
    }
}

fn parse(value: &Value, scopes: usize) -> Option<Reply> {
    let Value::Array(items) = value else {
        return None;
    };
    let int = |i: usize| match items.get(i)? {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    if items.len() != 2 + 4 * scopes {
        return None;
    }
    let grants = (0..scopes)
        .map(|s| {
            let at = 2 + 4 * s;
            Some(Grant {
                granted: int(at)?,
                rate_milli: int(at + 1)?,
                nodes: u32::try_from(int(at + 2)?).ok()?,
                exhausted: int(at + 3)? != 0,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Reply {
        window: int(0)?,
        redis_us: int(1)?,
        grants,
    })
}
