//! PNG plots of benchmark results: per-layer speedup bars and tuning curves.
//!
//! Drawn with `plotters` built without its system-font support (no fontconfig or
//! freetype to build against, so a fresh machine builds it with nothing but Rust): text
//! is rasterized by `ab_glyph` from a TrueType font read at run time, DejaVu Sans from
//! the `fonts-dejavu-core` package that `scripts/setup.sh` installs, looked for in the
//! usual system folders, or the file named by `TILESCHED_FONT`. Without a font the
//! functions return [`PlotError::NoFont`], naming the package; they never panic.
//!
//! - [`speedup_bars`]: one horizontal bar per layer (first layer on top), the speedup
//!   printed at its end, and a dashed reference line at 1.0×; the image grows with the
//!   number of layers, and long labels are shortened in the middle.
//! - [`tuning_curves`]: two panels side by side, the network's weighted sum of best µs
//!   against trials and against wall-clock time, one line per curve (per log or
//!   strategy) with a legend.

use crate::curves::NetworkCurve;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{
    AsRangedCoord, DefaultFormatting, KeyPointHint, Ranged, ValueFormatter,
};
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::error::Error;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

/// The Debian/Ubuntu package that provides the font the plots use.
pub const FONT_PACKAGE: &str = "fonts-dejavu-core";
/// Environment variable naming a TrueType/OpenType font file to use instead.
pub const FONT_ENV: &str = "TILESCHED_FONT";
/// Folders searched for `DejaVuSans.ttf` (and `DejaVuSans-Bold.ttf`), in order.
pub const FONT_DIRS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu", // Debian, Ubuntu (fonts-dejavu-core)
    "/usr/share/fonts/dejavu-sans-fonts", // Fedora
    "/usr/share/fonts/TTF",             // Arch
    "/usr/share/fonts/dejavu",          // openSUSE, Alpine
    "/usr/share/fonts/truetype",
    "/usr/local/share/fonts",
];
const FONT_FILE: &str = "DejaVuSans.ttf";
const BOLD_FONT_FILE: &str = "DejaVuSans-Bold.ttf";
/// The family plotters asks for by default; the loaded font is registered under it.
const FAMILY: &str = "sans-serif";

/// Width of a speedup-bar chart in pixels.
pub const BARS_WIDTH: u32 = 1200;
/// Size of a tuning-curve figure (two panels) in pixels.
pub const CURVES_SIZE: (u32, u32) = (1600, 620);
/// Labels longer than this many characters are shortened in the middle.
pub const MAX_LABEL_CHARS: usize = 56;

const BAR_ROW_PX: u32 = 26;
const BARS_EXTRA_PX: u32 = 110;
const BARS_MIN_HEIGHT: u32 = 320;
const FASTER: RGBColor = RGBColor(46, 139, 87);
const SLOWER: RGBColor = RGBColor(205, 92, 92);
/// Line colours of the tuning curves (Tableau 10), reused in turn past ten.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

#[derive(Debug, Error)]
pub enum PlotError {
    #[error(
        "no font for plots: install the {FONT_PACKAGE} package (`apt-get install \
         {FONT_PACKAGE}`, as scripts/setup.sh does) or set {FONT_ENV} to a .ttf file \
         (looked for {FONT_FILE} in {tried})"
    )]
    NoFont { tried: String },
    #[error("cannot read font {path}: {error}")]
    FontRead {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path} is not a usable TrueType/OpenType font")]
    FontInvalid { path: PathBuf },
    #[error("cannot plot {path}: the output must be a .png file")]
    NotPng { path: PathBuf },
    #[error("cannot plot {path}: nothing to plot ({what})")]
    NoData { path: PathBuf, what: String },
    #[error("cannot draw {path}: {message}")]
    Draw { path: PathBuf, message: String },
}

