//! Which records make up a step: one sampler over one set of streams, or a
//! weighted mixture of sources.
//!
//! A plan answers for a step and this loader's shard: the index of each row,
//! the source it comes from (always 0 for one set of streams), and, when a
//! store asks, when each row's record is drawn next by this shard. Rows of a
//! mixture come source by source, so a step is a few contiguous runs, one per
//! source with rows in the shard, and each run is one gather of that source.

use zring_sampler::{Error as SamplerError, Mixture, MixtureState, Mode, Sampler, SamplerState, Shard};

pub(crate) enum Plan {
    Single(Sampler),
    Mixture(Mixture),
}

impl Plan {
    pub fn mode(&self) -> Mode {
        match self {
            Plan::Single(s) => s.state().mode,
            Plan::Mixture(m) => m.mode(),
        }
    }

    pub fn shard_len(&self, shard: Shard) -> Result<usize, SamplerError> {
        match self {
            Plan::Single(s) => s.shard_len(shard),
            Plan::Mixture(m) => m.shard_len(shard),
        }
    }

    /// The records of the whole index space (a mixture's sources together).
    pub fn length(&self) -> u64 {
        match self {
            Plan::Single(s) => s.state().length,
            Plan::Mixture(m) => m.total_length(),
        }
    }

    /// `shard`'s rows of `step`: each row's source (left alone for a single
    /// plan, whose rows all come from source 0) and index; with `next`, each
    /// row's next use by this shard where the plan knows it (iid: `None`).
    pub fn fill(
        &self,
        step: u64,
        shard: Shard,
        sources: &mut [u32],
        indices: &mut [u64],
        next: Option<&mut [Option<u64>]>,
    ) -> Result<(), SamplerError> {
        match (self, next) {
            (Plan::Single(s), None) => s.fill_shard(step, shard, indices),
            (Plan::Single(s), Some(next)) => s.fill_shard_with_next_use(step, shard, indices, next),
            (Plan::Mixture(m), None) => m.fill_shard(step, shard, sources, indices),
            (Plan::Mixture(m), Some(next)) => m.fill_shard_with_next_use(step, shard, sources, indices, next),
        }
    }

    /// The sampler state at `step` (a mixture's counts the records of all
    /// its sources), and the mixture's own part.
    pub fn state(&self, step: u64) -> (SamplerState, Option<MixtureState>) {
        match self {
            Plan::Single(s) => {
                let mut state = s.state();
                state.step = step;
                (state, None)
            }
            Plan::Mixture(m) => {
                let state = SamplerState {
                    mode: m.mode(),
                    seed: m.seed(),
                    step,
                    length: m.total_length(),
                    batch_size: m.batch_len() as u64,
                    origin: 0,
                };
                (state, Some(m.state()))
            }
        }
    }
}

/// The runs of equal sources in `sources` (rows come source by source):
/// `(source, rows)` in order.
pub(crate) fn runs(sources: &[u32]) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let &first = sources.get(at)?;
        let len = sources[at..].iter().take_while(|&&s| s == first).count();
        let run = at..at + len;
        at += len;
        Some((first as usize, run))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_rows_by_source() {
        let got: Vec<_> = runs(&[0, 0, 2, 2, 2, 5]).collect();
        assert_eq!(got, vec![(0, 0..2), (2, 2..5), (5, 5..6)]);
        assert_eq!(runs(&[]).count(), 0);
        assert_eq!(runs(&[0; 7]).collect::<Vec<_>>(), vec![(0, 0..7)]);
    }
}
