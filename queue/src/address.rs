//! Where a queue lives — `redis://HOST[:PORT]/NAME`, or `rediss://` for TLS — and the
//! Redis keys it uses, all under `tilesched:NAME:` so that several queues share one
//! server. Over TLS the server's certificate is checked against the system's roots, or
//! against the CA certificate `TILESCHED_REDIS_CA` names (a private CA's PEM file).

use crate::QueueError;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a lost server is waited for before a tuner or worker gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(120);

/// The consumer group of the workers on every job stream.
pub(crate) const GROUP: &str = "workers";
/// The builders' consumer group on each job stream: beside the workers' group, it hands
/// each job to one builder, which acknowledges nothing (`NOACK`).
pub(crate) const BUILDERS: &str = "builders";

/// The environment variables that give the server's ACL user and password when the
/// address does not (so that the password stays off command lines).
pub const USER_ENV: &str = "TILESCHED_REDIS_USER";
pub const PASSWORD_ENV: &str = "TILESCHED_REDIS_PASSWORD";
/// The environment variable naming the PEM file of the CA that signed a `rediss://`
/// server's certificate, where the system's roots do not hold it.
pub const CA_ENV: &str = "TILESCHED_REDIS_CA";

/// A queue: a Redis server and the name that keeps its keys apart.
#[derive(Clone, PartialEq, Eq)]
pub struct QueueAddress {
    /// `redis://[USER[:***]@]HOST[:PORT]/`: the server as shown, the password hidden.
    pub server: String,
    pub name: String,
    /// The server's host name or address, without port or brackets.
    host: String,
    /// What the client connects with, password included: never shown.
    url: String,
    /// Whether a password is given (in the address or the environment).
    authenticated: bool,
    /// `rediss://`: TLS, checked against the system's roots or `ca`.
    tls: bool,
    ca: Option<PathBuf>,
}

impl fmt::Display for QueueAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.server, self.name)
    }
}

impl fmt::Debug for QueueAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QueueAddress({self})")
    }
}

impl FromStr for QueueAddress {
    type Err = QueueError;

    fn from_str(given: &str) -> Result<QueueAddress, QueueError> {
        let env = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        Ok(
            QueueAddress::parse(given, env(USER_ENV), env(PASSWORD_ENV))?
                .with_ca(env(CA_ENV).map(PathBuf::from)),
        )
    }
}

impl QueueAddress {
    /// `given` (`redis[s]://[USER[:PASSWORD]@]HOST[:PORT]/NAME`), with the user and
    /// password taken from `user` and `password` where the address has none.
    pub fn parse(
        given: &str,
        user: Option<String>,
        password: Option<String>,
    ) -> Result<QueueAddress, QueueError> {
        // The error names the address with its password hidden.
        let shown = redact(given);
        let bad = |why| QueueError::Address {
            given: shown.clone(),
            why,
        };
        let (scheme, rest) = match given.strip_prefix("rediss://") {
            Some(rest) => ("rediss", rest),
            None => (
                "redis",
                given
                    .strip_prefix("redis://")
                    .ok_or_else(|| bad("not a redis:// or rediss:// address"))?,
            ),
        };
        let (authority, name) = rest
            .split_once('/')
            .ok_or_else(|| bad("no queue name after the server"))?;
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if hostport.is_empty() {
            return Err(bad("no server"));
        }
        let legal = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if name.is_empty() || !name.chars().all(legal) {
            return Err(bad(
                "the queue name must be letters, digits, '-', '_' or '.'",
            ));
        }
        let host = match hostport.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => hostport.split(':').next().unwrap_or_default(),
        };
        // The address's own credentials as written (already URL-encoded), else the
        // environment's, encoded here.
        let (url_user, url_password) = match userinfo {
            Some(u) => match u.split_once(':') {
                Some((user, password)) => (user.to_string(), Some(password.to_string())),
                None => (u.to_string(), password.as_deref().map(encode)),
            },
            None => (
                user.as_deref().map(encode).unwrap_or_default(),
                password.as_deref().map(encode),
            ),
        };
        let authenticated = url_password.as_deref().is_some_and(|p| !p.is_empty());
        let credentials = match (&url_user, &url_password) {
            (u, Some(p)) => format!("{u}:{p}@"),
            (u, None) if !u.is_empty() => format!("{u}@"),
            _ => String::new(),
        };
        let shown_credentials = match (&url_user, &url_password) {
            (u, Some(_)) => format!("{u}:***@"),
            (u, None) if !u.is_empty() => format!("{u}@"),
            _ => String::new(),
        };
        Ok(QueueAddress {
            server: format!("{scheme}://{shown_credentials}{hostport}/"),
            name: name.to_string(),
            host: host.to_string(),
            url: format!("{scheme}://{credentials}{hostport}/"),
            authenticated,
            tls: scheme == "rediss",
            ca: None,
        })
    }

    /// The same queue, its TLS certificate checked against the CA in PEM file `ca`
    /// (ignored without TLS).
    pub fn with_ca(self, ca: Option<PathBuf>) -> QueueAddress {
        QueueAddress { ca, ..self }
    }

    /// Whether the server is this host (a loopback address or `localhost`).
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// Refuses a server on another host unless the queue is closed to others: a
    /// password for the server and a key that signs the jobs (`signed`), or `insecure`.
    pub fn check_exposure(&self, signed: bool, insecure: bool) -> Result<(), QueueError> {
        if self.is_loopback() || insecure || (self.authenticated && signed) {
            return Ok(());
        }
        let missing = match (self.authenticated, signed) {
            (false, false) => format!(
                "no password (in the address or {PASSWORD_ENV}) and no signing key ({})",
                crate::seal::KEY_ENV
            ),
            (false, true) => format!("no password (in the address or {PASSWORD_ENV})"),
            _ => format!("no signing key ({})", crate::seal::KEY_ENV),
        };
        Err(QueueError::Exposed {
            queue: self.to_string(),
            missing,
        })
    }
}