/// The font registered with plotters in this process, once one was.
static REGISTERED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Finds the font to use: the file named by `env` (the value of [`FONT_ENV`]) if set,
/// else the first `DejaVuSans.ttf` in `dirs`.
fn find_font(env: Option<&str>, dirs: &[&Path]) -> Result<PathBuf, PlotError> {
    if let Some(path) = env.filter(|p| !p.is_empty()) {
        // Named explicitly: a wrong name is an error, not a reason to look elsewhere.
        let path = PathBuf::from(path);
        return match std::fs::metadata(&path) {
            Ok(_) => Ok(path),
            Err(error) => Err(PlotError::FontRead { path, error }),
        };
    }
    dirs.iter()
        .map(|d| d.join(FONT_FILE))
        .find(|p| p.is_file())
        .ok_or_else(|| PlotError::NoFont {
            tried: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Reads `path` and registers it with plotters as `family` in `style`. The bytes are
/// leaked: plotters keeps fonts for the life of the process.
fn register(family: &str, style: FontStyle, path: &Path) -> Result<(), PlotError> {
    let bytes = std::fs::read(path).map_err(|error| PlotError::FontRead {
        path: path.to_path_buf(),
        error,
    })?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(family, style, bytes).map_err(|_| PlotError::FontInvalid {
        path: path.to_path_buf(),
    })
}

/// Makes sure a font is registered with plotters, loading it on the first call; returns
/// its path. Called by every plot; public so that a program can check up front.
pub fn ensure_font() -> Result<PathBuf, PlotError> {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = registered.as_ref() {
        return Ok(path.clone());
    }
    let env = std::env::var(FONT_ENV).ok();
    let dirs: Vec<&Path> = FONT_DIRS.iter().map(Path::new).collect();
    let path = find_font(env.as_deref(), &dirs)?;
    register(FAMILY, FontStyle::Normal, &path)?;
    // Bold for titles where the same folder has it; otherwise plotters falls back to
    // the normal face.
    let bold = path.with_file_name(BOLD_FONT_FILE);
    if env.is_none() && bold.is_file() {
        register(FAMILY, FontStyle::Bold, &bold)?;
    }
    *registered = Some(path.clone());
    Ok(path)
}

/// Shortens `label` to at most `max` characters by replacing its middle with "…",
/// keeping both ends (task keys differ at either end).
pub fn shorten_label(label: &str, max: usize) -> String {
    let chars: Vec<char> = label.chars().collect();
    if chars.len() <= max || max < 3 {
        return label.to_string();
    }
    let keep = max - 1;
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// Pixel size of a speedup-bar chart of `bars` bars.
pub fn bars_size(bars: usize) -> (u32, u32) {
    let rows = u32::try_from(bars).unwrap_or(u32::MAX / BAR_ROW_PX);
    let height = BARS_EXTRA_PX.saturating_add(rows.saturating_mul(BAR_ROW_PX));
    (BARS_WIDTH, height.max(BARS_MIN_HEIGHT))
}

/// The title font. (`FontDesc::style` would keep the normal face's glyphs: the face is
/// picked when the description is made.)
fn title_font() -> FontDesc<'static> {
    FontDesc::new(FontFamily::Name(FAMILY), 22.0, FontStyle::Bold)
}

fn check_png(path: &Path) -> Result<(), PlotError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("png") => Ok(()),
        _ => Err(PlotError::NotPng {
            path: path.to_path_buf(),
        }),
    }
}

fn draw_error(path: &Path) -> impl Fn(Box<dyn Error>) -> PlotError + '_ {
    move |e| PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The y axis of the bar chart: rows 0..n centred on integers, a tick (and label) at
/// each row and no light mesh lines.
struct Rows(usize);

impl Ranged for Rows {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let Range { start, end } = self.range();
        let frac = (value - start) / (end - start);
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            (0..self.0).map(|k| k as f64).collect()
        }
    }

    fn range(&self) -> Range<f64> {
        -0.5..self.0 as f64 - 0.5
    }
}

/// Draws `bars` (`(label, speedup)`, first on top) as horizontal bars to the PNG
/// `path`, with a reference line at 1.0×. Bars at or above 1 are green, below red; a
/// speedup that is not a finite non-negative number gets "n/a" and no bar.
pub fn speedup_bars(path: &Path, title: &str, bars: &[(String, f64)]) -> Result<(), PlotError> {
    check_png(path)?;
    if bars.is_empty() {
        return Err(PlotError::NoData {
            path: path.to_path_buf(),
            what: "no bars".into(),
        });
    }
    ensure_font()?;
    draw_bars(path, title, bars).map_err(draw_error(path))
}

