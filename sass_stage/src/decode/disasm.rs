//! The text of each instruction, from NVIDIA's disassembler.
//!
//! We decode control bits ourselves (`control.rs`) but leave opcodes and operands to
//! `nvdisasm -hex`, which prints every instruction with its two 64-bit halves; those
//! halves are checked against the cubin's bytes so text and words can never drift
//! apart. nvdisasm comes from the CUDA toolkit on the GPU machine and from the PyPI
//! wheel `nvidia-cuda-nvdisasm` that `scripts/setup.sh` installs into the cache.

use crate::SassError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One disassembled instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Byte offset from the start of the kernel's text.
    pub offset: usize,
    /// The instruction, e.g. `@P0 LDG.E R4, desc[UR6][R2.64]` (annotations removed).
    pub text: String,
    pub low: u64,
    pub high: u64,
    /// Labels (`.L_x_3`) that name this instruction's offset.
    pub labels: Vec<String>,
}

/// Where nvdisasm is: `$TILESCHED_NVDISASM` (only there, when set), the setup script's wheel, the toolkit
/// under `$CUDA_HOME` or `/usr/local/cuda`, then `PATH`.
pub fn find_nvdisasm() -> Result<PathBuf, SassError> {
    // An explicit choice is final: a wrong path is an error, not a fallback.
    if let Some(p) = std::env::var_os("TILESCHED_NVDISASM") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(SassError::Tool(format!(
                "nvdisasm not found: TILESCHED_NVDISASM={} is not a file",
                p.display()
            )))
        };
    }
    let mut tried = Vec::new();
    tried.push(gpu::nvrtc_lib::cache_dir().join("wheels/nvidia/cu13/bin/nvdisasm"));
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        tried.push(Path::new(&home).join("bin/nvdisasm"));
    }
    tried.push(PathBuf::from("/usr/local/cuda/bin/nvdisasm"));
    if let Some(path) = std::env::var_os("PATH") {
        tried.extend(std::env::split_paths(&path).map(|d| d.join("nvdisasm")));
    }
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        SassError::Tool(
            "nvdisasm not found: run scripts/setup.sh (installs the nvidia-cuda-nvdisasm \
             wheel), install the CUDA toolkit, or set TILESCHED_NVDISASM"
                .to_string(),
        )
    })
}

/// Disassembles `kernel` of `cubin` (the file's bytes).
pub fn disassemble(cubin: &[u8], kernel: &str) -> Result<Vec<Line>, SassError> {
    let nvdisasm = find_nvdisasm()?;
    let path = scratch_path();
    std::fs::write(&path, cubin)
        .map_err(|e| SassError::Tool(format!("cannot write {}: {e}", path.display())))?;
    let output = Command::new(&nvdisasm)
        .args(["-hex", "-c"])
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    let output =
        output.map_err(|e| SassError::Tool(format!("cannot run {}: {e}", nvdisasm.display())))?;
    if !output.status.success() {
        return Err(SassError::Tool(format!(
            "nvdisasm failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    parse(&String::from_utf8_lossy(&output.stdout), kernel)
}

fn scratch_path() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("tilesched-{}-{n}.cubin", std::process::id()))
}

/// Parses `nvdisasm -hex -c` output, keeping the section of `kernel`.
pub fn parse(listing: &str, kernel: &str) -> Result<Vec<Line>, SassError> {
    let header = format!(".text.{kernel}:");
    let mut lines = listing.lines().skip_while(|l| l.trim() != header).skip(1);
    let mut out: Vec<Line> = Vec::new();
    let mut labels = Vec::new();
    let bad = |line: &str| SassError::Tool(format!("unexpected nvdisasm line: {line}"));
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.starts_with("//--") || t.starts_with(".section") {
            break;
        }
        if let Some(label) = t.strip_suffix(':') {
            labels.push(label.to_string());
            continue;
        }
        let Some(rest) = t.strip_prefix("/*") else {
            continue;
        };
        let (offset, rest) = rest.split_once("*/").ok_or_else(|| bad(t))?;
        let offset = usize::from_str_radix(offset.trim(), 16).map_err(|_| bad(t))?;
        let (text, low) = rest.rsplit_once("/*").ok_or_else(|| bad(t))?;
        let low = hex_word(low).ok_or_else(|| bad(t))?;
        let next = lines.next().ok_or_else(|| bad(t))?;
        let high = hex_word(next.trim().trim_start_matches("/*")).ok_or_else(|| bad(next))?;
        out.push(Line {
            offset,
            text: clean(text),
            low,
            high,
            labels: std::mem::take(&mut labels),
        });
    }
    if out.is_empty() {
        return Err(SassError::Input(format!(
            "nvdisasm shows no instructions for kernel {kernel}"
        )));
    }
    Ok(out)
}

/// `0x000fe20000000800 */` → the value.
fn hex_word(s: &str) -> Option<u64> {
    let s = s.trim().trim_end_matches("*/").trim();
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// Drops the trailing `;` and nvdisasm's `(*"..."*)` annotations.
fn clean(text: &str) -> String {
    let mut t = text.trim().trim_end_matches(';').trim().to_string();
    while let Some(start) = t.find("(*") {
        let end = t[start..].find("*)").map_or(t.len(), |e| start + e + 2);
        t.replace_range(start..end, "");
    }
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = r#"
//--------------------- .text.k --------------------------
	.section	.text.k,"ax",@progbits
k:
.text.k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                              /* 0x00000a00ff017b82 */
                                                                                                       /* 0x000e220000000800 */
.L_x_1:
        /*0010*/                   STL [R1+0xa0], R99 (*"SpillRefill"*);                               /* 0x0000a06301007387 */
                                                                                                       /* 0x0001e80000100800 */
        /*0020*/              @P0 BRA `(.L_x_1) ;                                                     /* 0x0000000000440947 */
                                                                                                       /* 0x000fea0003800000 */
//--------------------- .nv.info --------------------------
"#;

    #[test]
    fn parses_offsets_text_words_and_labels() {
        let lines = parse(LISTING, "k").unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].text, "LDC R1, c[0x0][0x28]");
        assert_eq!(lines[0].low, 0x00000a00ff017b82);
        assert_eq!(lines[0].high, 0x000e220000000800);
        assert_eq!(lines[1].text, "STL [R1+0xa0], R99");
        assert_eq!(lines[1].labels, vec![".L_x_1".to_string()]);
        assert_eq!(lines[2].offset, 0x20);
        assert_eq!(lines[2].text, "@P0 BRA `(.L_x_1)");
        assert!(matches!(parse(LISTING, "other"), Err(SassError::Input(_))));
    }
}
