//! One source's stream of indices: the sampler in the mixture's mode over
//! the source's records, read position by position (module docs of
//! [`crate::mixture`]).

use crate::{Blocks, Error, Mode, Sampler, MAX_BATCH};

/// Indices per sampler step of an iid or sequential source stream (the mixture
/// module's docs).
pub const STREAM_BLOCK: u64 = 4096;

/// One source's stream of indices: position `p` is slot `p % block` of the
/// sampler's step `p / block`.
#[derive(Clone, Debug)]
pub(super) struct SourceStream {
    pub(super) sampler: Sampler,
    block: u64,
    pub(super) length: u64,
}

impl SourceStream {
    pub(super) fn new(mode: Mode, length: u64, seed: u64, shape: Option<Blocks>) -> Result<SourceStream, Error> {
        // Cyclic streams are the same however they are cut into steps (module
        // docs); whole cycles per step compute each cycle's keys once.
        let block = match mode {
            Mode::Cyclic | Mode::Blocked if length <= MAX_BATCH => length,
            Mode::Cyclic | Mode::Blocked => 1,
            _ => STREAM_BLOCK.min(length),
        };
        Ok(SourceStream { sampler: Sampler::with_blocks(mode, length, block, seed, shape)?, block, length })
    }

    /// Writes the indices at positions `first .. first + out.len()`.
    pub(super) fn fill(&self, first: u64, out: &mut [u64]) {
        let mut p = first;
        let mut rest = out;
        while !rest.is_empty() {
            let (step, slot) = (p / self.block, p % self.block);
            // Lossless: both are at most the block, itself at most MAX_BATCH.
            let take = (self.block - slot).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at_mut(take);
            self.sampler.fill_positions(step, slot as usize, now);
            p += take as u64;
            rest = later;
        }
    }

    /// The positions after `p` that draw `index` again (drawn at `p`), in
    /// order; empty in iid mode (no inverse), at most `tries` of them.
    pub(super) fn later_positions(&self, mode: Mode, p: u64, index: u64, tries: u32) -> impl Iterator<Item = u64> + '_ {
        let n = self.length;
        let cycle = p / n;
        (1..=u64::from(tries)).map_while(move |k| match mode {
            Mode::Iid => None,
            // Position `q` reads `q mod n`: every n positions.
            Mode::Sequential => p.checked_add(k.checked_mul(n)?),
            // One draw per cycle, at the cycle's inverse position.
            Mode::Cyclic | Mode::Blocked => {
                let c = cycle.checked_add(k)?;
                c.checked_mul(n)?.checked_add(self.sampler.cycle_position(c, index)?)
            }
        })
    }
}