/// Makes rustls's ring provider the process's default, once: the Redis client's TLS
/// asks for the default provider.
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err: a provider is installed already, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `given` with any password between `://USER:` and `@` replaced by `***`.
fn redact(given: &str) -> String {
    let Some((scheme, rest)) = given.split_once("://") else {
        return given.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{path}")
        }
        None => given.to_string(),
    }
}

/// Percent-encodes all but URL-unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
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

    /// The entry of the shared cubin store for the cubin cache's key `key`.
    pub(crate) fn cubin(&self, key: &str) -> String {
        self.key(&format!("cubin:{key}"))
    }

    /// The key that exists while a builder compiles the kernel of `cubin(key)`.
    pub(crate) fn cubin_claim(&self, key: &str) -> String {
        self.key(&format!("cubin-claim:{key}"))
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
        let client = match (&self.ca, self.tls) {
            (Some(ca), true) => {
                let root_cert = std::fs::read(ca).map_err(|error| QueueError::Ca {
                    server: self.server.clone(),
                    path: ca.display().to_string(),
                    error,
                })?;
                install_crypto();
                let certificates = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                };
                redis::Client::build_with_tls(self.url.as_str(), certificates)
            }
            (_, tls) => {
                if tls {
                    install_crypto();
                }
                redis::Client::open(self.url.as_str())
            }
        }
        .map_err(connect)?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(connect)?;
        con.set_read_timeout(Some(read)).map_err(connect)?;
        con.set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(connect)?;
        // A server that wants a password says so on the first command.
        match redis::cmd("PING").query::<String>(&mut con) {
            Ok(_) => Ok(con),
            Err(e) if e.code() == Some("NOAUTH") => Err(QueueError::Refused {
                server: self.server.clone(),
                why: format!("it needs a password (in the address or {PASSWORD_ENV})"),
            }),
            Err(e)
                if e.code() == Some("WRONGPASS")
                    || e.kind() == redis::ErrorKind::AuthenticationFailed =>
            {
                Err(QueueError::Refused {
                    server: self.server.clone(),
                    why: "the user or password is wrong".to_string(),
                })
            }
            Err(e) => Err(connect(e)),
        }
    }

    /// Connects once, so that an unreachable server or a refused password is said
    /// before anything else starts.
    pub fn reach(&self) -> Result<(), QueueError> {
        self.connect(Duration::from_secs(10)).map(drop)
    }
}

/// Whether `e` means the server went away (a dropped or refused connection, a timeout,
/// a server still loading its data) or lost a stream's consumer group (it restarted
/// without its data): what reconnecting, and recreating the group, mends.
pub(crate) fn is_lost(e: &QueueError) -> bool {
    match e {
        QueueError::Redis(r) | QueueError::Connect { error: r, .. } => {
            r.is_io_error()
                || r.is_connection_dropped()
                || r.is_connection_refusal()
                || r.is_timeout()
                || matches!(r.code(), Some("NOGROUP" | "LOADING"))
        }
        _ => false,
    }
}

