//! Which records make up a step: one sampler over one set of streams, or a
//! weighted mixture of sources.
//!
//! A plan answers for a step and this loader's shard: the index of each row,
//! the source it comes from (always 0 for one set of streams), and, when a
//! store asks, when each row's record is drawn next by this shard. Rows of a
//! mixture are interleaved; [`Grouping`] sorts them back by source, so each
//! source's rows are one gather.

use zring_sampler::{Error as SamplerError, Mixture, MixtureState, Mode, Sampler, SamplerState, Shard};

pub(crate) enum Plan {
    Single(Sampler),
    Mixture(Mixture),
    /// A run resumed over streams that grew: steps before `boundary` (the
    /// rest of the cycle under way) drawn by `before`, over the records the
    /// run began with; from `boundary` on by `after`
    /// ([`Sampler::grown`]), over all of them.
    Grown {
        before: Sampler,
        after: Sampler,
        boundary: u64,
    },
}

impl Plan {
    pub fn mode(&self) -> Mode {
        match self {
            Plan::Single(s) | Plan::Grown { after: s, .. } => s.state().mode,
            Plan::Mixture(m) => m.mode(),
        }
    }

    /// `shard`'s rows per step (a grown plan's two samplers have the same
    /// batch length: [`crate::Loader::new`] checks).
    pub fn shard_len(&self, shard: Shard) -> Result<usize, SamplerError> {
        match self {
            Plan::Single(s) | Plan::Grown { after: s, .. } => s.shard_len(shard),
            Plan::Mixture(m) => m.shard_len(shard),
        }
    }

    /// The records of the whole index space (a mixture's sources together;
    /// the grown length of a grown plan).
    pub fn length(&self) -> u64 {
        match self {
            Plan::Single(s) | Plan::Grown { after: s, .. } => s.state().length,
            Plan::Mixture(m) => m.total_length(),
        }
    }

    /// Whether `step` is drawn over the records a grown run began with.
    pub fn before_growth(&self, step: u64) -> bool {
        matches!(self, Plan::Grown { boundary, .. } if step < *boundary)
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
            (Plan::Single(s), next) => fill_single(s, step, shard, indices, next),
            (Plan::Mixture(m), None) => m.fill_shard(step, shard, sources, indices),
            (Plan::Mixture(m), Some(next)) => m.fill_shard_with_next_use(step, shard, sources, indices, next),
            (Plan::Grown { after, boundary, .. }, next) if step >= *boundary => {
                fill_single(after, step, shard, indices, next)
            }
            (Plan::Grown { before, .. }, None) => before.fill_shard(step, shard, indices),
            (Plan::Grown { before, boundary, .. }, Some(next)) => {
                fill_single(before, step, shard, indices, Some(&mut *next))?;
                // `before` knows nothing past the boundary: a next use
                // there is not one, and is left unknown.
                for n in next.iter_mut() {
                    if n.is_some_and(|s| s >= *boundary) {
                        *n = None;
                    }
                }
                Ok(())
            }
        }
    }

    /// The sampler state at `step` (a mixture's counts the records of all
    /// its sources), and the mixture's own part.
    pub fn state(&self, step: u64) -> (SamplerState, Option<MixtureState>) {
        match self {
            Plan::Single(s) => (single_state(s, step), None),
            Plan::Grown { before, after, boundary } => {
                (single_state(if step < *boundary { before } else { after }, step), None)
            }
            Plan::Mixture(m) => {
                let state = SamplerState {
                    mode: m.mode(),
                    seed: m.seed(),
                    step,
                    length: m.total_length(),
                    batch_size: m.batch_len() as u64,
                    origin: 0,
                    blocks: None,
                };
                (state, Some(m.state()))
            }
        }
    }
}

fn fill_single(
    s: &Sampler,
    step: u64,
    shard: Shard,
    indices: &mut [u64],
    next: Option<&mut [Option<u64>]>,
) -> Result<(), SamplerError> {
    match next {
        None => s.fill_shard(step, shard, indices),
        Some(next) => s.fill_shard_with_next_use(step, shard, indices, next),
    }
}

fn single_state(s: &Sampler, step: u64) -> SamplerState {
    SamplerState { step, ..s.state() }
}

/// How a step's rows are read: grouped by source, one run of slots per
/// source, and where each slot's row is.
pub(crate) struct Grouping {
    /// `(source, slots)` in order, each source once at most.
    pub runs: Vec<(usize, std::ops::Range<usize>)>,
    /// The row of each grouped slot; `None` when the rows already come
    /// source by source (slot `i` is row `i`).
    pub order: Option<Vec<usize>>,
}

impl Grouping {
    /// All `rows` from source 0.
    pub fn single(rows: usize) -> Grouping {
        Grouping { runs: vec![(0, 0..rows)], order: None }
    }

    /// The grouping of rows drawn from `sources` (one per row): a stable
    /// counting sort by source.
    pub fn new(sources: &[u32]) -> Grouping {
        let grouped = runs(sources).collect::<Vec<_>>();
        let mut seen = std::collections::HashSet::with_capacity(grouped.len());
        if grouped.iter().all(|(k, _)| seen.insert(*k)) {
            return Grouping { runs: grouped, order: None };
        }
        let count = sources.iter().map(|&k| k as usize + 1).max().unwrap_or(0);
        let mut starts = vec![0usize; count + 1];
        for &k in sources {
            starts[k as usize + 1] += 1;
        }
        for k in 0..count {
            starts[k + 1] += starts[k];
        }
        let runs = (0..count).filter(|&k| starts[k + 1] > starts[k]).map(|k| (k, starts[k]..starts[k + 1])).collect();
        let mut order = vec![0; sources.len()];
        for (row, &k) in sources.iter().enumerate() {
            order[starts[k as usize]] = row;
            starts[k as usize] += 1;
        }
        Grouping { runs, order: Some(order) }
    }
}

/// The runs of equal sources in `sources`: `(source, rows)` in order.
fn runs(sources: &[u32]) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
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
    fn interleaved_rows_group_by_source_in_row_order() {
        let g = Grouping::new(&[2, 0, 2, 1, 0]);
        assert_eq!(g.runs, vec![(0, 0..2), (1, 2..3), (2, 3..5)]);
        assert_eq!(g.order, Some(vec![1, 4, 3, 0, 2]));
        let g = Grouping::new(&[3, 3, 1]);
        assert_eq!(g.runs, vec![(3, 0..2), (1, 2..3)]);
        assert_eq!(g.order, None, "already one run per source");
    }

    #[test]
    fn runs_split_rows_by_source() {
        let got: Vec<_> = runs(&[0, 0, 2, 2, 2, 5]).collect();
        assert_eq!(got, vec![(0, 0..2), (2, 2..5), (5, 5..6)]);
        assert_eq!(runs(&[]).count(), 0);
        assert_eq!(runs(&[0; 7]).collect::<Vec<_>>(), vec![(0, 0..7)]);
    }
}
