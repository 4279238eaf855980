//! Signing the queue's messages, so that only holders of a key shared by a tuner and its
//! workers can give a worker a job or a tuner a result.
//!
//! Anyone who can write to the Redis server can add entries to its streams. A worker
//! builds and runs on its GPU whatever job it reads, and a tuner records whatever result
//! it reads. With a key (`TILESCHED_QUEUE_KEY`, the same on the tuner and every worker),
//! each job and result carries an HMAC-SHA256 of its fields, and a message without it or
//! with a wrong one is refused before anything reads its content. The key never leaves
//! the process: it is neither sent to Redis nor printed.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;
use thiserror::Error;

/// The environment variable holding the shared key.
pub const KEY_ENV: &str = "TILESCHED_QUEUE_KEY";
/// The shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 16;
/// The field of a stream entry that carries its signature.
pub(crate) const FIELD: &str = "sig";

/// Why a message was refused, or a key not taken.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SealError {
    #[error("{KEY_ENV} must hold at least {MIN_KEY_BYTES} bytes (it holds {0})")]
    ShortKey(usize),
    #[error("it is not signed")]
    Unsigned,
    #[error("its signature is not from this queue's key")]
    Forged,
}

/// A shared key. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct Seal {
    key: Vec<u8>,
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Seal(..)")
    }
}

impl Seal {
    pub fn new(key: &[u8]) -> Result<Seal, SealError> {
        if key.len() < MIN_KEY_BYTES {
            return Err(SealError::ShortKey(key.len()));
        }
        Ok(Seal { key: key.to_vec() })
    }

    /// The key of the environment (`TILESCHED_QUEUE_KEY`), if set.
    pub fn from_env() -> Result<Option<Seal>, SealError> {
        match std::env::var_os(KEY_ENV) {
            Some(key) if !key.is_empty() => Seal::new(key.as_encoded_bytes()).map(Some),
            _ => Ok(None),
        }
    }

    fn mac(&self, parts: &[&str]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        // Each part with its length first, so that moving bytes from one part to the
        // next changes what is signed.
        for part in parts {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The signature of a message made of `parts`, in hex.
    pub fn sign(&self, parts: &[&str]) -> String {
        self.mac(parts)
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Checks `signature` (hex) against `parts`, in constant time.
    pub fn verify(&self, parts: &[&str], signature: Option<&str>) -> Result<(), SealError> {
        let signature = signature.ok_or(SealError::Unsigned)?;
        let bytes = decode_hex(signature).ok_or(SealError::Forged)?;
        self.mac(parts)
            .verify_slice(&bytes)
            .map_err(|_| SealError::Forged)
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seal() -> Seal {
        Seal::new(b"0123456789abcdef-shared").unwrap()
    }

    #[test]
    fn signed_messages_verify_and_others_do_not() {
        let s = seal();
        let parts = ["{\"id\":1}", "tilesched:q:results:r", "r", "NVIDIA H200"];
        let sig = s.sign(&parts);
        assert_eq!(sig.len(), 64);
        assert_eq!(s.verify(&parts, Some(&sig)), Ok(()));
        assert_eq!(s.verify(&parts, None), Err(SealError::Unsigned));
        assert_eq!(s.verify(&parts, Some("zz")), Err(SealError::Forged));
        // Another key, and bytes moved between parts.
        let other = Seal::new(b"fedcba9876543210-shared").unwrap();
        assert_eq!(other.verify(&parts, Some(&sig)), Err(SealError::Forged));
        let moved = ["{\"id\":1}t", "ilesched:q:results:r", "r", "NVIDIA H200"];
        assert_eq!(s.verify(&moved, Some(&sig)), Err(SealError::Forged));
        assert_eq!(Seal::new(b"short").unwrap_err(), SealError::ShortKey(5));
        assert_eq!(format!("{s:?}"), "Seal(..)");
    }

    proptest! {
        /// Any one bit flipped, in any part or in the signature, is refused.
        #[test]
        fn any_bit_flip_is_refused(
            parts in proptest::collection::vec("[ -~]{0,40}", 1..5),
            which in 0usize..6,
            bit in 0usize..512,
        ) {
            let s = seal();
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let sig = s.sign(&refs);
            prop_assert!(s.verify(&refs, Some(&sig)).is_ok());
            if which < parts.len() && !parts[which].is_empty() {
                let mut bytes = parts[which].clone().into_bytes();
                let i = bit / 8 % bytes.len();
                bytes[i] ^= 1 << (bit % 7); // stays ASCII, so still a str
                let mut flipped = parts.clone();
                flipped[which] = String::from_utf8(bytes).unwrap();
                let refs: Vec<&str> = flipped.iter().map(String::as_str).collect();
                prop_assert_eq!(s.verify(&refs, Some(&sig)), Err(SealError::Forged));
            } else {
                let mut raw = decode_hex(&sig).unwrap();
                raw[bit / 8 % 32] ^= 1 << (bit % 8);
                let flipped: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                prop_assert_eq!(s.verify(&refs, Some(&flipped)), Err(SealError::Forged));
            }
        }
    }
}
