//! The cyclic sampler is a permutation: over one cycle, the batches hold
//! distinct indices in `[0, n)`, all of them when the batch size divides `n`;
//! the batch of a step is a pure function of its inputs; shards concatenate to
//! the global batch. Small `n` from the input, so each check is exhaustive.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zring_sampler::{Mode, Sampler, Shard};

#[derive(Debug, Arbitrary)]
struct Input {
    n: u16,
    batch: u16,
    seed: u64,
    cycle: u16,
    shards: u8,
}

fuzz_target!(|input: Input| {
    let n = u64::from(input.n % 2048) + 1;
    let b = u64::from(input.batch) % n + 1;
    let s = Sampler::new(Mode::Cyclic, n, b, input.seed).expect("valid sampler");
    let per_cycle = n / b;
    let first = u64::from(input.cycle) * per_cycle;
    let mut seen = vec![false; n as usize];
    for step in first..first + per_cycle {
        let batch = s.batch(step);
        assert_eq!(batch.len() as u64, b);
        assert_eq!(batch, s.batch(step), "step {step} is not deterministic");
        for &i in &batch {
            assert!(i < n, "index {i} out of [0, {n})");
            assert!(!std::mem::replace(&mut seen[i as usize], true), "index {i} twice in one cycle (n {n}, batch {b})");
        }
        let count = u32::from(input.shards % 4) + 1;
        if b.is_multiple_of(u64::from(count)) {
            let mut joined = Vec::with_capacity(batch.len());
            for k in 0..count {
                let shard = Shard::new(k, count).expect("shard");
                let mut part = vec![0u64; s.shard_len(shard).expect("shard len")];
                s.fill_shard(step, shard, &mut part).expect("fill shard");
                joined.extend(part);
            }
            assert_eq!(joined, batch, "shards do not concatenate to the batch");
        }
    }
    let covered = seen.iter().filter(|&&x| x).count() as u64;
    assert_eq!(covered, per_cycle * b);
    if n.is_multiple_of(b) {
        assert_eq!(covered, n, "a cycle missed indices although {b} divides {n}");
    }
});
