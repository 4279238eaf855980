//! Compiling in a child process of one's own: each build thread hands its kernels to a
//! process of its own (`tilesched compile-server`), which it starts when it first
//! compiles and starts again if it dies. Tried because a microbenchmark (16 threads of
//! a fresh process against 13 processes) suggested NVRTC compiles slower on many threads
//! of one process; in `tune` on a 16-core H200 host it gave no faster builds
//! (benchmarks/results/h200-2026-11-29/compile-servers/), so it is not used.
//!
//! The wire: a `Request` as one JSON line; the answer a `Reply` as one JSON line, then,
//! for a compiled kernel, its cubin's bytes. The server runs NVRTC with the driver's
//! compute cache off (`CUDA_CACHE_DISABLE`).

use crate::compile::{self, CompileError, CompiledKernel};
use crate::nvrtc_lib::NvrtcLibError;
use crate::pool::ProcessCommand;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// What the server is asked to compile.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    kernel: String,
    options: Vec<String>,
    source: String,
}

/// What the server answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    /// `cubin_bytes` bytes of cubin follow the line.
    Compiled {
        cubin_bytes: usize,
        log: String,
        compile_ms: f64,
    },
    Rejected {
        log: String,
    },
    Unavailable(NvrtcLibError),
    Failed {
        message: String,
    },
}

/// Serves compile requests from `input` until it ends, answering on `output`. A
/// request it cannot read ends it (its client sends nothing else).
pub fn serve(input: impl Read, mut output: impl Write) -> std::io::Result<()> {
    crate::compile::compile_in_background();
    for line in BufReader::new(input).lines() {
        let request: Request = serde_json::from_str(&line?)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let compiled = std::panic::catch_unwind(|| {
            compile::nvrtc_cubin(&request.source, &request.kernel, &request.options)
        });
        let (reply, cubin) = match compiled {
            Ok(Ok((cubin, log, compile_ms))) => (
                Reply::Compiled {
                    cubin_bytes: cubin.len(),
                    log,
                    compile_ms,
                },
                cubin,
            ),
            Ok(Err(CompileError::Source { log })) => (Reply::Rejected { log }, Vec::new()),
            Ok(Err(CompileError::Unavailable(e))) => (Reply::Unavailable(e), Vec::new()),
            Ok(Err(e)) => (
                Reply::Failed {
                    message: e.to_string(),
                },
                Vec::new(),
            ),
            Err(_) => (
                Reply::Failed {
                    message: "NVRTC panicked".to_string(),
                },
                Vec::new(),
            ),
        };
        serde_json::to_writer(&mut output, &reply)?;
        output.write_all(b"\n")?;
        output.write_all(&cubin)?;
        output.flush()?;
    }
    Ok(())
}

/// A running server.
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Server {
    fn start(command: &ProcessCommand) -> Result<Server, CompileError> {
        // Its own process group: a Ctrl-C at the terminal reaches the tuner, which
        // decides; the server ends when its input does, however the tuner went.
        let mut child = Command::new(&command.program)
            .args(&command.args)
            .env("CUDA_CACHE_DISABLE", "1")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| CompileError::Spawn {
                program: command.program.display().to_string(),
                error: e.to_string(),
            })?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        Ok(Server {
            child,
            stdin,
            stdout,
        })
    }

    fn compile(&mut self, request: &Request) -> std::io::Result<Reply> {
        serde_json::to_writer(&mut self.stdin, request)?;
        self.stdin.write_all(b"\n")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        serde_json::from_str(&line)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    fn read_cubin(&mut self, bytes: usize) -> std::io::Result<Vec<u8>> {
        let mut cubin = vec![0u8; bytes];
        self.stdout.read_exact(&mut cubin)?;
        Ok(cubin)
    }

    /// Ends the process and says how it ended.
    fn end(mut self) -> String {
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where one build thread's kernels compile: in this process, or in a server process
/// of its own.
pub struct Compiler {
    command: Option<ProcessCommand>,
    server: Option<Server>,
}

impl Compiler {
    /// Compiles in the calling process.
    pub fn in_process() -> Compiler {
        Compiler {
            command: None,
            server: None,
        }
    }

    /// Compiles in a server process started with `command` (`tilesched compile-server`).
    pub fn in_server(command: ProcessCommand) -> Compiler {
        Compiler {
            command: Some(command),
            server: None,
        }
    }

    /// Compiles `source` (kernel `kernel`) to a cubin for `arch`.
    pub fn compile(
        &mut self,
        source: &str,
        kernel: &str,
        arch: &str,
    ) -> Result<CompiledKernel, CompileError> {
        compile::check_arch(arch)?;
        self.compile_with(source, kernel, &compile::cubin_options(arch))
    }

    /// Compiles with NVRTC's `options` (`compile::cubin_options`).
    pub(crate) fn compile_with(
        &mut self,
        source: &str,
        kernel: &str,
        options: &[String],
    ) -> Result<CompiledKernel, CompileError> {
        let Some(command) = &self.command else {
            return compile::run_compile(source, kernel, options);
        };
        let request = Request {
            kernel: kernel.to_string(),
            options: options.to_vec(),
            source: source.to_string(),
        };
        // A server that died (killed from outside, or by an earlier kernel) is started
        // again, once: a kernel that kills two in a row is its own compile failure.
        let mut ended = Vec::new();
        while ended.len() < 2 {
            let mut server = match self.server.take() {
                Some(server) => server,
                None => Server::start(command)?,
            };
            let reply = server.compile(&request).and_then(|reply| match reply {
                Reply::Compiled {
                    cubin_bytes,
                    log,
                    compile_ms,
                } => server
                    .read_cubin(cubin_bytes)
                    .map(|cubin| Ok((cubin, log, compile_ms))),
                Reply::Rejected { log } => Ok(Err(CompileError::Source { log })),
                Reply::Unavailable(e) => Ok(Err(CompileError::Unavailable(e))),
                Reply::Failed { message } => Ok(Err(CompileError::Nvrtc(message))),
            });
            match reply {
                Ok(compiled) => {
                    self.server = Some(server);
                    let (cubin, log, compile_ms) = compiled?;
                    return CompiledKernel::read(cubin, log, kernel, compile_ms);
                }
                Err(e) => ended.push(format!("{e} ({})", server.end())),
            }
        }
        Err(CompileError::ServerDied(ended.join("; ")))
    }
}
