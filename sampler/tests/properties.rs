//! Randomised properties of the sampler's public API: seeking, state and
//! shards agree with plain iteration for any mode, seed, size and step.

use proptest::prelude::*;
use zring_sampler::{Mode, Sampler, SamplerState, Shard};

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Sequential), Just(Mode::Iid), Just(Mode::Cyclic)]
}

/// Lengths from tiny to large; batches up to a little above the length so the
/// "store smaller than a batch" case is covered.
fn shape() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        (1u64..=40).prop_flat_map(|n| (Just(n), 1u64..=48)),
        (41u64..=1_000_000).prop_flat_map(|n| (Just(n), 1u64..=300)),
        ((1u64 << 40)..=u64::MAX).prop_flat_map(|n| (Just(n), 1u64..=64)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn seek_equals_drawing_every_batch_before(
        mode in mode(), seed in any::<u64>(), (length, batch) in shape(), s in 0u64..40,
    ) {
        let mut walked = Sampler::new(mode, length, batch, seed).unwrap();
        for _ in 0..s {
            walked.next_batch();
        }
        let mut sought = Sampler::new(mode, length, batch, seed).unwrap();
        sought.seek(s);
        prop_assert_eq!(sought.step(), walked.step());
        prop_assert_eq!(sought.next_batch(), walked.next_batch());
        prop_assert_eq!(sought.next_batch(), walked.next_batch());
    }

    #[test]
    fn batches_are_in_range_full_and_fill_agrees(
        mode in mode(), seed in any::<u64>(), (length, batch) in shape(), step in any::<u64>(),
    ) {
        let s = Sampler::new(mode, length, batch, seed).unwrap();
        let b = s.batch(step);
        prop_assert_eq!(b.len(), batch.min(length) as usize);
        prop_assert_eq!(b.len(), s.batch_len());
        prop_assert!(b.iter().all(|&i| i < length));
        let mut out = vec![u64::MAX; s.batch_len()];
        s.fill(step, &mut out).unwrap();
        prop_assert_eq!(&out, &b);
        // Determinism: a second sampler with the same inputs agrees.
        prop_assert_eq!(Sampler::new(mode, length, batch, seed).unwrap().batch(step), b);
    }

    #[test]
    fn from_state_continues_identically(
        mode in mode(), seed in any::<u64>(), (length, batch) in shape(), step in any::<u64>(),
    ) {
        let mut original = Sampler::new(mode, length, batch, seed).unwrap();
        original.seek(step);
        let json = serde_json::to_string(&original.state()).unwrap();
        let state: SamplerState = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&state, &original.state());
        let mut resumed = Sampler::from_state(&state).unwrap();
        for _ in 0..3 {
            prop_assert_eq!(resumed.next_batch(), original.next_batch());
        }
        prop_assert_eq!(resumed.state(), original.state());
    }

    #[test]
    fn shards_concatenate_to_the_global_batch(
        mode in mode(), seed in any::<u64>(), length in 1u64..100_000,
        per_shard in 1u64..40, step in any::<u64>(),
    ) {
        // A batch divisible by 24 covers shard counts 1, 2, 3, 4 and 8.
        let batch = 24 * per_shard;
        let s = Sampler::new(mode, length, batch, seed).unwrap();
        let global = s.batch(step);
        for count in [1u32, 2, 3, 4, 8] {
            let count_usize = count as usize;
            if s.batch_len() / count_usize * count_usize != s.batch_len() {
                prop_assert!(s.shard_len(Shard::new(0, count).unwrap()).is_err());
                continue;
            }
            let mut joined = Vec::with_capacity(global.len());
            for index in 0..count {
                let shard = Shard::new(index, count).unwrap();
                let mut part = vec![0; s.shard_len(shard).unwrap()];
                s.fill_shard(step, shard, &mut part).unwrap();
                joined.extend_from_slice(&part);
            }
            prop_assert_eq!(&joined, &global);
        }
    }

    #[test]
    fn cyclic_batches_hold_distinct_indices(
        seed in any::<u64>(), (length, batch) in shape(), step in any::<u64>(),
    ) {
        let s = Sampler::new(Mode::Cyclic, length, batch, seed).unwrap();
        let mut b = s.batch(step);
        b.sort_unstable();
        b.dedup();
        prop_assert_eq!(b.len(), s.batch_len());
    }

    #[test]
    fn cyclic_small_cycle_is_a_permutation(
        seed in any::<u64>(), length in 1u64..200, batch_seed in any::<u64>(), cycle in 0u64..1000,
    ) {
        // A batch that divides the length, so one cycle covers every index.
        let divisors: Vec<u64> = (1..=length).filter(|b| length / b * b == length).collect();
        let batch = divisors[(batch_seed % divisors.len() as u64) as usize];
        let s = Sampler::new(Mode::Cyclic, length, batch, seed).unwrap();
        let steps = length / batch;
        let mut all: Vec<u64> = (cycle * steps..(cycle + 1) * steps)
            .flat_map(|step| s.batch(step))
            .collect();
        all.sort_unstable();
        prop_assert_eq!(all, (0..length).collect::<Vec<u64>>());
    }
}

