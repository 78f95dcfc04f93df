//! Unit tests of the public behaviour of [`Sampler`] on fixed inputs.
//! Randomised properties are in `tests/properties.rs`.

use std::collections::HashSet;

use crate::random::mix64;
use crate::{Error, Mode, Sampler, SamplerState, Shard, MAX_BATCH};

const MODES: [Mode; 3] = [Mode::Sequential, Mode::Iid, Mode::Cyclic];

fn sampler(mode: Mode, length: u64, batch: u64, seed: u64) -> Sampler {
    Sampler::new(mode, length, batch, seed).expect("valid sampler")
}

/// All indices of one cycle of a cyclic sampler, in order.
fn cycle(s: &Sampler, cycle: u64) -> Vec<u64> {
    let state = s.state();
    let steps = state.length / s.batch_len() as u64;
    (cycle * steps..(cycle + 1) * steps).flat_map(|step| s.batch(step)).collect()
}

#[test]
fn cyclic_visits_every_index_once_per_cycle() {
    // Batches that divide the length: each cycle is a permutation.
    for n in [1u64, 2, 3, 5, 7, 16, 17, 64, 1000, 65_537] {
        for seed in [0u64, 1, 42, u64::MAX] {
            for batch in [1u64, n] {
                let s = sampler(Mode::Cyclic, n, batch, seed);
                for c in [0u64, 1, 7] {
                    let mut all = cycle(&s, c);
                    all.sort_unstable();
                    let expected: Vec<u64> = (0..n).collect();
                    assert_eq!(all, expected, "n={n} seed={seed} batch={batch} cycle={c}");
                }
            }
        }
    }
}

#[test]
fn cyclic_full_cycle_of_a_million() {
    let n = 1_000_000u64;
    let s = sampler(Mode::Cyclic, n, 1000, 9);
    let mut seen = vec![false; n as usize];
    for index in cycle(&s, 0) {
        assert!(!seen[index as usize], "{index} twice");
        seen[index as usize] = true;
    }
    assert!(seen.iter().all(|&x| x));
}

#[test]
fn cyclic_with_remainder_drops_different_indices_each_cycle() {
    // 17 = 3 * 5 + 2: each cycle has 3 batches of 5 distinct indices and
    // leaves 2 indices out; which 2 changes from cycle to cycle.
    let s = sampler(Mode::Cyclic, 17, 5, 3);
    let mut dropped = HashSet::new();
    for c in 0..20 {
        let indices = cycle(&s, c);
        assert_eq!(indices.len(), 15);
        let distinct: HashSet<u64> = indices.iter().copied().collect();
        assert_eq!(distinct.len(), 15, "cycle {c} repeats an index");
        assert!(indices.iter().all(|&i| i < 17));
        let mut missing: Vec<u64> = (0..17).filter(|i| !distinct.contains(i)).collect();
        missing.sort_unstable();
        dropped.insert(missing);
    }
    assert!(dropped.len() > 5, "only {} different remainders", dropped.len());
}

#[test]
fn cyclic_batches_never_repeat_an_index() {
    for (n, batch) in [(1000u64, 300u64), (65_537, 8192), (10, 3), (5, 7)] {
        let s = sampler(Mode::Cyclic, n, batch, 11);
        for step in 0..50 {
            let b = s.batch(step);
            let distinct: HashSet<u64> = b.iter().copied().collect();
            assert_eq!(distinct.len(), b.len(), "n={n} batch={batch} step={step}");
        }
    }
}

#[test]
fn cyclic_batch_larger_than_length_is_one_whole_permutation() {
    let s = sampler(Mode::Cyclic, 7, 100, 5);
    assert_eq!(s.batch_len(), 7);
    let mut orders = HashSet::new();
    for step in 0..10 {
        let b = s.batch(step);
        let mut sorted = b.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..7).collect::<Vec<u64>>());
        orders.insert(b);
    }
    assert!(orders.len() > 1, "every step gave the same order");
}

#[test]
fn cyclic_cycles_and_seeds_give_different_permutations() {
    let s = sampler(Mode::Cyclic, 1000, 100, 1);
    let c0 = cycle(&s, 0);
    let c1 = cycle(&s, 1);
    assert_ne!(c0, c1);
    assert_ne!(c0, (0..1000).collect::<Vec<u64>>());
    let other_seed = cycle(&sampler(Mode::Cyclic, 1000, 100, 2), 0);
    assert_ne!(c0, other_seed);
    // A random permutation pair agrees on about one position.
    let agree = c0.iter().zip(&c1).filter(|(a, b)| a == b).count();
    assert!(agree < 20, "cycles agree on {agree} positions");
}

