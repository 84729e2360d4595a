//! `limiter fleet status`.

use crate::control::client::Client;

pub fn status(client: Client, json: bool) -> anyhow::Result<()> {
    let Some(f) = client.fleet_status()? else {
        if json {
            return super::print_json(&serde_json::Value::Null);
        }
        anyhow::bail!(
            "no fleet sync: the daemon's policy has no [fleet] section (fleet-scope quotas count this host only)"
        );
    };
    if json {
        return super::print_json(&f);
    }
    let now_ms = crate::clock::unix_millis();
    let store = if f.cluster { "Redis Cluster" } else { "Redis" };
    println!("node        {}", f.node);
    println!("store       {} ({store}): {}", f.store.join(", "), if f.store_up { "up" } else { "DOWN" });
    if let Some(t) = f.down_since_unix_ms {
        #[expect(clippy::cast_precision_loss, reason = "display")]
        let secs = now_ms.saturating_sub(t) as f64 / 1e3;
        println!("outage      {secs:.1} s so far (deciding on the last view plus local counts)");
    }
    println!("nodes seen  {} ({})", f.nodes_seen.len(), f.nodes_seen.join(", "));
    println!("clock       {:+} ms off the store's", f.clock_offset_ms);
    for (n, o) in &f.skewed {
        println!(
            "SKEWED      {n}: {o:+} ms off the store's clock (its slices are read on this node's clock; fix its time)"
        );
    }
    if f.heartbeat_fields > 4096 {
        println!(
            "heartbeats  lim:nodes holds {} fields (read one page at a time; someone writes to it)",
            f.heartbeat_fields
        );
    }
    match f.last_sync_unix_ms {
        Some(t) => println!("last sync   {} ms ago (every {} ms)", now_ms.saturating_sub(t), f.sync_interval_ms),
        None => println!("last sync   never"),
    }
    #[expect(clippy::cast_precision_loss, reason = "display")]
    let mean = if f.syncs == 0 { 0.0 } else { f.latency_sum_secs * 1e3 / f.syncs as f64 };
    println!("latency     last {:.2} ms, mean {mean:.2} ms, max {:.2} ms", f.last_latency_ms, f.max_latency_ms);
    let errors: Vec<String> = f.errors.iter().map(|(k, n)| format!("{} {n}", k.label())).collect();
    println!("syncs       {} ok; errors: {}", f.syncs, errors.join(", "));
    println!("outages     {} ({:.1} s in all before this one)", f.outages, f.outage_secs_total);
    println!(
        "prefixes    {} pending, {} near their limit, {} remembered, {} pushes, {} commands",
        f.pending, f.hot, f.remembered, f.prefixes_pushed_total, f.commands_total
    );
    Ok(())
}