fn draw_bars(path: &Path, title: &str, bars: &[(String, f64)]) -> Result<(), Box<dyn Error>> {
    let size = bars_size(bars.len());
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let area = if title.is_empty() {
        root.clone()
    } else {
        root.titled(title, title_font())?
    };

    let n = bars.len();
    let labels: Vec<String> = bars
        .iter()
        .map(|(l, _)| shorten_label(l, MAX_LABEL_CHARS))
        .collect();
    let label_style: TextStyle = (FAMILY, 14).into();
    let mut label_width = 0;
    for l in &labels {
        label_width = label_width.max(area.estimate_text_size(l, &label_style)?.0);
    }
    let label_width = (label_width + 16).min(size.0 / 2);

    let valid = |v: f64| v.is_finite() && v >= 0.0;
    let top = bars
        .iter()
        .map(|&(_, v)| v)
        .filter(|&v| valid(v))
        .fold(1.0_f64, f64::max);
    let x_max = top * 1.18;
    // Bar k sits at y = n - 1 - k, so the first bar is on top.
    let y_of = |k: usize| (n - 1 - k) as f64;

    let mut chart = ChartBuilder::on(&area)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(label_width)
        .build_cartesian_2d(0.0..x_max, Rows(n))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("speedup (×, higher is better)")
        .x_label_formatter(&|v| format!("{}×", fmt_tick(*v)))
        .y_label_formatter(&|v| {
            let row = v.round();
            if row >= 0.0 && row < n as f64 {
                labels[n - 1 - row as usize].clone()
            } else {
                String::new()
            }
        })
        .label_style(label_style.clone())
        .axis_desc_style((FAMILY, 15))
        .draw()?;

    chart.draw_series(bars.iter().enumerate().filter(|(_, (_, v))| valid(*v)).map(
        |(k, &(_, v))| {
            let color = if v >= 1.0 { FASTER } else { SLOWER };
            let y = y_of(k);
            Rectangle::new([(0.0, y - 0.36), (v, y + 0.36)], color.filled())
        },
    ))?;
    chart.draw_series(DashedLineSeries::new(
        [(1.0, -0.5), (1.0, n as f64 - 0.5)],
        6,
        4,
        BLACK.stroke_width(2),
    ))?;
    let value_style = (FAMILY, 13)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(k, &(_, v))| {
        let (x, text) = if valid(v) {
            (v, format!("{v:.2}×"))
        } else {
            (0.0, "n/a".to_string())
        };
        EmptyElement::at((x, y_of(k))) + Text::new(text, (5, 0), value_style.clone())
    }))?;
    root.present()?;
    Ok(())
}

/// Draws tuning curves to the PNG `path`: left, the network's weighted sum of best µs
/// against trials; right, against wall-clock time since the first trial. One line per
/// `(label, curve)`, with a legend giving each label's final sum; a curve with no
/// point (some task never succeeded) is listed in the legend as such. The y axis turns
/// logarithmic where the values span more than 10×.
pub fn tuning_curves(
    path: &Path,
    title: &str,
    curves: &[(String, NetworkCurve)],
) -> Result<(), PlotError> {
    check_png(path)?;
    if curves.iter().all(|(_, c)| c.by_trial.is_empty()) {
        return Err(PlotError::NoData {
            path: path.to_path_buf(),
            what: "no curve has a point: some task never had a correct candidate".into(),
        });
    }
    ensure_font()?;
    draw_curves(path, title, curves).map_err(draw_error(path))
}

/// One line of a panel.
struct Line {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// The time unit that keeps an axis of `max_s` seconds readable.
fn time_unit(max_s: f64) -> (&'static str, f64) {
    if max_s <= 600.0 {
        ("s", 1.0)
    } else if max_s <= 3.0 * 3600.0 {
        ("min", 60.0)
    } else {
        ("h", 3600.0)
    }
}

/// A number for an axis or legend, with about four significant digits.
fn fmt_us(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// An axis tick: whole numbers without decimals, others with at most three significant
/// decimals (plotters' ticks are 1, 2 or 5 × a power of ten, plus rounding noise).
fn fmt_tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".into()
        } else {
            v.to_string()
        };
    }
    if (v - v.round()).abs() <= 1e-9 * v.abs().max(1.0) {
        return format!("{v:.0}");
    }
    let decimals = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let text = format!("{v:.decimals$}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A logarithmic y axis from `.0` to `.1` (both positive) with ticks at 1, 2 and 5 ×
/// powers of ten (or only powers of ten where those would crowd), and light lines at
/// every integer multiple. (plotters' own log axis labels only the upper decades.)
#[derive(Clone, Copy)]
struct LogAxis(f64, f64);

impl LogAxis {
    /// The values `m × 10^k` within the axis for the multipliers `ms`, ascending.
    fn points(&self, ms: &[f64]) -> Vec<f64> {
        let (lo, hi) = (self.0, self.1);
        let mut out = Vec::new();
        let first = lo.log10().floor() as i32;
        let last = hi.log10().ceil() as i32;
        for k in first..=last {
            for m in ms {
                let v = m * 10f64.powi(k);
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
        }
        out
    }
}

impl Ranged for LogAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let (lo, hi) = (self.0.ln(), self.1.ln());
        let frac = (value.max(f64::MIN_POSITIVE).ln() - lo) / (hi - lo);
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        let max = hint.max_num_points();
        let sets: &[&[f64]] = if hint.weight().allow_light_points() {
            &[
                &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                &[1.0, 2.0, 5.0],
                &[1.0],
            ]
        } else {
            &[&[1.0, 2.0, 5.0], &[1.0]]
        };
        sets.iter()
            .map(|ms| self.points(ms))
            .find(|p| p.len() <= max)
            .unwrap_or_default()
    }

    fn range(&self) -> Range<f64> {
        self.0..self.1
    }
}