/// Pearson's chi-square statistic of `counts` against a uniform expectation.
fn chi_square(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts
        .iter()
        .map(|&c| {
            let d = c as f64 - expected;
            d * d / expected
        })
        .sum()
}

/// 40 000 values in 100 bins of 400: 99 degrees of freedom, whose 0.1%
/// critical value is 148.2.
const LENGTH: u64 = 40_000;
const BINS: usize = 100;
const CRITICAL_99_DF: f64 = 148.2;

fn binned(indices: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut counts = vec![0u64; BINS];
    for i in indices {
        counts[(i * BINS as u64 / LENGTH) as usize] += 1;
    }
    counts
}

#[test]
fn iid_is_uniform_by_chi_square() {
    let s = sampler(Mode::Iid, LENGTH, 1000, 2024);
    let counts = binned((0..400).flat_map(|step| s.batch(step)));
    let stat = chi_square(&counts);
    assert!(stat < CRITICAL_99_DF, "chi-square {stat}");

    // Per-index check on a tiny non-power-of-two range: 6 degrees of
    // freedom, 0.1% critical value 22.46.
    let s = sampler(Mode::Iid, 7, 7, 77);
    let mut counts = vec![0u64; 7];
    for step in 0..10_000 {
        for i in s.batch(step) {
            counts[i as usize] += 1;
        }
    }
    let stat = chi_square(&counts);
    assert!(stat < 22.46, "chi-square {stat} for {counts:?}");
}

#[test]
fn chi_square_threshold_catches_a_biased_generator() {
    // A 16-bit generator reduced by plain modulo into [0, 40000): values below
    // 65536 - 40000 come up twice as often. The test above must reject it.
    let counts = binned((0..400_000u64).map(|i| (mix64(i) as u16) as u64 % LENGTH));
    let stat = chi_square(&counts);
    assert!(stat > CRITICAL_99_DF, "biased generator passed: {stat}");
}

#[test]
fn iid_draws_with_replacement_and_depends_on_seed_and_step() {
    let s = sampler(Mode::Iid, 100, 100, 1);
    let b = s.batch(0);
    assert!(b.iter().all(|&i| i < 100));
    let distinct: HashSet<u64> = b.iter().copied().collect();
    // 100 draws from 100 values: about 63 distinct, never all 100 in practice.
    assert!(distinct.len() < 100 && distinct.len() > 40, "{}", distinct.len());
    assert_ne!(s.batch(0), s.batch(1));
    assert_ne!(s.batch(0), sampler(Mode::Iid, 100, 100, 2).batch(0));
    // Length 1: the only index.
    assert_eq!(sampler(Mode::Iid, 1, 3, 9).batch(5), vec![0]);
}

#[test]
fn iid_large_range_stays_in_range() {
    let n = (1u64 << 63) + 12_345;
    let s = sampler(Mode::Iid, n, 4096, 3);
    let b = s.batch(99);
    assert!(b.iter().all(|&i| i < n));
    // Roughly half the draws land in the upper half.
    let upper = b.iter().filter(|&&i| i >= n / 2).count();
    assert!((1800..2300).contains(&upper), "{upper}");
}

#[test]
fn sequential_wraps_circularly() {
    let s = sampler(Mode::Sequential, 10, 4, 0);
    assert_eq!(s.batch(0), vec![0, 1, 2, 3]);
    assert_eq!(s.batch(1), vec![4, 5, 6, 7]);
    assert_eq!(s.batch(2), vec![8, 9, 0, 1]);
    assert_eq!(s.batch(3), vec![2, 3, 4, 5]);
    assert_eq!(s.batch(5), vec![0, 1, 2, 3]);
    // Seed does not matter for sequential.
    assert_eq!(sampler(Mode::Sequential, 10, 4, 99).batch(2), vec![8, 9, 0, 1]);
    // A store smaller than one batch gives the whole store each step.
    let s = sampler(Mode::Sequential, 3, 5, 0);
    assert_eq!(s.batch_len(), 3);
    assert_eq!(s.batch(0), vec![0, 1, 2]);
    assert_eq!(s.batch(1), vec![0, 1, 2]);
    // Huge steps and lengths do not overflow.
    let s = sampler(Mode::Sequential, u64::MAX, 4, 0);
    let last = u64::MAX / 4; // batch starting at 4 * last = u64::MAX - 3
    assert_eq!(s.batch(last), vec![u64::MAX - 3, u64::MAX - 2, u64::MAX - 1, 0]);
    // A shard inside the wrapped region.
    let s = sampler(Mode::Sequential, 10, 4, 0);
    let mut out = [0u64; 2];
    s.fill_shard(2, Shard::new(1, 2).unwrap(), &mut out).unwrap();
    assert_eq!(out, [0, 1]);
}

