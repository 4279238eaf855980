//! The state of the assembly game as a matrix: one row per instruction in the current
//! order, with CuAsmRL's per-instruction features (wait mask, read and write barriers,
//! yield, stall, predicate and memory-op flags, operand register ids) plus what our
//! analysis knows (movable, pinned, variable latency, opcode class).

use crate::legality::analysis::Kernel;
use crate::legality::order::Order;

/// Features per row.
pub const COLUMNS: usize = 32;

/// The row-major `len × COLUMNS` observation of `order`.
pub fn observation(kernel: &Kernel, order: &Order) -> Vec<f32> {
    let mut out = Vec::with_capacity(kernel.len() * COLUMNS);
    for p in 0..kernel.len() {
        let i = order.at(p);
        let ins = &kernel.instructions[i];
        let c = kernel.effective_control(order, p);
        let mut row = [0f32; COLUMNS];
        for k in 0..6 {
            row[k] = f32::from(u8::from(c.waits_on(k as u8)));
            row[6 + k] = f32::from(u8::from(c.write_barrier == Some(k as u8)));
            row[12 + k] = f32::from(u8::from(c.read_barrier == Some(k as u8)));
        }
        row[18] = f32::from(u8::from(c.yield_bit));
        row[19] = f32::from(c.stall) / 15.0;
        row[20] = f32::from(u8::from(ins.guarded));
        row[21] = f32::from(u8::from(ins.reads.is_some()));
        row[22] = f32::from(u8::from(ins.writes.is_some()));
        row[23] = f32::from(u8::from(ins.movable()));
        row[24] = f32::from(u8::from(kernel.pinned[i].is_some()));
        row[25] = f32::from(u8::from(ins.variable_latency()));
        let fp = ins.base.starts_with('F') || ins.base.starts_with('H');
        row[26] = f32::from(u8::from(fp));
        row[27] = f32::from(u8::from(ins.ends_block()));
        let reg = |r: Option<&u16>| r.map_or(0.0, |&r| f32::from(r) / 336.0);
        row[28] = reg(ins.defs.first());
        row[29] = reg(ins.uses.first());
        row[30] = reg(ins.uses.get(1));
        row[31] = reg(ins.uses.get(2));
        out.extend_from_slice(&row);
    }
    out
}
