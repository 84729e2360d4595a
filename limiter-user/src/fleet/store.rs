//! The shared store: one Redis (a connection manager that reconnects),
//! or a Redis Cluster.
//!
//! Key layout, the same on both: one hash per (class, prefix),
//! `lim:{CLASS|CIDR}`, whose fields are slice numbers (on the wall clock,
//! so the same on every node) and values the fleet's total count in that
//! slice. The braces are a hash tag: all of a prefix's counts live on one
//! cluster shard, so a prefix's commands always go to one node. A key
//! expires a window and a slice after its last write; each node deletes
//! the field that left the window when it starts a new slice.
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

/// The key of `class`'s counts for `cidr`.
#[must_use]
pub fn key(class: &str, cidr: &str) -> String {
    format!("lim:{{{class}|{cidr}}}")
}

/// The hash of node heartbeats (node name -> Unix ms of its last sync).
pub const NODES_KEY: &str = "lim:nodes";

/// What one prefix sends in a sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub key: String,
    /// (slice, units) to add.
    pub deltas: Vec<(u64, u64)>,
    /// Slices of the window to read back, oldest first.
    pub window: Vec<u64>,
    /// A slice that left the window, to delete, if this push starts a new
    /// slice.
    pub expired: Option<u64>,
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
        for (s, d) in &self.deltas {
            p.cmd("HINCRBY").arg(&self.key).arg(*s).arg(*d).ignore();
        }
        if let Some(s) = self.expired {
            p.cmd("HDEL").arg(&self.key).arg(s).ignore();
        }
        if !self.deltas.is_empty() {
            p.cmd("PEXPIRE").arg(&self.key).arg(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)).ignore();
        }
    }

    /// The read of the window (one reply).
    pub fn read(&self, p: &mut Pipeline) {
        p.cmd("HMGET").arg(&self.key).arg(&self.window);
    }

    /// Commands this push sends.
    #[must_use]
    pub fn commands(&self) -> usize {
        self.deltas.len() + usize::from(self.expired.is_some()) + usize::from(!self.deltas.is_empty()) + 1
    }
}

/// The fleet's totals per slice of the window, from an HMGET reply.
#[must_use]
pub fn totals(window: &[u64], reply: &Value) -> Vec<(u64, u64)> {
    let Value::Array(items) = reply else { return Vec::new() };
    window
        .iter()
        .zip(items)
        .filter_map(|(s, v)| {
            let n = match v {
                Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok()?,
                Value::Int(i) => u64::try_from(*i).ok()?,
                _ => return None,
            };
            Some((*s, n))
        })
        .collect()
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
        if f.is_cluster() {
            let client = ClusterClient::builder(f.store.clone())
                .connection_timeout(f.timeout)
                .response_timeout(f.timeout)
                .retries(1)
                .build()?;
            return Ok(Self::Cluster(client.get_async_connection().await?));
        }
        let client = redis::Client::open(f.store[0].as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(f.timeout))
            .set_response_timeout(Some(f.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        Ok(Self::Single(client.get_connection_manager_with_config(config).await?))
    }

    /// Send every push and the heartbeat; each push's window totals, in
    /// order. `read_nodes`: read the heartbeats back too. `barrier`: wait
    /// for the round's other nodes before reading (single Redis only; a
    /// cluster's prefixes live on several shards).
    pub async fn exchange(
        &mut self,
        pushes: &[Push],
        node: &str,
        now_ms: u64,
        read_nodes: bool,
        barrier: Option<Barrier>,
    ) -> Result<(Vec<Vec<(u64, u64)>>, Option<Vec<(String, u64)>>), RedisError> {
        let mut beat = redis::pipe();
        beat.cmd("HSET").arg(NODES_KEY).arg(node).arg(now_ms).ignore();
        if read_nodes {
            beat.cmd("HGETALL").arg(NODES_KEY);
        }
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
                // Ignored commands give no reply: one per HGETALL and HMGET.
                let replies: Vec<Value> = all.query_async(c).await?;
                let mut it = replies.into_iter();
                let nodes = if read_nodes { it.next().map(|v| heartbeats(&v)) } else { None };
                let windows = pushes.iter().zip(it).map(|(p, v)| totals(&p.window, &v)).collect();
                Ok((windows, nodes))
            }
            Self::Cluster(c) => {
                let mut set = tokio::task::JoinSet::new();
                for (i, p) in pushes.iter().enumerate() {
                    let mut c = c.clone();
                    let pipe = p.pipeline();
                    let window = p.window.clone();
                    set.spawn(async move {
                        let r: Result<Vec<Value>, RedisError> = pipe.query_async(&mut c).await;
                        r.map(|v| (i, v.last().map(|v| totals(&window, v)).unwrap_or_default()))
                    });
                }
                let replies: Vec<Value> = beat.query_async(c).await?;
                let nodes = if read_nodes { replies.first().map(heartbeats) } else { None };
                let mut windows = vec![Vec::new(); pushes.len()];
                while let Some(done) = set.join_next().await {
                    let (i, w) = done.map_err(|e| RedisError::from(std::io::Error::other(e.to_string())))??;
                    windows[i] = w;
                }
                Ok((windows, nodes))
            }
        }
    }
}

/// Heartbeats read at most (a store shared with careless writers must not
/// grow the daemon's memory).
const MAX_NODES: usize = 4096;

/// (node, Unix ms) pairs of an HGETALL reply, at most [`MAX_NODES`].
fn heartbeats(v: &Value) -> Vec<(String, u64)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match v {
        Value::Map(pairs) => {
            pairs.iter().take(MAX_NODES).filter_map(|(k, v)| Some((text(k)?, text(v)?.parse().ok()?))).collect()
        }
        Value::Array(items) => items
            .chunks(2)
            .take(MAX_NODES)
            .filter_map(|kv| Some((text(&kv[0])?, text(kv.get(1)?)?.parse().ok()?)))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_has_one_hash_tagged_key_and_its_commands_in_order() {
        let k = key("syn", "198.18.5.0/24");
        assert_eq!(k, "lim:{syn|198.18.5.0/24}");
        // Redis Cluster hashes only what is between the first braces.
        let tag = &k[k.find('{').unwrap() + 1..k.find('}').unwrap()];
        assert_eq!(tag, "syn|198.18.5.0/24");
        let p = Push {
            key: k,
            deltas: vec![(10, 3), (11, 2)],
            window: (0..12).collect(),
            expired: Some(u64::MAX),
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
        let reply = Value::Array(vec![Value::BulkString(b"4".to_vec()), Value::Nil, Value::BulkString(b"9".to_vec())]);
        assert_eq!(totals(&[5, 6, 7], &reply), vec![(5, 4), (7, 9)]);
    }
}
