//! Where a queue lives — `redis://HOST[:PORT]/NAME` — and the Redis keys it uses, all
//! under `tilesched:NAME:` so that several queues share one server.

use crate::QueueError;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The consumer group of the workers on every job stream.
pub(crate) const GROUP: &str = "workers";

/// A queue: a Redis server and the name that keeps its keys apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueAddress {
    /// `redis://[USER:PASSWORD@]HOST[:PORT]/` (database 0).
    pub server: String,
    pub name: String,
}

impl FromStr for QueueAddress {
    type Err = QueueError;

    fn from_str(given: &str) -> Result<QueueAddress, QueueError> {
        let bad = |why| QueueError::Address {
            given: given.to_string(),
            why,
        };
        let rest = given
            .strip_prefix("redis://")
            .ok_or_else(|| bad("not a redis:// address"))?;
        let (authority, name) = rest
            .split_once('/')
            .ok_or_else(|| bad("no queue name after the server"))?;
        if authority.rsplit('@').next().is_none_or(str::is_empty) {
            return Err(bad("no server"));
        }
        let legal = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if name.is_empty() || !name.chars().all(legal) {
            return Err(bad(
                "the queue name must be letters, digits, '-', '_' or '.'",
            ));
        }
        Ok(QueueAddress {
            server: format!("redis://{authority}/"),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for QueueAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.server, self.name)
    }
}

impl QueueAddress {
    fn key(&self, part: &str) -> String {
        format!("tilesched:{}:{part}", self.name)
    }

    /// The stream of jobs for GPUs of model `gpu` (the device name).
    pub(crate) fn jobs(&self, gpu: &str) -> String {
        let model: String = gpu
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        self.key(&format!("jobs:{model}"))
    }

    /// The hash of registered workers (name -> `Registration`).
    pub(crate) fn workers(&self) -> String {
        self.key("workers")
    }

    /// The stream a tuner's run reads its results from.
    pub(crate) fn results(&self, run: &str) -> String {
        self.key(&format!("results:{run}"))
    }

    /// The key that exists while a tuner's run is alive (it expires when the tuner
    /// dies): workers drop the jobs of a run that is gone.
    pub(crate) fn tuner(&self, run: &str) -> String {
        self.key(&format!("tuner:{run}"))
    }

    /// Connects with deadlines: `read` bounds every reply (longer than any `BLOCK`).
    pub(crate) fn connect(&self, read: Duration) -> Result<redis::Connection, QueueError> {
        let connect = |error| QueueError::Connect {
            server: self.server.clone(),
            error,
        };
        let client = redis::Client::open(self.server.as_str()).map_err(connect)?;
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(connect)?;
        con.set_read_timeout(Some(read)).map_err(connect)?;
        con.set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(connect)?;
        Ok(con)
    }
}

/// The server's clock in milliseconds (one clock for every host's registrations).
pub(crate) fn server_ms(con: &mut redis::Connection) -> Result<u64, QueueError> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con)?;
    Ok(secs * 1000 + micros / 1000)
}

/// Creates the consumer group of `stream` (and the stream), unless it exists.
pub(crate) fn ensure_group(con: &mut redis::Connection, stream: &str) -> Result<(), QueueError> {
    use redis::Commands;
    match con.xgroup_create_mkstream::<_, _, _, ()>(stream, GROUP, "0") {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_or_say_what_is_wrong() {
        let a: QueueAddress = "redis://10.0.0.5:6380/resnet".parse().unwrap();
        assert_eq!(a.server, "redis://10.0.0.5:6380/");
        assert_eq!(a.name, "resnet");
        assert_eq!(a.to_string(), "redis://10.0.0.5:6380/resnet");
        assert_eq!(
            a.jobs("NVIDIA H100 80GB HBM3"),
            "tilesched:resnet:jobs:nvidia-h100-80gb-hbm3"
        );
        let b: QueueAddress = "redis://user:pw@gpu-head/campaign_1".parse().unwrap();
        assert_eq!(b.server, "redis://user:pw@gpu-head/");
        for (given, why) in [
            ("http://host/x", "not a redis:// address"),
            ("redis://host", "no queue name"),
            ("redis:///x", "no server"),
            ("redis://host/", "the queue name must be"),
            ("redis://host/a b", "the queue name must be"),
        ] {
            let e = given.parse::<QueueAddress>().unwrap_err().to_string();
            assert!(e.contains(why), "{given}: {e}");
        }
    }
}