fn draw_curves(
    path: &Path,
    title: &str,
    curves: &[(String, NetworkCurve)],
) -> Result<(), Box<dyn Error>> {
    let root = BitMapBackend::new(path, CURVES_SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let area = if title.is_empty() {
        root.clone()
    } else {
        root.titled(title, title_font())?
    };
    let (left, right) = area.split_horizontally(CURVES_SIZE.0 / 2);

    let max_s = curves
        .iter()
        .flat_map(|(_, c)| c.by_seconds.iter().map(|&(s, _)| s))
        .filter(|s| s.is_finite())
        .fold(0.0_f64, f64::max);
    let (unit, per_unit) = time_unit(max_s);

    let mut by_trial = Vec::new();
    let mut by_time = Vec::new();
    for (i, (label, curve)) in curves.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let label = match curve.final_sum() {
            Some(us) => format!("{label} ({} µs)", fmt_us(us)),
            None => format!("{label} (no point: a task never succeeded)"),
        };
        by_trial.push(Line {
            label: label.clone(),
            color,
            points: curve
                .by_trial
                .iter()
                .map(|&(t, us)| (t as f64, us))
                .collect(),
        });
        by_time.push(Line {
            label,
            color,
            points: curve
                .by_seconds
                .iter()
                .map(|&(s, us)| (s / per_unit, us))
                .collect(),
        });
    }

    let finite = |lines: &[Line]| -> Vec<(f64, f64)> {
        lines
            .iter()
            .flat_map(|l| l.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite() && *y > 0.0)
            .collect()
    };
    let all = finite(&by_trial);
    let y_min = all.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = all.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let x_max = |points: &[(f64, f64)]| points.iter().map(|p| p.0).fold(1.0_f64, f64::max);
    let trial_max = x_max(&all);
    let time_max = x_max(&finite(&by_time));
    let time_desc = format!("wall-clock time since the first trial ({unit})");

    if y_max > 10.0 * y_min {
        let y = || LogAxis(y_min / 1.15, y_max * 1.15);
        panel(&left, "trials", trial_max, y(), &by_trial, true)?;
        panel(&right, &time_desc, time_max, y(), &by_time, false)?;
    } else {
        let pad = ((y_max - y_min) * 0.06).max(y_max * 0.02);
        let y = || (y_min - pad).max(0.0)..y_max + pad;
        panel(&left, "trials", trial_max, y(), &by_trial, true)?;
        panel(&right, &time_desc, time_max, y(), &by_time, false)?;
    }
    root.present()?;
    Ok(())
}