impl QueueAddress {
    /// A new connection after `lost`, tried again with a growing pause (up to 5 s) for
    /// `RECONNECT_FOR`, or until `stop`; `notice` hears when it is lost and found again
    /// (unless `stop` was already set).
    pub(crate) fn reconnect(
        &self,
        read: Duration,
        lost: &QueueError,
        stop: &AtomicBool,
        notice: &(dyn Fn(&str) + Sync),
    ) -> Result<redis::Connection, QueueError> {
        // A signal that stops the process also interrupts a read waiting on the server
        // (a socket with a timeout is not restarted): that is no loss worth a line.
        let quiet = stop.load(Ordering::Relaxed);
        if !quiet {
            notice(&format!(
                "lost Redis at {} ({lost}); reconnecting",
                self.server
            ));
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(250);
        loop {
            match self.connect(read) {
                Ok(con) => {
                    if !quiet {
                        notice(&format!("reconnected to Redis at {}", self.server));
                    }
                    return Ok(con);
                }
                Err(e)
                    if is_lost(&e)
                        && started.elapsed() < RECONNECT_FOR
                        && !stop.load(Ordering::Relaxed) =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `f` on `con`, run again on a new connection (after `after` ran on it: recreating
    /// what the server may have lost) for as long as the server is lost.
    pub(crate) fn retrying<T>(
        &self,
        con: &mut redis::Connection,
        read: Duration,
        stop: &AtomicBool,
        notice: &(dyn Fn(&str) + Sync),
        mut after: impl FnMut(&mut redis::Connection) -> Result<(), QueueError>,
        mut f: impl FnMut(&mut redis::Connection) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        loop {
            match f(con) {
                Err(e) if is_lost(&e) => {
                    *con = self.reconnect(read, &e, stop, notice)?;
                    after(con)?;
                }
                other => return other,
            }
        }
    }
}

/// The server's clock in milliseconds (one clock for every host's registrations).
pub(crate) fn server_ms(con: &mut redis::Connection) -> Result<u64, QueueError> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con)?;
    Ok(secs * 1000 + micros / 1000)
}

/// Creates the workers' consumer group of `stream` (and the stream), unless it exists.
pub(crate) fn ensure_group(con: &mut redis::Connection, stream: &str) -> Result<(), QueueError> {
    ensure_group_named(con, stream, GROUP)
}

/// Creates consumer group `group` of `stream` (and the stream), unless it exists.
pub(crate) fn ensure_group_named(
    con: &mut redis::Connection,
    stream: &str,
    group: &str,
) -> Result<(), QueueError> {
    use redis::Commands;
    match con.xgroup_create_mkstream::<_, _, _, ()>(stream, group, "0") {
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
        let b = QueueAddress::parse("redis://user:pw@gpu-head/campaign_1", None, None).unwrap();
        assert_eq!(b.server, "redis://user:***@gpu-head/");
        assert_eq!(b.url, "redis://user:pw@gpu-head/");
        assert!(!b.to_string().contains("pw") && !format!("{b:?}").contains("pw"));
        for (given, why) in [
            ("http://host/x", "not a redis:// or rediss:// address"),
            ("redis://host", "no queue name"),
            ("redis:///x", "no server"),
            ("redis://host/", "the queue name must be"),
            ("redis://host/a b", "the queue name must be"),
        ] {
            let e = given.parse::<QueueAddress>().unwrap_err().to_string();
            assert!(e.contains(why), "{given}: {e}");
        }
        let t = QueueAddress::parse("rediss://u:pw@gpu-head:6390/q", None, None).unwrap();
        assert!(t.tls);
        assert_eq!(t.server, "rediss://u:***@gpu-head:6390/");
        assert_eq!(t.url, "rediss://u:pw@gpu-head:6390/");
        // A bad address with a password is named without it.
        let e = QueueAddress::parse("redis://u:secret@host", None, None).unwrap_err();
        assert!(e.to_string().contains("redis://u:***@host"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn credentials_come_from_the_address_or_the_environment() {
        let parse = |given, user: Option<&str>, password: Option<&str>| {
            QueueAddress::parse(given, user.map(String::from), password.map(String::from)).unwrap()
        };
        let a = parse("redis://gpu-head:6380/q", Some("tuner"), Some("p@ss:w/rd"));
        assert_eq!(a.url, "redis://tuner:p%40ss%3Aw%2Frd@gpu-head:6380/");
        assert_eq!(a.server, "redis://tuner:***@gpu-head:6380/");
        assert!(a.authenticated);
        // The address's own password wins; a user alone takes the environment's.
        let b = parse("redis://me:mine@h/q", None, Some("env"));
        assert_eq!(b.url, "redis://me:mine@h/");
        let c = parse("redis://me@h/q", None, Some("env"));
        assert_eq!(c.url, "redis://me:env@h/");
        let d = parse("redis://h/q", None, None);
        assert!(!d.authenticated);
        assert_eq!(d.url, "redis://h/");
    }

    #[test]
    fn another_host_needs_a_password_and_a_key() {
        let parse = |given, password: Option<&str>| {
            QueueAddress::parse(given, None, password.map(String::from)).unwrap()
        };
        for local in [
            "redis://127.0.0.1:6379/q",
            "redis://localhost/q",
            "redis://[::1]:7/q",
        ] {
            let a = parse(local, None);
            assert!(a.is_loopback(), "{local}");
            a.check_exposure(false, false).unwrap();
        }
        let open = parse("redis://10.0.0.5:6379/q", None);
        assert!(!open.is_loopback());
        let e = open.check_exposure(false, false).unwrap_err().to_string();
        assert!(
            e.contains("no password") && e.contains("no signing key"),
            "{e}"
        );
        assert!(e.contains("--insecure"), "{e}");
        assert_eq!(e.lines().count(), 1);
        open.check_exposure(false, true).unwrap();
        let closed = parse("redis://10.0.0.5:6379/q", Some("pw"));
        let e = closed.check_exposure(false, false).unwrap_err().to_string();
        assert!(
            e.contains("no signing key") && !e.contains("no password"),
            "{e}"
        );
        closed.check_exposure(true, false).unwrap();
    }
}
