//! `rediss://` against a real `redis-server` serving TLS only, with a certificate
//! signed by a CA made here: the queue reaches it when given that CA, and refuses it
//! without (the system's roots do not hold it) or over plain TCP. Skipped, with a note,
//! where no `redis-server` with TLS is installed (`scripts/setup.sh` installs Debian's).

use queue::QueueAddress;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A CA and a certificate for 127.0.0.1 it signed, written as PEM files into `dir`:
/// (ca, server certificate, server key).
fn certificates(dir: &Path) -> [std::path::PathBuf; 3] {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "tilesched test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let paths = ["ca.pem", "server.pem", "server.key"].map(|f| dir.join(f));
    std::fs::write(&paths[0], ca.pem()).unwrap();
    std::fs::write(&paths[1], server.pem()).unwrap();
    std::fs::write(&paths[2], key.serialize_pem()).unwrap();
    paths
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_tls_server_is_reached_with_its_ca_and_refused_without() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key] = certificates(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spawned = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .args(["--tls-port", &port.to_string()])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&ca)
        .args([
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::piped())
        .spawn();
    let Ok(child) = spawned else {
        eprintln!("SKIPPED: no redis-server; scripts/setup.sh installs Debian's redis-server");
        return;
    };
    let mut server = Server(child);
    let tls = QueueAddress::parse(&format!("rediss://127.0.0.1:{port}/q"), None, None)
        .unwrap()
        .with_ca(Some(ca.clone()));
    let started = Instant::now();
    loop {
        match tls.reach() {
            Ok(()) => break,
            Err(e) => {
                if let Ok(Some(status)) = server.0.try_wait() {
                    eprintln!("SKIPPED: redis-server without TLS ({status}): {e}");
                    return;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "a TLS redis-server did not answer: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Without the CA, the certificate is not trusted.
    let untrusted = QueueAddress::parse(&format!("rediss://127.0.0.1:{port}/q"), None, None)
        .unwrap()
        .reach()
        .unwrap_err()
        .to_string();
    assert!(untrusted.contains("rediss://127.0.0.1"), "{untrusted}");
    assert!(
        untrusted.to_lowercase().contains("certificate"),
        "{untrusted}"
    );
    // Plain TCP to the TLS port gets no Redis answer.
    let plain = QueueAddress::parse(&format!("redis://127.0.0.1:{port}/q"), None, None).unwrap();
    assert!(plain.reach().is_err());
    // A CA file that is not there is said in one line, naming it.
    let missing = QueueAddress::parse(&format!("rediss://127.0.0.1:{port}/q"), None, None)
        .unwrap()
        .with_ca(Some(dir.path().join("none.pem")))
        .reach()
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("none.pem") && !missing.contains('\n'),
        "{missing}"
    );
}