/// The first step after `after` whose batch contains `index`, by scanning
/// batches: up to the end of the 64 cycles [`Sampler::next_use`] searches in
/// cyclic mode (`length / batch_len` steps each), or the `length + 1` steps
/// in which a sequential walk meets every index, never past `u64::MAX`.
fn next_use_by_scanning(s: &Sampler, mode: Mode, index: u64, after: u64) -> Option<u64> {
    let length = s.state().length;
    let per_cycle = length / s.batch_len() as u64;
    let first = after.checked_add(1)?;
    let last = match mode {
        Mode::Cyclic => {
            let end = (u128::from(first / per_cycle) + 64) * u128::from(per_cycle) - 1;
            u64::try_from(end).unwrap_or(u64::MAX)
        }
        _ => after.saturating_add(length + 1),
    };
    (first..=last).find(|&step| s.batch(step).contains(&index))
}

/// Small index spaces and batches, where scanning is cheap and every shape of
/// cycle (remainder or not, batch larger than the store) comes up.
fn small_shape() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        (1u64..=40).prop_flat_map(|n| (Just(n), 1u64..=48)),
        (41u64..=2_000).prop_flat_map(|n| (Just(n), 1u64..=64)),
    ]
}

/// Steps from the start, mid-run, and at the very end of the step range.
fn after_step() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..5_000, (u64::MAX - 200)..=u64::MAX]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn next_use_equals_the_first_batch_found_by_scanning(
        mode in prop_oneof![Just(Mode::Sequential), Just(Mode::Cyclic)],
        seed in any::<u64>(), (length, batch) in small_shape(), after in after_step(), pick in any::<u64>(),
    ) {
        let s = Sampler::new(mode, length, batch, seed).unwrap();
        // Mostly an index of the batch of `after` (what a loader asks
        // about), sometimes any index, now and then one out of range.
        let index = match pick % 8 {
            0 => length + pick % 3,
            1 | 2 => pick % length,
            _ => s.batch(after)[(pick % s.batch_len() as u64) as usize],
        };
        let scanned = next_use_by_scanning(&s, mode, index, after);
        prop_assert_eq!(s.next_use(index, after), scanned, "index {} after {}", index, after);
        if index < length && u128::from(u64::MAX - after) >= 64 * u128::from(length) {
            // Far from the end of the step range every index comes again
            // (barring a chance below 2^-63 in cyclic mode).
            prop_assert!(scanned.is_some());
        }
    }

    #[test]
    fn fill_next_use_agrees_with_next_use(
        mode in mode(), seed in any::<u64>(), (length, batch) in shape(), after in any::<u64>(),
    ) {
        let s = Sampler::new(mode, length, batch, seed).unwrap();
        let indices = s.batch(after);
        let mut out = vec![Some(7); indices.len()];
        s.fill_next_use(after, &indices, &mut out).unwrap();
        for (&index, &next) in indices.iter().zip(&out) {
            prop_assert_eq!(next, s.next_use(index, after));
            match (mode, next) {
                // Iid knows nothing of later steps.
                (Mode::Iid, next) => prop_assert_eq!(next, None),
                (_, Some(step)) => {
                    prop_assert!(step > after);
                    prop_assert!(s.batch(step).contains(&index));
                }
                // No later step exists: the 64 cycles searched (of at most
                // `length` steps each) run past the last step.
                (_, None) => prop_assert!(u128::from(u64::MAX - after) < 64 * u128::from(length)),
            }
        }
        prop_assert!(s.fill_next_use(after, &indices, &mut out[1..]).is_err());
    }

    #[test]
    fn fill_shard_with_next_use_agrees_with_its_parts(
        mode in mode(), seed in any::<u64>(), length in 1u64..100_000,
        per_shard in 1u64..40, step in after_step(), index in 0u32..4,
    ) {
        let Some((s, shard, indices, next)) = shard_next_use(mode, seed, length, per_shard, index, step) else {
            return Ok(());
        };
        let len = indices.len();
        let mut want = vec![0; len];
        s.fill_shard(step, shard, &mut want).unwrap();
        prop_assert_eq!(&indices, &want);
        let mut all = vec![0; s.batch_len()];
        let mut all_next = vec![None; s.batch_len()];
        s.fill_shard_with_next_use(step, Shard::ALL, &mut all, &mut all_next).unwrap();
        for (&i, &n) in all.iter().zip(&all_next) {
            prop_assert_eq!(n, s.next_use(i, step));
        }
        // A shard's next use is a step at which that shard draws the index,
        // never before the global next use.
        for (&i, &n) in indices.iter().zip(&next) {
            if let Some(t) = n {
                let mut at = vec![0; len];
                s.fill_shard(t, shard, &mut at).unwrap();
                prop_assert!(at.contains(&i));
                prop_assert!(s.next_use(i, step).is_some_and(|g| g <= t));
            }
        }
        let (mut indices, mut next) = (indices, next);
        prop_assert!(s.fill_shard_with_next_use(step, shard, &mut indices, &mut next[1..]).is_err());
    }

    /// Exhaustively on small samplers: a shard's next use is the first later
    /// step whose slice of the batch holds the index.
    #[test]
    fn a_shards_next_use_is_its_own_next_draw(
        mode in prop_oneof![Just(Mode::Sequential), Just(Mode::Cyclic)], seed in any::<u64>(),
        length in 1u64..60, per_shard in 1u64..5, step in 0u64..50, index in 0u32..4,
    ) {
        let Some((s, shard, indices, next)) = shard_next_use(mode, seed, length, per_shard, index, step) else {
            return Ok(());
        };
        let len = indices.len();
        let mut at = vec![0; len];
        for (&i, &n) in indices.iter().zip(&next) {
            let want = (step + 1..step + 2_000).find(|&t| {
                s.fill_shard(t, shard, &mut at).unwrap();
                at.contains(&i)
            });
            prop_assert_eq!(n, want, "index {}", i);
        }
    }
}

/// A sampler, one of its shards, and that shard's indices at a step with
/// their next uses.
type ShardDraws = (Sampler, Shard, Vec<u64>, Vec<Option<u64>>);

/// A sampler of batches of `4 * per_shard`, shard `index` of 4, and that
/// shard's indices at `step` with their next uses; `None` where the batch
/// does not split in four (a batch shortened to the length).
fn shard_next_use(mode: Mode, seed: u64, length: u64, per_shard: u64, index: u32, step: u64) -> Option<ShardDraws> {
    let s = Sampler::new(mode, length, 4 * per_shard, seed).unwrap();
    let shard = Shard::new(index, 4).unwrap();
    let len = s.shard_len(shard).ok()?;
    let mut indices = vec![0; len];
    let mut next = vec![None; len];
    s.fill_shard_with_next_use(step, shard, &mut indices, &mut next).unwrap();
    Some((s, shard, indices, next))
}
