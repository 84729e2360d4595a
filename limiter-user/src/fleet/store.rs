//! The shared store: one Redis (a connection manager that reconnects),
//! or a Redis Cluster.
//!
//! Key layout, the same on both: one hash per (class, prefix),
//! `lim:{CLASS|CIDR}`, whose fields are `NODE/SLICE` (the slice number on
//! the writer's wall clock) and values that node's count in that slice.
//! Each node writes only its own fields and reads only the fields of the
//! peers it knows from their heartbeats (at most [`MAX_PEERS`]), by name:
//! a reader clamps each peer's share of a window at the class's limit and
//! ignores slices outside the window, so neither a hostile writer nor a
//! huge key can make it count more than a peer legitimately could, or
//! stall its sync. The braces are a hash tag: all of a prefix's counts
//! live on one cluster shard, so a prefix's commands always go to one
//! node. A key expires a window and a slice after its last write; each
//! node deletes its own fields that left the window when it starts a new
//! slice.
//!
//! Heartbeats: `lim:nodes`, field the node's name, value `NODE_MS:STORE_MS`
//! (the node's wall clock and the store's, at the write): each node's
//! clock offset from the store, so peers' slices are read on this node's
//! clock and a node more than one slice off is reported.
//!
//! One sync is one round trip to a single Redis (all prefixes in one
//! pipeline); on a cluster, one pipeline per prefix, all in flight at
//! once over the cluster connection's multiplexed links.

use std::time::Duration;

use redis::{
    Pipeline, RedisError, Value,
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
};

use crate::policy::fleet::Fleet;

/// The key of `class`'s counts for `cidr`. `lim2`: a value carries the
/// position of the slice's first admission above its count since the
/// window became exact at its trailing edge; a node of the older layout
/// (`lim:`) would read that as a huge count, so the two never share keys
/// (during a rolling upgrade each counts its own generation's nodes).
#[must_use]
pub fn key(class: &str, cidr: &str) -> String {
    format!("lim2:{{{class}|{cidr}}}")
}

/// The hash of node heartbeats (node name -> `NODE_MS:STORE_MS`).
pub const NODES_KEY: &str = "lim:nodes";
/// Peers whose counts are read at most (the freshest heartbeats).
pub const MAX_PEERS: usize = 64;

/// The field of `node`'s count in `slice`.
#[must_use]
pub fn field(node: &str, slice: u64) -> String {
    format!("{node}/{slice}")
}

/// The heartbeat: this node's wall clock and the store's (`TIME`), in one
/// value; returns the store's Unix ms.
const HEARTBEAT_LUA: &str = "local t = redis.call('TIME') \
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ms) \
return ms";

/// What one prefix sends in a sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub key: String,
    /// (own field, units) to add.
    pub deltas: Vec<(String, u64)>,
    /// The peers' fields to read back (see [`field`]); none: nothing read.
    pub read: Vec<String>,
    /// Own fields that left the window, to delete, if this push starts a
    /// new slice.
    pub expired: Vec<String>,
    /// How long the key lives after this write.
    pub ttl: Duration,
}

impl Push {
    /// Its commands; the last one reads the window back.
    #[must_use]
    pub fn pipeline(&self) -> Pipeline {
        let mut p = redis::pipe();
        self.writes(&mut p);
        self.read(&mut p);
        p
    }

    /// The writes (no replies).
    pub fn writes(&self, p: &mut Pipeline) {
        for (f, d) in &self.deltas {
            p.cmd("HINCRBY").arg(&self.key).arg(f).arg(*d).ignore();
        }
        if !self.expired.is_empty() {
            p.cmd("HDEL").arg(&self.key).arg(&self.expired).ignore();
        }
        if !self.deltas.is_empty() {
            p.cmd("PEXPIRE").arg(&self.key).arg(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)).ignore();
        }
    }

    /// The read of the peers' fields (one reply), if there is any to read.
    pub fn read(&self, p: &mut Pipeline) {
        if !self.read.is_empty() {
            p.cmd("HMGET").arg(&self.key).arg(&self.read);
        }
    }

    /// Commands this push sends.
    #[must_use]
    pub fn commands(&self) -> usize {
        self.deltas.len()
            + usize::from(!self.expired.is_empty())
            + usize::from(!self.deltas.is_empty())
            + usize::from(!self.read.is_empty())
    }
}

/// The values of an HMGET reply, in the order of its fields (0 for a
/// missing or unreadable one).
#[must_use]
pub fn values(reply: &Value) -> Vec<u64> {
    let Value::Array(items) = reply else { return Vec::new() };
    items
        .iter()
        .map(|v| match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
            Value::Int(i) => u64::try_from(*i).unwrap_or(0),
            _ => 0,
        })
        .collect()
}

/// The heartbeats read back: each node's (wall ms, store ms at its last
/// write), and how many fields `lim:nodes` holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Beats {
    pub nodes: Vec<(String, u64, u64)>,
    pub fields: u64,
}

