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