#[test]
fn next_use_on_fixed_inputs() {
    // Sequential over 10 in batches of 4: [0..4), [4..8), [8, 9, 0, 1], ...
    let s = sampler(Mode::Sequential, 10, 4, 0);
    assert_eq!(s.next_use(0, 0), Some(2));
    assert_eq!(s.next_use(1, 2), Some(5), "batch 5 is [0, 1, 2, 3]");
    assert_eq!(s.next_use(9, 2), Some(4), "batch 4 is [6, 7, 8, 9]");
    assert_eq!(s.next_use(10, 0), None, "out of range");
    // A store smaller than a batch: every step holds every index.
    assert_eq!(sampler(Mode::Sequential, 3, 5, 0).next_use(2, 41), Some(42));
    assert_eq!(sampler(Mode::Cyclic, 3, 5, 0).next_use(2, 41), Some(42));
    // Iid knows nothing ahead.
    assert_eq!(sampler(Mode::Iid, 10, 4, 0).next_use(3, 0), None);

    // Cyclic: each index of step 5 comes again in a later cycle, at the
    // first batch that holds it.
    let s = sampler(Mode::Cyclic, 100, 10, 3);
    for &i in &s.batch(5) {
        let next = s.next_use(i, 5).unwrap();
        assert!(next >= 10, "{i} is read once in cycle 0");
        assert!(s.batch(next).contains(&i));
        assert!((6..next).all(|step| !s.batch(step).contains(&i)));
    }
}

#[test]
fn next_use_at_the_end_of_the_step_range() {
    // 1455 records in batches of 14: cycles of 103 steps, and the last
    // cycle is cut short by u64::MAX. Steps are never wrapped: an index
    // whose next place is past u64::MAX has no next use.
    let s = sampler(Mode::Cyclic, 1455, 14, 12_472_246_626_575_190_145);
    let after = u64::MAX - 83;
    let mut found = 0;
    for i in 0..1455 {
        let scanned = (after + 1..=u64::MAX).find(|&step| s.batch(step).contains(&i));
        assert_eq!(s.next_use(i, after), scanned, "index {i}");
        found += usize::from(scanned.is_some());
    }
    // 83 steps of 14 indices leave some of the 1455 out.
    assert!(found > 0 && found < 1455, "{found}");
    for mode in MODES {
        assert_eq!(sampler(mode, 10, 4, 0).next_use(3, u64::MAX), None);
    }
    // Batch u64::MAX is [0, 1, 2, 3]: 4 * (2^64 - 1) mod 10 == 0.
    let s = sampler(Mode::Sequential, 10, 4, 0);
    assert_eq!(s.batch(u64::MAX), vec![0, 1, 2, 3]);
    assert_eq!(s.next_use(2, u64::MAX - 1), Some(u64::MAX));
    assert_eq!(s.next_use(8, u64::MAX - 1), None);
}

#[test]
fn shards_are_disjoint_and_union_to_the_batch() {
    for mode in MODES {
        let s = sampler(mode, 1000, 24, 5);
        for step in [0u64, 1, 41, 1_000_000] {
            let global = s.batch(step);
            for count in [1u32, 2, 3, 4, 8] {
                let mut joined = Vec::new();
                for index in 0..count {
                    let shard = Shard::new(index, count).unwrap();
                    let mut part = vec![0; s.shard_len(shard).unwrap()];
                    s.fill_shard(step, shard, &mut part).unwrap();
                    joined.extend(part);
                }
                assert_eq!(joined, global, "{mode:?} step={step} count={count}");
            }
            if mode == Mode::Cyclic {
                let distinct: HashSet<u64> = global.iter().copied().collect();
                assert_eq!(distinct.len(), global.len());
            }
        }
    }
}

