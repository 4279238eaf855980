//! Row-span staging (`MmaTiling::row_span`): a channels-last convolution with few
//! channels, its activations staged as raw input-row runs instead of im2col tiles.
//!
//! Why: with C = 3 (a stem) an im2col tile's rows are 6-byte pixels, so its copies move
//! 2 bytes each and no `ldmatrix` can read it; the stem ran at 0.78x of cuDNN at batch 8.
//! But in NHWC the taps of one filter row `r` of output pixel `ow`, its S pixels × C
//! channels, are one run of S·C elements of input row `ih = oh·stride_h − pad_h +
//! r·dilation_h`, and neighbouring pixels' runs are `stride_w · C` elements apart. So
//! the K tile is one filter row, its column `k = kz + s·C + c` (zero weights at the other
//! columns), and a group of 16 output pixels of one output row stages the input elements
//! its windows cover, copied 16 bytes at a time (zeros outside the image), once for all
//! their taps. A's element (pixel ρ of the group, k) is run element `ρ · stride_w·C + k +
//! skew` (`atom::span`). With `stride_w · C` even and `kz` (0 or 1) chosen so that
//! `pad_w·C + kz` is even, every pair of k a fragment register holds starts at an even
//! element: one 32-bit shared load. A hand-written kernel of this form ran the ResNet
//! stem at 1.5x cuDNN on an H100 (benchmarks/results/h100-2026-11-26/
//! stem-row-span-experiment).
//!
//! Pixels are numbered in rows padded to whole groups (`row_pixels`), so that no group
//! straddles two output rows; the padding pixels compute what nobody stores. The weights
//! of a block's filter rows, `R × block_n × K tile` with the zero columns, are read into
//! shared memory once per block, element by element (a filter row's S·C run is rarely
//! 16-byte aligned), and stay there through the reduction.

use crate::atom::SpanLayout;
use crate::atom::span::GROUP_ROWS;
use crate::task::Contraction;
use thiserror::Error;

/// Elements of one 16-byte copy of a 2-byte element type.
pub const COPY_ELEMENTS: i64 = 8;

/// Why a contraction's activations cannot be staged as row spans.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub enum RowSpanError {
    #[error("row spans stage a channels-last convolution's activations; this task is not one")]
    NotChannelsLast,
    #[error("row spans need one group (this convolution has {0})")]
    Groups(u32),
    #[error("row spans need dilation 1 along the width (this convolution has {0})")]
    Dilation(u32),
    #[error("row spans need 2-byte elements: a fragment register holds a pair of them")]
    ElementBytes,
    #[error(
        "row spans copy 16 bytes at a time: an input row of {row} elements is not a multiple of 8"
    )]
    RowElements { row: i64 },
    #[error("row spans read pairs at even elements: stride_w x channels = {step} must be even")]
    OddStep { step: i64 },
}

/// A convolution's geometry as row spans see it, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpan {
    pub images: i64,
    pub height: i64,
    pub channels: i64,
    /// Elements of one input row: width × channels.
    pub row_elements: i64,
    pub out_height: i64,
    pub out_width: i64,
    /// Output pixels per row, padded to whole groups.
    pub row_pixels: i64,
    /// Filter rows: the K tiles.
    pub filter_rows: i64,
    /// Taps of one filter row: S × C.
    pub taps: i64,
    pub stride_h: i64,
    pub pad_h: i64,
    pub dilation_h: i64,
    /// Elements between neighbouring pixels' windows: stride_w × C.
    pub row_step: i64,
    /// Elements of the left padding: pad_w × C.
    pub pad_elements: i64,
    /// Zero-weight columns before the taps (0 or 1).
    pub zero_columns: i64,
    /// Elements a group's run starts before its first pixel's `stride_w·C` multiple:
    /// the padding and the zero columns, rounded up to a multiple of 8 so that runs
    /// start 16-byte aligned.
    pub lead: i64,
}

impl RowSpan {
    pub fn of(c: &Contraction) -> Result<RowSpan, RowSpanError> {
        let conv = c.channels_last_conv.ok_or(RowSpanError::NotChannelsLast)?;
        if conv.groups != 1 {
            return Err(RowSpanError::Groups(conv.groups));
        }
        if conv.dilation_w != 1 {
            return Err(RowSpanError::Dilation(conv.dilation_w));
        }
        if c.dtype.bytes() != 2 {
            return Err(RowSpanError::ElementBytes);
        }
        let channels = i64::from(conv.c);
        let row_elements = i64::from(conv.w) * channels;
        if row_elements % COPY_ELEMENTS != 0 {
            return Err(RowSpanError::RowElements { row: row_elements });
        }
        let row_step = i64::from(conv.stride_w) * channels;
        if row_step % 2 != 0 {
            return Err(RowSpanError::OddStep { step: row_step });
        }
        let (oh, ow) = conv.output_size().expect("tasks are checked when built");
        let before = i64::from(conv.pad_w) * channels;
        let zero_columns = before % 2;
        Ok(RowSpan {
            images: i64::from(conv.n),
            height: i64::from(conv.h),
            channels,
            row_elements,
            out_height: i64::from(oh),
            out_width: i64::from(ow),
            row_pixels: round_up(i64::from(ow), GROUP_ROWS),
            filter_rows: i64::from(conv.r),
            taps: i64::from(conv.s) * channels,
            stride_h: i64::from(conv.stride_h),
            pad_h: i64::from(conv.pad_h),
            dilation_h: i64::from(conv.dilation_h),
            row_step,
            pad_elements: before,
            zero_columns,
            lead: round_up(before + zero_columns, COPY_ELEMENTS),
        })
    }

    /// The padded pixels: the GEMM rows the grid tiles.
    pub fn pixels(&self) -> u64 {
        (self.images * self.out_height * self.row_pixels) as u64
    }

    /// Columns a K tile must hold: the zero columns and the taps.
    pub fn columns(&self) -> i64 {
        self.zero_columns + self.taps
    }

    /// The A stage of `rows` pixels (whole groups) and K tile `k_tile`: each group's run
    /// covers its last pixel's window, in whole copies.
    pub fn layout(&self, rows: i64, k_tile: i64) -> SpanLayout {
        let skew = self.skew();
        let last = (GROUP_ROWS - 1) * self.row_step + skew + k_tile;
        SpanLayout {
            groups: rows / GROUP_ROWS,
            group_elements: round_up(last, COPY_ELEMENTS),
            row_step: self.row_step,
            skew,
        }
    }

    /// Run elements before column 0 of a group's first pixel: `lead` less the padding
    /// and the zero columns, even by the choice of `zero_columns`.
    pub fn skew(&self) -> i64 {
        self.lead - self.pad_elements - self.zero_columns
    }
}

/// `x` rounded up to a multiple of `to` (both positive).
pub fn round_up(x: i64, to: i64) -> i64 {
    (x + to - 1) / to * to
}
