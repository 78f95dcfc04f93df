//! Mode 3 (blocked) on fixed inputs: cycles without repeats, windows that
//! hold their batches, exact resume and shards, next use by inversion.

use crate::{Blocks, Error, Mode, Sampler, SamplerState, Shard};

fn blocked(length: u64, batch: u64, seed: u64, b: u64, w: u64) -> Sampler {
    let shape = Blocks { block_records: b, window_blocks: w };
    Sampler::with_blocks(Mode::Blocked, length, batch, seed, Some(shape)).expect("valid sampler")
}

/// The shapes tested: dividing and not, blocks and windows of one, shapes
/// larger than the index space.
const SHAPES: [(u64, u64); 7] = [(1, 1), (1, 16), (5, 3), (8, 4), (13, 7), (64, 2), (10_000, 9)];

#[test]
fn each_cycle_visits_every_index_exactly_once() {
    for n in [1u64, 2, 40, 97, 1000, 4096] {
        for (b, w) in SHAPES {
            for batch in [1u64, 4, 8] {
                if n % batch != 0 {
                    continue;
                }
                let s = blocked(n, batch, 7, b, w);
                let steps = n / batch;
                for c in [0u64, 1, 5] {
                    let mut all: Vec<u64> = (c * steps..(c + 1) * steps).flat_map(|k| s.batch(k)).collect();
                    all.sort_unstable();
                    assert_eq!(all, (0..n).collect::<Vec<_>>(), "n={n} b={b} w={w} batch={batch} cycle={c}");
                }
            }
        }
    }
}

#[test]
fn a_remainder_drops_positions_and_never_repeats() {
    // 1000 = 7 * 142 + 6: each cycle draws 994 distinct indices.
    let s = blocked(1000, 7, 3, 13, 5);
    let mut dropped = Vec::new();
    for c in 0..3u64 {
        let mut all: Vec<u64> = (c * 142..(c + 1) * 142).flat_map(|k| s.batch(k)).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 994, "cycle {c}");
        dropped.push((0..1000).filter(|i| all.binary_search(i).is_err()).collect::<Vec<u64>>());
    }
    assert_ne!(dropped[0], dropped[1], "the dropped indices change with the cycle");
}

#[test]
fn a_batch_draws_from_its_window_blocks_only() {
    let s = blocked(10_000, 64, 11, 16, 8);
    for step in [0u64, 1, 17, 155, 156, 300] {
        let window = s.window(step).expect("mode 3 has windows");
        assert!(window.steps.contains(&step), "step {step} in {window:?}");
        if step + 1 < window.complete {
            for i in s.batch(step) {
                assert!(window.records.iter().any(|r| r.contains(&i)), "step {step}: {i} outside its window");
            }
        }
        let held: u64 = window.records.iter().map(|r| r.end - r.start).sum();
        assert!(held <= 16 * 8);
    }
    // Walking the windows covers every step of a cycle, in order.
    let mut window = s.window(0).unwrap();
    let mut covered = 0;
    while window.steps.start < 156 {
        assert!(window.steps.start <= covered, "a gap before {window:?}");
        covered = covered.max(window.complete);
        window = s.next_window(&window).unwrap();
    }
    assert_eq!(covered, 156, "the last window of cycle 0 completes it");
    assert_eq!(window.steps.start, 156, "then cycle 1 begins");
    assert_eq!(s.window(156), Some(window));
}

#[test]
fn windows_keep_batches_local() {
    // 100 blocks of 100 records: a batch of 50 touches at most its window's
    // 4 blocks (8 at a window's end), where cyclic mode touches ~40.
    let s = blocked(10_000, 50, 1, 100, 4);
    for step in 0..200u64 {
        let mut blocks: Vec<u64> = s.batch(step).iter().map(|i| i / 100).collect();
        blocks.sort_unstable();
        blocks.dedup();
        assert!(blocks.len() <= 8, "step {step}: {} blocks", blocks.len());
    }
}

#[test]
fn resume_and_shards_are_exact() {
    let s = blocked(5000, 32, 9, 10, 6);
    let json = serde_json::to_string(&SamplerState { step: 421, ..s.state() }).unwrap();
    assert!(json.contains("\"block_records\":10") && json.contains("\"window_blocks\":6"), "{json}");
    let mut resumed = Sampler::from_state(&serde_json::from_str(&json).unwrap()).unwrap();
    for step in 421..700 {
        let whole = s.batch(step);
        assert_eq!(resumed.next_batch(), whole, "step {step}");
        let mut halves = Vec::new();
        for index in 0..2 {
            let shard = Shard::new(index, 2).unwrap();
            let mut part = vec![0; s.shard_len(shard).unwrap()];
            s.fill_shard(step, shard, &mut part).unwrap();
            halves.extend(part);
        }
        assert_eq!(halves, whole, "two shards of step {step}");
    }
    // Another shape draws other batches: the shape is part of the stream.
    assert_ne!(blocked(5000, 32, 9, 11, 6).batch(3), s.batch(3));
}

#[test]
fn next_use_inverts_the_order() {
    let s = blocked(600, 8, 5, 7, 3);
    for after in [0u64, 10, 74, 75, 200] {
        for index in [0u64, 1, 6, 7, 300, 599] {
            let scanned = (after + 1..after + 1 + 4 * 75).find(|&k| s.batch(k).contains(&index));
            assert_eq!(s.next_use(index, after), scanned, "index {index} after {after}");
        }
    }
    let step = 33;
    let shard = Shard::new(1, 2).unwrap();
    let mut idx = vec![0; 4];
    let mut next = vec![None; 4];
    s.fill_shard_with_next_use(step, shard, &mut idx, &mut next).unwrap();
    for (&i, &n) in idx.iter().zip(&next) {
        let scanned = (step + 1..step + 1 + 64 * 75).find(|&k| s.batch(k)[4..].contains(&i));
        assert_eq!(n, scanned, "index {i}");
    }
}

#[test]
fn a_zero_shape_is_an_error_and_other_modes_have_no_windows() {
    let zero = Blocks { block_records: 0, window_blocks: 4 };
    let e = Sampler::with_blocks(Mode::Blocked, 10, 2, 0, Some(zero)).unwrap_err();
    assert_eq!(e, Error::ZeroBlocks { what: "block_records" });
    assert!(e.to_string().contains("block_records is 0"), "{e}");
    assert_eq!(Mode::from_u8(3), Ok(Mode::Blocked));
    let cyclic = Sampler::new(Mode::Cyclic, 10, 2, 0).unwrap();
    assert_eq!(cyclic.window(0), None);
    assert_eq!(cyclic.state().blocks, None);
    assert_eq!(Sampler::new(Mode::Blocked, 10, 2, 0).unwrap().blocks(), Some(Blocks::DEFAULT));
}

#[test]
fn a_mixture_in_mode_3_reads_each_source_once_per_cycle() {
    // Half of each batch of 24 from each source: 12 rows of source 0 per
    // step, so 10 steps are one cycle of its 120 records.
    let m = crate::Mixture::new(Mode::Blocked, &[120, 37], &[0.5, 0.5], 24, 3).unwrap();
    let mut rows = Vec::new();
    for step in 0..10 {
        let mut sources = vec![0u32; 24];
        let mut indices = vec![0u64; 24];
        m.fill_shard(step, Shard::ALL, &mut sources, &mut indices).unwrap();
        rows.extend(sources.iter().zip(&indices).filter(|(s, _)| **s == 0).map(|(_, &i)| i));
    }
    assert_eq!(rows.len(), 120);
    rows.sort_unstable();
    assert_eq!(rows, (0..120).collect::<Vec<u64>>());
}