#[test]
fn elastic_resume_four_shards_equal_two() {
    for mode in MODES {
        let four = sampler(mode, 777, 64, 8);
        let two = Sampler::from_state(&four.state()).unwrap();
        for step in [0u64, 12, 13, 5000] {
            let gather = |s: &Sampler, count: u32| -> Vec<u64> {
                (0..count)
                    .flat_map(|index| {
                        let shard = Shard::new(index, count).unwrap();
                        let mut part = vec![0; s.shard_len(shard).unwrap()];
                        s.fill_shard(step, shard, &mut part).unwrap();
                        part
                    })
                    .collect()
            };
            assert_eq!(gather(&four, 4), gather(&two, 2), "{mode:?} step={step}");
        }
    }
}

#[test]
fn state_round_trips_through_json() {
    for mode in MODES {
        let mut s = sampler(mode, 12_345, 100, u64::MAX - 1);
        s.seek(987_654_321);
        let json = serde_json::to_string(&s.state()).unwrap();
        let state: SamplerState = serde_json::from_str(&json).unwrap();
        assert_eq!(state, s.state());
        let mut resumed = Sampler::from_state(&state).unwrap();
        for _ in 0..3 {
            assert_eq!(resumed.next_batch(), s.next_batch());
        }
        assert_eq!(resumed.step(), 987_654_324);
    }
}

#[test]
fn next_batch_advances_and_wraps_at_the_last_step() {
    let mut s = sampler(Mode::Cyclic, 50, 10, 1);
    assert_eq!(s.step(), 0);
    let b0 = s.next_batch();
    assert_eq!(b0, s.batch(0));
    assert_eq!(s.step(), 1);
    s.seek(u64::MAX);
    assert_eq!(s.next_batch(), s.batch(u64::MAX));
    assert_eq!(s.step(), 0);
}

#[test]
fn errors_carry_their_numbers() {
    for mode in MODES {
        assert_eq!(Sampler::new(mode, 0, 4, 0).unwrap_err(), Error::EmptyIndexSpace);
        assert_eq!(Sampler::new(mode, 10, 0, 0).unwrap_err(), Error::ZeroBatch);
        let s = sampler(mode, 10, 4, 0);
        assert_eq!(s.fill(0, &mut [0; 3]), Err(Error::BufferLength { expected: 4, got: 3 }));
        assert_eq!(s.shard_len(Shard { index: 2, count: 2 }), Err(Error::BadShard { index: 2, count: 2 }));
        assert_eq!(s.fill_shard(0, Shard { index: 0, count: 0 }, &mut []), Err(Error::BadShard { index: 0, count: 0 }));
        assert_eq!(s.shard_len(Shard::new(0, 3).unwrap()), Err(Error::ShardDoesNotDivide { batch: 4, count: 3 }));
        assert_eq!(
            s.fill_shard(0, Shard::new(1, 2).unwrap(), &mut [0; 4]),
            Err(Error::BufferLength { expected: 2, got: 4 })
        );
    }
    assert_eq!(Mode::from_u8(4), Err(Error::BadMode(4)));
    assert_eq!(Mode::from_u8(2), Ok(Mode::Cyclic));
    assert_eq!(Mode::from_u8(Mode::Iid as u8), Ok(Mode::Iid));
    let too_big = MAX_BATCH + 1;
    assert_eq!(
        Sampler::new(Mode::Iid, u64::MAX, too_big, 0).unwrap_err(),
        Error::BatchTooLarge { batch: too_big, max: MAX_BATCH }
    );
    // A huge batch size over a small store is fine: the batch is the store.
    assert_eq!(sampler(Mode::Iid, 10, u64::MAX, 0).batch_len(), 10);
    // A state no sampler could have produced is refused.
    let bad = SamplerState { mode: Mode::Cyclic, seed: 0, step: 0, length: 0, batch_size: 1, origin: 0, blocks: None };
    assert_eq!(Sampler::from_state(&bad).unwrap_err(), Error::EmptyIndexSpace);
    // Messages name the numbers.
    let msg = Error::ShardDoesNotDivide { batch: 10, count: 3 }.to_string();
    assert!(msg.contains("10") && msg.contains('3'), "{msg}");
}

