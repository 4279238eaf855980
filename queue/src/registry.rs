//! Workers register themselves and their GPUs in a hash, renewed while they run, so
//! that a tuner can find which GPU models are on the queue and how many devices serve
//! it. A registration not renewed within a few leases belongs to a dead worker.

use crate::QueueError;
use crate::address::{QueueAddress, server_ms};
use gpu::DeviceInfo;
use redis::Commands;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A worker on the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    /// Its consumer name in the job streams' group.
    pub worker: String,
    pub host: String,
    pub pid: u32,
    /// The GPUs it measures on (all one model).
    pub devices: Vec<DeviceInfo>,
    /// The jobs it renews are taken over when not renewed for this long.
    pub lease_ms: u64,
    /// When it last renewed this, by the Redis server's clock.
    pub seen_ms: u64,
}

impl Registration {
    /// The GPU model it measures on.
    pub fn gpu(&self) -> &str {
        self.devices.first().map_or("", |d| d.name.as_str())
    }
}

/// Registers (or renews) `me`, stamped with the server's clock.
pub(crate) fn renew(
    con: &mut redis::Connection,
    queue: &QueueAddress,
    me: &mut Registration,
) -> Result<(), QueueError> {
    me.seen_ms = server_ms(con)?;
    let text = serde_json::to_string(me).expect("registrations serialize");
    let _: () = con.hset(queue.workers(), &me.worker, text)?;
    Ok(())
}

/// Removes `worker`'s registration (it stops).
pub(crate) fn remove(
    con: &mut redis::Connection,
    queue: &QueueAddress,
    worker: &str,
) -> Result<(), QueueError> {
    let _: () = con.hdel(queue.workers(), worker)?;
    Ok(())
}

/// The workers that renewed their registration within three of their leases, by name.
pub(crate) fn live(
    con: &mut redis::Connection,
    queue: &QueueAddress,
) -> Result<Vec<Registration>, QueueError> {
    let now = server_ms(con)?;
    let all: std::collections::BTreeMap<String, String> = con.hgetall(queue.workers())?;
    Ok(all
        .values()
        .filter_map(|text| serde_json::from_str::<Registration>(text).ok())
        .filter(|r| now.saturating_sub(r.seen_ms) <= 3 * r.lease_ms.max(1))
        .collect())
}

/// How often a worker renews its registration and the jobs it holds.
pub(crate) fn renew_period(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(50))
}