/// One panel: `lines` against x in 0..`x_max`, y in `y`.
fn panel<Y>(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    x_desc: &str,
    x_max: f64,
    y: Y,
    lines: &[Line],
    legend: bool,
) -> Result<(), Box<dyn Error>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(76)
        .build_cartesian_2d(0.0..x_max * 1.03, y)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("Σ count × best median (µs)")
        .x_label_formatter(&|v| fmt_tick(*v))
        .y_label_formatter(&|v| fmt_tick(*v))
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for line in lines {
        let color = line.color;
        let points = line
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && *y > 0.0);
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(line.label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 22, y)], color.stroke_width(3)));
        // A lone point draws no line: mark it.
        if line.points.len() == 1 {
            chart.draw_series(points.map(|p| Circle::new(p, 4, color.filled())))?;
        }
    }
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curves::{NetworkCurve, Trial, curve_of_trials};

    /// Width and height from a PNG's IHDR chunk, after checking the signature.
    fn png_size(path: &Path) -> (u32, u32) {
        let bytes = std::fs::read(path).unwrap();
        assert!(
            bytes.len() > 24,
            "{} is too short for a PNG",
            path.display()
        );
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    fn layer_bars(n: usize) -> Vec<(String, f64)> {
        (0..n)
            .map(|i| {
                let key = format!(
                    "conv2d_n1_c{}_h{}_w{}_k{}_r3_s3_st1_p1_bias_relu_layer{i}",
                    64 << (i % 4),
                    56 >> (i % 3),
                    56 >> (i % 3),
                    64 << (i % 4)
                );
                (key, 0.6 + 0.11 * i as f64)
            })
            .collect()
    }

    #[test]
    fn speedup_bars_write_a_png_sized_by_the_layer_count() {
        let dir = tempfile::tempdir().unwrap();
        for n in [1, 13, 25] {
            let path = dir.path().join(format!("bars{n}.png"));
            speedup_bars(&path, "resnet: speedup over cuDNN", &layer_bars(n)).unwrap();
            assert_eq!(png_size(&path), bars_size(n));
        }
        assert_eq!(bars_size(1), (BARS_WIDTH, BARS_MIN_HEIGHT));
        assert_eq!(bars_size(25).1, BARS_EXTRA_PX + 25 * BAR_ROW_PX);
    }

    #[test]
    fn speedup_bars_survive_odd_values_and_labels() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.PNG");
        let bars = vec![
            ("x".repeat(300), 1.5),
            (String::new(), f64::NAN),
            ("µ-kernel ×2".to_string(), f64::INFINITY),
            ("negative".to_string(), -1.0),
            ("zero".to_string(), 0.0),
            ("huge".to_string(), 1e6),
        ];
        speedup_bars(&path, "", &bars).unwrap();
        assert_eq!(png_size(&path), bars_size(bars.len()));
    }

    #[test]
    fn bad_outputs_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let bars = layer_bars(3);
        let e = speedup_bars(&dir.path().join("bars.svg"), "t", &bars).unwrap_err();
        assert!(matches!(e, PlotError::NotPng { .. }), "{e}");
        let e = speedup_bars(&dir.path().join("bars.png"), "t", &[]).unwrap_err();
        assert!(matches!(e, PlotError::NoData { .. }), "{e}");
        let missing = dir.path().join("no/such/dir/bars.png");
        let e = speedup_bars(&missing, "t", &bars).unwrap_err();
        assert!(matches!(e, PlotError::Draw { .. }), "{e}");
        assert!(e.to_string().contains("no/such/dir/bars.png"), "{e}");
    }

    fn curve(seed: u64, trials: usize, seconds_per_trial: f64) -> NetworkCurve {
        let tasks = ["a", "b", "c"];
        let mut state = seed;
        let list: Vec<Trial> = (0..trials)
            .map(|i| {
                // A small LCG: times fall as the search goes on, with noise and failures.
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let noise = (state >> 33) as f64 / (1u64 << 31) as f64;
                let us = 100.0 / (1.0 + i as f64 / 40.0) * (1.0 + noise);
                Trial {
                    task: tasks[i % 3].into(),
                    median_us: (!state.is_multiple_of(7)).then_some(us),
                    unix_s: Some(1.8e9 + i as f64 * seconds_per_trial),
                }
            })
            .collect();
        let weights = [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)];
        curve_of_trials(&list, &weights)
    }

    #[test]
    fn tuning_curves_write_a_two_panel_png() {
        let dir = tempfile::tempdir().unwrap();
        // Close curves (linear y axis), in minutes.
        let path = dir.path().join("curves.png");
        let curves = vec![
            ("random".to_string(), curve(1, 600, 2.0)),
            ("evolution".to_string(), curve(2, 500, 3.0)),
            ("dgd".to_string(), curve(3, 400, 1.5)),
        ];
        tuning_curves(&path, "resnet on H100: tuning curves", &curves).unwrap();
        assert_eq!(png_size(&path), CURVES_SIZE);

        // Wide range (log y axis), seconds, a lone point and a curve with no point.
        let path = dir.path().join("curves-log.png");
        let wide = NetworkCurve {
            by_trial: vec![(1, 5000.0), (2, 900.0), (3, 40.0)],
            by_seconds: vec![(0.0, 5000.0), (1.0, 900.0), (2.5, 40.0)],
            ..Default::default()
        };
        let lone = NetworkCurve {
            by_trial: vec![(7, 300.0)],
            by_seconds: vec![(4.0, 300.0)],
            ..Default::default()
        };
        let curves = vec![
            ("wide".to_string(), wide),
            ("lone".to_string(), lone),
            ("unfinished".to_string(), NetworkCurve::default()),
        ];
        tuning_curves(&path, "", &curves).unwrap();
        assert_eq!(png_size(&path), CURVES_SIZE);
    }

    #[test]
    fn tuning_curves_without_points_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.png");
        let e = tuning_curves(&path, "t", &[("x".into(), NetworkCurve::default())]).unwrap_err();
        assert!(matches!(e, PlotError::NoData { .. }), "{e}");
        let e = tuning_curves(&path, "t", &[]).unwrap_err();
        assert!(matches!(e, PlotError::NoData { .. }), "{e}");
        assert!(!path.exists());
    }

    #[test]
    fn a_missing_font_names_the_package_to_install() {
        let dir = tempfile::tempdir().unwrap();
        let e = find_font(None, &[dir.path()]).unwrap_err();
        assert!(matches!(e, PlotError::NoFont { .. }));
        let message = e.to_string();
        assert!(message.contains("fonts-dejavu-core"), "{message}");
        assert!(message.contains(FONT_ENV), "{message}");
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );

        // A font named explicitly must exist; it is not silently replaced.
        let e = find_font(Some("/nonexistent/font.ttf"), &[dir.path()]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/font.ttf"), "{e}");

        // Found in the folders given.
        std::fs::write(dir.path().join(FONT_FILE), b"not a font").unwrap();
        assert_eq!(
            find_font(None, &[Path::new("/nonexistent"), dir.path()]).unwrap(),
            dir.path().join(FONT_FILE)
        );
        // ... but garbage does not register.
        let e = register(
            "tilesched-test",
            FontStyle::Normal,
            &dir.path().join(FONT_FILE),
        )
        .unwrap_err();
        assert!(matches!(e, PlotError::FontInvalid { .. }), "{e}");
    }

    #[test]
    fn the_system_font_loads() {
        let path = ensure_font().unwrap();
        assert!(path.is_file());
        // Idempotent.
        assert_eq!(ensure_font().unwrap(), path);
    }

    #[test]
    fn labels_are_shortened_in_the_middle() {
        assert_eq!(shorten_label("short", 10), "short");
        assert_eq!(shorten_label("abcdefghij", 10), "abcdefghij");
        assert_eq!(shorten_label("abcdefghijk", 6), "abc…jk");
        assert_eq!(shorten_label("ααααββββ", 5), "αα…ββ");
        assert_eq!(shorten_label("abcdef", 2), "abcdef");
        assert_eq!(
            shorten_label(&"x".repeat(300), MAX_LABEL_CHARS)
                .chars()
                .count(),
            MAX_LABEL_CHARS
        );
    }

    #[test]
    fn time_units_and_numbers_read_well() {
        assert_eq!(time_unit(30.0), ("s", 1.0));
        assert_eq!(time_unit(3600.0), ("min", 60.0));
        assert_eq!(time_unit(5.0 * 3600.0), ("h", 3600.0));
        assert_eq!(fmt_us(1234.56), "1235");
        assert_eq!(fmt_us(367.92), "367.9");
        assert_eq!(fmt_us(12.345), "12.35");
        assert_eq!(fmt_us(0.1234), "0.123");
        assert_eq!(fmt_tick(100.0), "100");
        assert_eq!(fmt_tick(0.0), "0");
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(0.30000000000000004), "0.3");
        assert_eq!(fmt_tick(1e6), "1000000");
        assert_eq!(fmt_tick(-0.25), "-0.25");
    }

    #[test]
    fn the_log_axis_ticks_every_decade_it_spans() {
        let axis = LogAxis(35.0, 5750.0);
        assert_eq!(
            axis.key_points(10usize),
            [50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]
        );
        assert_eq!(axis.key_points(3usize), [100.0, 1000.0]);
        assert_eq!(axis.map(&35.0, (0, 100)), 0);
        assert_eq!(axis.map(&5750.0, (0, 100)), 100);
    }
}