#[test]
fn sampler_is_send_sync_clone() {
    fn assert_traits<T: Send + Sync + Clone>() {}
    assert_traits::<Sampler>();
}

/// A run resumed over a store that grew keeps the cycle under way and
/// starts a new one over all the records at the boundary: the boundary is
/// the next cycle start, and from it the grown sampler draws whole cycles
/// of the new length, keyed apart from the cycles before.
#[test]
fn a_grown_sampler_starts_whole_cycles_at_the_boundary() {
    // 100 records in batches of 8: cyclic cycles of 12 steps.
    let before = sampler(Mode::Cyclic, 100, 8, 5);
    assert_eq!(before.cycle_boundary(0), 0, "a cycle start is its own boundary");
    assert_eq!(before.cycle_boundary(13), 24);
    assert_eq!(before.cycle_boundary(24), 24);
    let grown = before.grown(130, 24).unwrap();
    assert_eq!(grown.state().origin, 24);
    // 130 / 8 = 16 steps per cycle from step 24 on.
    assert_eq!(grown.cycle_boundary(25), 40);
    for c in 0..3u64 {
        let mut all: Vec<u64> = (24 + c * 16..24 + (c + 1) * 16).flat_map(|t| grown.batch(t)).collect();
        assert_eq!(all.len(), 128);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 128, "cycle {c} repeats an index");
        assert!(all.iter().all(|&i| i < 130));
    }
    // The first cycle over 130 records is not the first cycle over 100 in
    // another cut: its permutation has a key of its own.
    let fresh = sampler(Mode::Cyclic, 130, 8, 5);
    assert_ne!(grown.batch(24), fresh.batch(0));
    // Sequential: 100 records in batches of 8 = passes of 12.5 steps; the
    // pass that starts inside step 12 ends inside step 25, so the walk
    // over the new length starts at step 26, from record 0.
    let seq = sampler(Mode::Sequential, 100, 8, 0);
    assert_eq!(seq.cycle_boundary(3), 13);
    assert_eq!(seq.cycle_boundary(13), 25);
    assert_eq!(seq.cycle_boundary(0), 0);
    let seq_grown = seq.grown(130, 13).unwrap();
    assert_eq!(seq_grown.batch(13), (0..8).collect::<Vec<u64>>());
    assert_eq!(seq_grown.batch(29), (128..130).chain(0..6).collect::<Vec<u64>>());
    // Iid: epochs of length / B steps; the draws stay keyed by the step.
    let iid = sampler(Mode::Iid, 100, 8, 1);
    assert_eq!(iid.cycle_boundary(1), 12);
    let iid_grown = iid.grown(1 << 40, 12).unwrap();
    assert!(iid_grown.batch(12).iter().any(|&i| i >= 100), "new records are drawn");
}

/// Next-use answers of a grown sampler agree with scanning its batches
/// from the origin on.
#[test]
fn next_use_of_a_grown_sampler_matches_its_batches() {
    for mode in [Mode::Sequential, Mode::Cyclic] {
        let s = sampler(mode, 37, 5, 11).grown(53, 40).unwrap();
        for after in [40u64, 45, 51] {
            for index in [0u64, 17, 52] {
                let scanned = (after + 1..after + 200).find(|&t| s.batch(t).contains(&index));
                assert_eq!(s.next_use(index, after), scanned, "{mode:?} index {index} after {after}");
            }
        }
    }
}

#[test]
fn the_origin_round_trips_and_is_absent_when_zero() {
    let s = sampler(Mode::Cyclic, 100, 8, 5);
    let json = serde_json::to_string(&s.state()).unwrap();
    assert!(!json.contains("origin"), "{json}");
    let grown = s.grown(120, 24).unwrap();
    let json = serde_json::to_string(&grown.state()).unwrap();
    let back = Sampler::from_state(&serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back.batch(30), grown.batch(30));
    assert_eq!(back.state(), grown.state());
}

#[test]
fn fill_slots_is_a_part_of_fill() {
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
        let s = Sampler::new(mode, 1000, 100, 7).unwrap();
        let whole = s.batch(13);
        let mut part = vec![0; 30];
        s.fill_slots(13, 55, &mut part).unwrap();
        assert_eq!(part, whole[55..85], "{mode:?}");
        assert!(matches!(s.fill_slots(13, 80, &mut part), Err(Error::BufferLength { .. })));
    }
}
