//! One source's stream of indices: the sampler in the mixture's mode over
//! the source's records, read position by position (module docs of
//! [`crate::mixture`]). A source that grew during a run has more than one
//! segment: cycles from a segment's first cycle draw its records, in an
//! order keyed apart from the segments before, and positions run on across
//! segments without a gap.

use std::ops::Range;

use crate::{Blocks, Error, Mode, Sampler, MAX_BATCH};

/// Indices per sampler step of an iid or sequential source stream (the mixture
/// module's docs).
pub const STREAM_BLOCK: u64 = 4096;

/// Cycles from `first_cycle` (to the next segment's) over `length` records.
#[derive(Clone, Debug)]
struct Segment {
    first_cycle: u64,
    /// The stream position of `first_cycle`'s first row.
    first_pos: u64,
    length: u64,
    sampler: Sampler,
    block: u64,
}

/// One source's stream of indices: position `p` of a segment is slot
/// `p % block` of its sampler's step `p / block` (`p` counted from the
/// segment's first position).
#[derive(Clone, Debug)]
pub(super) struct SourceStream {
    mode: Mode,
    seed: u64,
    shape: Option<Blocks>,
    segments: Vec<Segment>,
}

/// splitmix64's finaliser: a grown segment's seed from the source's.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SourceStream {
    pub(super) fn new(mode: Mode, length: u64, seed: u64, shape: Option<Blocks>) -> Result<SourceStream, Error> {
        let mut s = SourceStream { mode, seed, shape, segments: Vec::new() };
        s.push(0, length)?;
        Ok(s)
    }

    /// The stream as `growth` says: `(first cycle, records)` of each
    /// segment, the first from cycle 0.
    pub(super) fn with_growth(
        mode: Mode,
        growth: &[(u64, u64)],
        seed: u64,
        shape: Option<Blocks>,
    ) -> Result<SourceStream, Error> {
        let bad = || Error::BadGrowth { growth: growth.to_vec() };
        let ok =
            growth.first().is_some_and(|g| g.0 == 0) && growth.windows(2).all(|w| w[1].0 > w[0].0 && w[1].1 > w[0].1);
        if !ok {
            return Err(bad());
        }
        let mut s = SourceStream { mode, seed, shape, segments: Vec::new() };
        for &(c, n) in growth {
            s.push(c, n)?;
        }
        Ok(s)
    }

    /// Adds the segment of cycles from `first_cycle` (after the last
    /// segment's first) over `length` records.
    pub(super) fn push(&mut self, first_cycle: u64, length: u64) -> Result<(), Error> {
        // Cyclic streams are the same however they are cut into steps (module
        // docs); whole cycles per step compute each cycle's keys once.
        let block = match self.mode {
            Mode::Cyclic | Mode::Blocked if length <= MAX_BATCH => length,
            Mode::Cyclic | Mode::Blocked => 1,
            _ => STREAM_BLOCK.min(length),
        };
        let first_pos = match self.segments.last() {
            None => 0,
            Some(s) => (first_cycle - s.first_cycle)
                .checked_mul(s.length)
                .and_then(|p| p.checked_add(s.first_pos))
                .ok_or(Error::BadGrowth { growth: self.growth() })?,
        };
        let seed = if first_cycle == 0 { self.seed } else { mix(self.seed ^ mix(first_cycle)) };
        let sampler = Sampler::with_blocks(self.mode, length, block, seed, self.shape)?;
        self.segments.push(Segment { first_cycle, first_pos, length, sampler, block });
        Ok(())
    }

    /// `(first cycle, records)` of each segment.
    pub(super) fn growth(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|s| (s.first_cycle, s.length)).collect()
    }

    fn segment_of_position(&self, p: u64) -> (usize, &Segment) {
        let k = self.segments.partition_point(|s| s.first_pos <= p).max(1) - 1;
        (k, &self.segments[k])
    }

    fn segment_of_cycle(&self, c: u64) -> &Segment {
        let k = self.segments.partition_point(|s| s.first_cycle <= c).max(1) - 1;
        &self.segments[k]
    }

    /// Position `p` as (its cycle, its place in the cycle).
    pub(super) fn cycle_of(&self, p: u64) -> (u64, u64) {
        let (_, s) = self.segment_of_position(p);
        let local = p - s.first_pos;
        (s.first_cycle + local / s.length, local % s.length)
    }

    /// The stream position of cycle `c`'s first row.
    pub(super) fn cycle_base(&self, c: u64) -> Option<u64> {
        let s = self.segment_of_cycle(c);
        (c - s.first_cycle).checked_mul(s.length)?.checked_add(s.first_pos)
    }

    /// Mode 3: window `w` of cycle `c` (positions within the cycle, and its
    /// blocks' index ranges).
    pub(super) fn cycle_window(&self, c: u64, w: u64) -> Option<(Range<u64>, Vec<Range<u64>>)> {
        let s = self.segment_of_cycle(c);
        s.sampler.cycle_window(c - s.first_cycle, w)
    }

    /// Mode 3: the window of cycle `c` holding its place `q`.
    pub(super) fn cycle_window_of(&self, c: u64, q: u64) -> Option<u64> {
        let s = self.segment_of_cycle(c);
        s.sampler.cycle_window_of(c - s.first_cycle, q)
    }

    /// The place in cycle `c` that draws record `index`.
    pub(super) fn cycle_position(&self, c: u64, index: u64) -> Option<u64> {
        let s = self.segment_of_cycle(c);
        s.sampler.cycle_position(c - s.first_cycle, index)
    }

    /// Writes the indices at positions `first .. first + out.len()`.
    pub(super) fn fill(&self, first: u64, out: &mut [u64]) {
        let mut p = first;
        let mut rest = out;
        while !rest.is_empty() {
            let (k, s) = self.segment_of_position(p);
            let end = self.segments.get(k + 1).map_or(u64::MAX, |next| next.first_pos);
            let local = p - s.first_pos;
            let (step, slot) = (local / s.block, local % s.block);
            // Lossless: both are at most the block, itself at most MAX_BATCH.
            let take = (s.block - slot).min(rest.len() as u64).min(end - p) as usize;
            let (now, later) = rest.split_at_mut(take);
            s.sampler.fill_positions(step, slot as usize, now);
            p += take as u64;
            rest = later;
        }
    }

    /// The positions after `p` that draw `index` again (drawn at `p`), in
    /// order, within `p`'s segment; empty in iid mode (no inverse), at most
    /// `tries` of them.
    pub(super) fn later_positions(&self, mode: Mode, p: u64, index: u64, tries: u32) -> impl Iterator<Item = u64> + '_ {
        let (k, s) = self.segment_of_position(p);
        let end = self.segments.get(k + 1).map_or(u64::MAX, |next| next.first_pos);
        let n = s.length;
        let (cycle, _) = self.cycle_of(p);
        (1..=u64::from(tries))
            .map_while(move |j| match mode {
                Mode::Iid => None,
                // Position `q` reads `q mod n`: every n positions.
                Mode::Sequential => p.checked_add(j.checked_mul(n)?),
                // One draw per cycle, at the cycle's inverse position.
                Mode::Cyclic | Mode::Blocked => {
                    let c = cycle.checked_add(j)?;
                    self.cycle_base(c)?.checked_add(s.sampler.cycle_position(c - s.first_cycle, index)?)
                }
            })
            .take_while(move |&q| q < end)
    }
}