/// The round barrier (single Redis): every node's sync on the same
/// wall-clock tick counts itself in after its writes; the last of the
/// fleet's `nodes` to do so releases them all, and each node reads the
/// totals only once released (or after `wait`), so every node's view is
/// of the same moment, the whole fleet's writes of the round included.
#[derive(Clone, Copy, Debug)]
pub struct Barrier {
    pub round: u64,
    pub nodes: u32,
    pub wait: Duration,
}

const BARRIER_LUA: &str = "local n = redis.call('INCR', KEYS[1]) \
redis.call('PEXPIRE', KEYS[1], ARGV[2]) \
if n == tonumber(ARGV[1]) then \
  for i = 1, n do redis.call('RPUSH', KEYS[2], 1) end \
  redis.call('PEXPIRE', KEYS[2], ARGV[2]) \
end \
return n";

/// A connection to the store.
#[derive(Clone)]
pub enum Store {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Store {
    /// Connect (once; a single Redis then reconnects by itself).
    pub async fn connect(f: &Fleet) -> Result<Self, RedisError> {
        // Read at each connect, so a rotated password is taken at the next.
        let password = match &f.password_file {
            Some(p) => Some(crate::policy::fleet::read_password(p).map_err(|e| {
                RedisError::from((redis::ErrorKind::InvalidClientConfig, "password file", e.to_string()))
            })?),
            None => None,
        };
        if f.is_cluster() {
            let mut b = ClusterClient::builder(f.store.clone())
                .connection_timeout(f.timeout)
                .response_timeout(f.timeout)
                .retries(1);
            if let Some(pw) = &password {
                b = b.password(pw);
            }
            return Ok(Self::Cluster(b.build()?.get_async_connection().await?));
        }
        let mut info = redis::IntoConnectionInfo::into_connection_info(f.store[0].as_str())?;
        if let Some(pw) = &password {
            let settings = info.redis_settings().clone().set_password(pw);
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(f.timeout))
            .set_response_timeout(Some(f.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        Ok(Self::Single(client.get_connection_manager_with_config(config).await?))
    }

    /// Send every push and the heartbeat; each push's peer values (in the
    /// order of its `read` fields; empty when it reads none), the store's
    /// clock, and with `read_nodes` (the peers known so far, asked for by
    /// name) the heartbeats. `barrier`: wait for the round's other nodes
    /// before reading (single Redis only; a cluster's prefixes live on
    /// several shards).
    pub async fn exchange(
        &mut self,
        pushes: &[Push],
        node: &str,
        now_ms: u64,
        read_nodes: Option<&[String]>,
        barrier: Option<Barrier>,
    ) -> Result<Exchange, RedisError> {
        let mut beat = redis::pipe();
        beat.cmd("EVAL").arg(HEARTBEAT_LUA).arg(1).arg(NODES_KEY).arg(node).arg(now_ms);
        if let Some(known) = read_nodes {
            // Bounded whatever the hash holds: its size, one page of a scan,
            // and the peers already known by name.
            beat.cmd("HLEN").arg(NODES_KEY);
            beat.cmd("HSCAN").arg(NODES_KEY).arg(0).arg("COUNT").arg(NODES_PAGE);
            if !known.is_empty() {
                beat.cmd("HMGET").arg(NODES_KEY).arg(known);
            }
        }
        let beats = |it: &mut dyn Iterator<Item = Value>| -> (u64, Option<Beats>) {
            let store_ms = it.next().and_then(|v| int(&v)).unwrap_or(0);
            let Some(known) = read_nodes else { return (store_ms, None) };
            let fields = it.next().and_then(|v| int(&v)).unwrap_or(0);
            let mut nodes = it.next().map(|v| scanned(&v)).unwrap_or_default();
            if !known.is_empty()
                && let Some(v) = it.next()
            {
                let named = known.iter().zip(match v {
                    Value::Array(items) => items,
                    _ => Vec::new(),
                });
                nodes.extend(named.filter_map(|(n, v)| Some((n.clone(), text(&v)?))));
            }
            let mut parsed: Vec<(String, u64, u64)> =
                nodes.into_iter().filter_map(|(n, v)| parse_beat(&v).map(|(a, b)| (n, a, b))).collect();
            parsed.sort();
            parsed.dedup_by(|a, b| a.0 == b.0);
            parsed.truncate(MAX_NODES);
            (store_ms, Some(Beats { nodes: parsed, fields }))
        };
        match self {
            Self::Single(c) => {
                // One pipeline: the heartbeat, every write, the barrier,
                // then the reads.
                let mut all = beat;
                for p in pushes {
                    p.writes(&mut all);
                }
                if let Some(b) = barrier {
                    let (count, ready) = (format!("lim:round:{}", b.round), format!("lim:ready:{}", b.round));
                    let ttl = 10 * u64::try_from(b.wait.as_millis()).unwrap_or(0).max(1_000);
                    all.cmd("EVAL").arg(BARRIER_LUA).arg(2).arg(&count).arg(&ready).arg(b.nodes).arg(ttl).ignore();
                    all.cmd("BLPOP").arg(&ready).arg(format!("{:.3}", b.wait.as_secs_f64().max(0.001))).ignore();
                }
                for p in pushes {
                    p.read(&mut all);
                }
                // Ignored commands give no reply: one per read.
                let replies: Vec<Value> = all.query_async(c).await?;
                let mut it = replies.into_iter();
                let (store_ms, beats) = beats(&mut it);
                let windows =
                    pushes
                        .iter()
                        .map(|p| {
                            if p.read.is_empty() {
                                Vec::new()
                            } else {
                                it.next().map(|v| values(&v)).unwrap_or_default()
                            }
                        })
                        .collect();
                Ok(Exchange { windows, store_ms, beats })
            }
            Self::Cluster(c) => {
                let mut set = tokio::task::JoinSet::new();
                for (i, p) in pushes.iter().enumerate() {
                    let mut c = c.clone();
                    let pipe = p.pipeline();
                    let reads = !p.read.is_empty();
                    set.spawn(async move {
                        let r: Result<Vec<Value>, RedisError> = pipe.query_async(&mut c).await;
                        r.map(|v| (i, if reads { v.last().map(values).unwrap_or_default() } else { Vec::new() }))
                    });
                }
                let replies: Vec<Value> = beat.query_async(c).await?;
                let (store_ms, beats) = beats(&mut replies.into_iter());
                let mut windows = vec![Vec::new(); pushes.len()];
                while let Some(done) = set.join_next().await {
                    let (i, w) = done.map_err(|e| RedisError::from(std::io::Error::other(e.to_string())))??;
                    windows[i] = w;
                }
                Ok(Exchange { windows, store_ms, beats })
            }
        }
    }
}

/// What one exchange brought back.
#[derive(Clone, Debug, Default)]
pub struct Exchange {
    /// Each push's peer values, in the order of its `read` fields.
    pub windows: Vec<Vec<u64>>,
    /// The store's Unix ms when it took this node's heartbeat.
    pub store_ms: u64,
    pub beats: Option<Beats>,
}

/// Heartbeats kept at most (a store shared with careless writers must not
/// grow the daemon's memory).
const MAX_NODES: usize = 4096;
/// Fields of `lim:nodes` one scan page asks for.
const NODES_PAGE: usize = 1024;

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        v => text(v)?.parse().ok(),
    }
}

/// (field, value) pairs of an HSCAN reply page, at most [`MAX_NODES`].
fn scanned(v: &Value) -> Vec<(String, String)> {
    let Value::Array(parts) = v else { return Vec::new() };
    match parts.get(1) {
        Some(Value::Array(items)) => {
            items.chunks(2).take(MAX_NODES).filter_map(|kv| Some((text(&kv[0])?, text(kv.get(1)?)?))).collect()
        }
        Some(Value::Map(pairs)) => {
            pairs.iter().take(MAX_NODES).filter_map(|(k, v)| Some((text(k)?, text(v)?))).collect()
        }
        _ => Vec::new(),
    }
}

/// A heartbeat's (node ms, store ms); a heartbeat of a build before the
/// store's clock was kept has the node's only (store ms 0: no offset known).
#[must_use]
pub fn parse_beat(v: &str) -> Option<(u64, u64)> {
    match v.split_once(':') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
        None => Some((v.parse().ok()?, 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_has_one_hash_tagged_key_and_its_commands_in_order() {
        let k = key("syn", "198.18.5.0/24");
        assert_eq!(k, "lim2:{syn|198.18.5.0/24}");
        // Redis Cluster hashes only what is between the first braces.
        let tag = &k[k.find('{').unwrap() + 1..k.find('}').unwrap()];
        assert_eq!(tag, "syn|198.18.5.0/24");
        let p = Push {
            key: k,
            deltas: vec![(field("a", 10), 3), (field("a", 11), 2)],
            read: vec![field("b", 10), field("b", 11)],
            expired: vec![field("a", 0)],
            ttl: Duration::from_secs(65),
        };
        let cmds: Vec<String> = p
            .pipeline()
            .cmd_iter()
            .map(|c| {
                String::from_utf8_lossy(&c.get_packed_command()).split("\r\n").nth(2).unwrap_or_default().to_owned()
            })
            .collect();
        assert_eq!(cmds, ["HINCRBY", "HINCRBY", "HDEL", "PEXPIRE", "HMGET"]);
        assert_eq!(p.commands(), 5);
        let reply = Value::Array(vec![Value::BulkString(b"4".to_vec()), Value::Nil, Value::BulkString(b"x".to_vec())]);
        assert_eq!(values(&reply), vec![4, 0, 0]);
        assert_eq!(parse_beat("1700000000123:1700000000100"), Some((1_700_000_000_123, 1_700_000_000_100)));
        assert_eq!(parse_beat("1700000000123"), Some((1_700_000_000_123, 0)));
        assert_eq!(parse_beat("junk"), None);
    }
}
