//! Mode 3 (blocked) on fixed inputs: cycles without repeats, windows that
//! hold their batches, exact resume and shards, next use by inversion.

use crate::{Blocks, Error, Mode, Sampler, SamplerState, Shard};

fn blocked(length: u64, batch: u64, seed: u64, b: u64, w: u64) -> Sampler {
    let shape = Blocks { block_records: b, window_blocks: w, shards: 1 };
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
    let zero = Blocks { block_records: 0, window_blocks: 4, shards: 1 };
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

fn split(length: u64, batch: u64, seed: u64, b: u64, w: u64, shards: u32) -> Sampler {
    let shape = Blocks { block_records: b, window_blocks: w, shards };
    Sampler::with_blocks(Mode::Blocked, length, batch, seed, Some(shape)).expect("valid sampler")
}

fn shard_rows(s: &Sampler, step: u64, shard: Shard) -> Vec<u64> {
    let mut v = vec![0; s.shard_len(shard).unwrap()];
    s.fill_shard(step, shard, &mut v).unwrap();
    v
}

/// A cycle split between shards: together the shards draw every index at
/// most once per cycle, all but `n mod B` of them; and each shard's windows,
/// walked from its first step, hold every row it draws, so that a reader of
/// one shard loads only its own records (each record in one shard's windows
/// of the cycle).
#[test]
fn split_cycles_cover_every_index_once_and_each_shard_reads_its_own_windows() {
    for (n, batch, shards) in [(1000u64, 8u64, 2u32), (1000, 24, 4), (4096, 64, 8), (997, 12, 3), (40, 8, 8)] {
        for (b, w) in SHAPES {
            let s = split(n, batch, 5, b, w, shards);
            let steps = n / batch;
            for c in [0u64, 3] {
                let cycle = c * steps..(c + 1) * steps;
                let mut all: Vec<u64> = cycle.clone().flat_map(|k| s.batch(k)).collect();
                all.sort_unstable();
                let drawn = all.len();
                all.dedup();
                assert_eq!(all.len(), drawn, "n={n} b={b} w={w} shards={shards}: an index twice in cycle {c}");
                assert_eq!(drawn as u64, steps * batch);
                let mut held = Vec::new();
                for k in 0..shards {
                    let shard = Shard::new(k, shards).unwrap();
                    let mut window = s.shard_window(cycle.start, shard).expect("a window");
                    assert_eq!(window.steps.start, cycle.start);
                    let mut loaded: Vec<std::ops::Range<u64>> = Vec::new();
                    loop {
                        loaded.extend(window.records.iter().cloned());
                        held.extend(window.records.iter().flat_map(Clone::clone));
                        // Every step before `complete` draws from the
                        // windows loaded so far.
                        let upto = window.complete.min(cycle.end);
                        for step in window.steps.start..upto {
                            for i in shard_rows(&s, step, shard) {
                                assert!(
                                    loaded.iter().any(|r| r.contains(&i)),
                                    "n={n} b={b} w={w} shard {k}/{shards} step {step}: {i} not loaded"
                                );
                            }
                        }
                        let next = s.next_window(&window).unwrap();
                        if next.steps.start >= cycle.end {
                            assert_eq!(window.complete, cycle.end, "the last window completes the cycle");
                            assert_eq!(next, s.shard_window(cycle.end, shard).unwrap(), "then the next cycle");
                            break;
                        }
                        assert!(next.steps.start <= window.complete, "a gap after {window:?}");
                        window = next;
                    }
                }
                // No record is in two shards' windows (nor twice in one's),
                // and every drawn one is in some (the windows holding only
                // left-out positions are skipped).
                held.sort_unstable();
                let loaded = held.len();
                held.dedup();
                assert_eq!(held.len(), loaded, "n={n} b={b} w={w} shards={shards}: a record loaded twice");
                assert!(all.iter().all(|i| held.binary_search(i).is_ok()), "n={n} b={b} w={w} shards={shards}");
            }
        }
    }
}

#[test]
fn split_cycles_resume_and_invert_exactly() {
    let s = split(5000, 32, 9, 10, 6, 4);
    let json = serde_json::to_string(&SamplerState { step: 421, ..s.state() }).unwrap();
    assert!(json.contains("\"shards\":4"), "{json}");
    let mut resumed = Sampler::from_state(&serde_json::from_str(&json).unwrap()).unwrap();
    for step in 421..500 {
        assert_eq!(resumed.next_batch(), s.batch(step), "step {step}");
    }
    // An unsplit shape saves no shards field, and a state without one is
    // unsplit (states saved before the field existed).
    let unsplit = serde_json::to_string(&blocked(5000, 32, 9, 10, 6).state()).unwrap();
    assert!(!unsplit.contains("shards"), "{unsplit}");
    let old: Blocks = serde_json::from_str(r#"{"block_records":10,"window_blocks":6}"#).unwrap();
    assert_eq!(old.shards, 1);
    // Split cycles draw other batches than the unsplit ones.
    assert_ne!(s.batch(3), blocked(5000, 32, 9, 10, 6).batch(3));
    // Next use is that of the split order, per shard.
    let s = split(600, 8, 5, 7, 3, 2);
    for after in [0u64, 10, 74, 75, 200] {
        for index in [0u64, 1, 6, 7, 300, 599] {
            let scanned = (after + 1..after + 1 + 4 * 75).find(|&k| s.batch(k).contains(&index));
            assert_eq!(s.next_use(index, after), scanned, "index {index} after {after}");
        }
    }
    let shard = Shard::new(1, 2).unwrap();
    let mut idx = vec![0; 4];
    let mut next = vec![None; 4];
    s.fill_shard_with_next_use(33, shard, &mut idx, &mut next).unwrap();
    for (&i, &n) in idx.iter().zip(&next) {
        let scanned = (34..34 + 64 * 75).find(|&k| s.batch(k)[4..].contains(&i));
        assert_eq!(n, scanned, "index {i}");
    }
}

#[test]
fn split_shapes_are_checked_and_windows_are_per_shard() {
    let e = Sampler::with_blocks(Mode::Blocked, 100, 8, 0, Some(Blocks { shards: 0, ..Blocks::DEFAULT })).unwrap_err();
    assert_eq!(e, Error::ZeroBlocks { what: "shards" });
    let e = Sampler::with_blocks(Mode::Blocked, 100, 8, 0, Some(Blocks { shards: 3, ..Blocks::DEFAULT })).unwrap_err();
    assert_eq!(e, Error::ShardDoesNotDivide { batch: 8, count: 3 });
    let s = split(1000, 8, 1, 10, 4, 4);
    assert_eq!(s.window(0), None, "no window of the whole batch");
    assert_eq!(s.shard_window(0, Shard::new(0, 2).unwrap()), None, "another shard count");
    assert!(s.shard_window(0, Shard::new(3, 4).unwrap()).is_some());
    let unsplit = blocked(1000, 8, 1, 10, 4);
    assert_eq!(unsplit.shard_window(7, Shard::new(1, 4).unwrap()), unsplit.window(7));
}

/// A mixture in mode 3: each source's windows, walked from a step, hold
/// every row of that source up to their `complete` step, and the steps
/// named for a window's records are those that draw them.
#[test]
fn a_mixtures_source_windows_hold_its_rows_and_know_their_steps() {
    let lengths = [40_000u64, 35_003, 20_000];
    let plain = crate::Mixture::new(Mode::Blocked, &lengths, &[0.5, 0.3, 0.2], 64, 3).unwrap();
    // Windows sized by weight, as a loader chooses them.
    let shapes: Vec<Blocks> = [(50, 40), (64, 24), (7, 200)]
        .iter()
        .map(|&(b, w)| Blocks { block_records: b, window_blocks: w, shards: 1 })
        .collect();
    let shaped = plain.clone().with_blocks(&shapes).unwrap();
    assert_eq!(shaped.state().blocks.as_deref(), Some(&shapes[..]));
    assert_eq!(plain.state().blocks, None);
    let json = serde_json::to_string(&plain.state()).unwrap();
    assert!(!json.contains("blocks"), "{json}");
    let saved: crate::MixtureState = serde_json::from_str(&serde_json::to_string(&shaped.state()).unwrap()).unwrap();
    assert_eq!(saved.blocks.as_deref(), Some(&shapes[..]));
    assert!(saved.matches(&plain.state()), "the shapes are taken from the state, not compared");
    let rows = |m: &crate::Mixture| {
        let (mut sources, mut indices) = (vec![0u32; 64], vec![0u64; 64]);
        m.fill_shard(5, Shard::ALL, &mut sources, &mut indices).unwrap();
        indices
    };
    assert_ne!(rows(&shaped), rows(&plain), "the shapes are part of the batches");
    assert!(plain.clone().with_blocks(&shapes[..2]).is_err());
    for m in [plain, shaped] {
        let steps = 1700u64;
        // (source, index) -> the steps that draw it.
        let mut drawn: std::collections::HashMap<(u32, u64), Vec<u64>> = std::collections::HashMap::new();
        let mut rows = Vec::new();
        for step in 0..steps {
            let mut sources = vec![0u32; 64];
            let mut indices = vec![0u64; 64];
            m.fill_shard(step, Shard::ALL, &mut sources, &mut indices).unwrap();
            for (&k, &i) in sources.iter().zip(&indices) {
                drawn.entry((k, i)).or_default().push(step);
            }
            rows.push((sources, indices));
        }
        for start in [0u64, 377] {
            for k in 0..3usize {
                let mut window = m.source_window(k, start).expect("mode 3 has windows");
                assert!(window.steps.contains(&start) || window.steps.start == start, "{window:?}");
                let mut loaded: Vec<std::ops::Range<u64>> = Vec::new();
                let mut walked = 0;
                while window.steps.start < steps {
                    loaded.extend(window.records.iter().cloned());
                    for step in window.steps.start.max(start)..window.complete.min(steps) {
                        let (sources, indices) = &rows[step as usize];
                        for (&s, &i) in sources.iter().zip(indices) {
                            if s as usize == k {
                                assert!(
                                    loaded.iter().any(|r| r.contains(&i)),
                                    "source {k} step {step}: {i} not loaded"
                                );
                            }
                        }
                    }
                    let held: Vec<u64> = window.records.iter().flat_map(Clone::clone).collect();
                    let mut at = vec![None; held.len()];
                    m.fill_window_steps(&window, &held, &mut at).unwrap();
                    for (&i, &t) in held.iter().zip(&at) {
                        let t = t.expect("every record of a window is drawn from it");
                        assert!(window.steps.contains(&t), "{t} outside {window:?}");
                        if t < steps {
                            assert!(drawn[&(k as u32, i)].contains(&t), "source {k}: {i} not drawn at {t}");
                        }
                    }
                    let next = m.next_source_window(&window).unwrap();
                    assert!(next.steps.start <= window.complete, "a gap after {window:?}");
                    assert!(next.complete >= window.complete);
                    window = next;
                    walked += 1;
                }
                assert!(walked >= 2, "source {k}: {walked} windows");
            }
        }
    }
    // Other modes have none.
    let cyclic = crate::Mixture::new(Mode::Cyclic, &lengths, &[0.5, 0.3, 0.2], 64, 3).unwrap();
    assert_eq!(cyclic.source_window(0, 0), None);
}
