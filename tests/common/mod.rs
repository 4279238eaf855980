//! What the end-to-end tests share: running the binary, and reading a log.

// Each test file uses its own subset.
#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

pub fn tilesched(args: &[&str]) -> Output {
    tilesched_env(args, &[])
}

/// Runs the binary with `env` added to its environment.
pub fn tilesched_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

/// Runs a command (with `env` added) that must succeed without a panic; returns stdout
/// and stderr.
pub fn ok_env_err(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let o = tilesched_env(args, env);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "{args:?}\n{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    (out, err)
}

/// Runs a command that must succeed without a panic; returns stdout and stderr.
pub fn ok_err(args: &[&str]) -> (String, String) {
    ok_env_err(args, &[])
}

/// Runs a command that must succeed without a panic; returns stdout.
pub fn ok(args: &[&str]) -> String {
    ok_err(args).0
}

/// Runs a command (with `env` added) that must succeed without a panic; returns stdout.
pub fn ok_env(args: &[&str], env: &[(&str, &str)]) -> String {
    ok_env_err(args, env).0
}

/// Runs a command that must fail: exactly one line on stderr, no panic.
pub fn fails(args: &[&str]) -> String {
    let o = tilesched(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(err.lines().count(), 1, "{args:?} printed:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// The records of a log (none if it does not exist). Every complete line must parse; a
/// last line without its newline is one a running tuner is still writing, left out.
pub fn records(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The states of a log's records, in order, as JSON text.
pub fn states(log: &Path) -> Vec<String> {
    records(log)
        .iter()
        .map(|r| r["state"].to_string())
        .collect()
}
