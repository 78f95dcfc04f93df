//! A quick in-process probe of hot gather throughput per codec, for profiling
//! (`perf record`) the read path without a benchmark harness around it.
//!
//! `cargo run --release -p zring-benches --example gather_probe -- DIR [raw|zstd|zstd_dict] [rounds]`

use std::time::Instant;

use zring_engine::{Codec, Store};

const RECORDS: u64 = 20_000;
const LEN: usize = 12 << 10;
const BATCH: usize = 256;

fn tile(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..LEN)
        .map(|k| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (((k % 64) as u64 * (1 + i % 3) + (k / 64) as u64 + (x & 3)) % 256) as u8
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]).join(&args[2]);
    let codec = Codec::from_name(&args[2]).unwrap();
    let rounds: usize = args.get(3).map_or(2000, |r| r.parse().unwrap());
    if !dir.exists() {
        let s = Store::builder(&dir).codec(codec).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..RECORDS).map(tile).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        if codec == Codec::ZstdDict {
            s.train_dict(&refs[..2000], 112 << 10).unwrap();
        }
        s.append(&refs, None).unwrap();
        s.sync().unwrap();
    }
    let s = Store::open(&dir).unwrap();
    let st = s.stats().unwrap();
    eprintln!(
        "{} records, ratio {:.2}x, backend {}",
        st.records,
        st.logical_bytes as f64 / st.live_bytes as f64,
        st.backend
    );
    let mut dst = vec![0u8; BATCH * LEN];
    let mut x = 12345u64;
    let batches: Vec<Vec<u64>> = (0..64)
        .map(|_| {
            (0..BATCH)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % RECORDS
                })
                .collect()
        })
        .collect();
    let t = Instant::now();
    for r in 0..rounds {
        s.gather(&zring_engine::Gather::fixed(&batches[r % batches.len()], LEN), &mut dst).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{} {:.0} MiB/s {:.3} ms/batch",
        args[2],
        (rounds * BATCH * LEN) as f64 / secs / (1 << 20) as f64,
        secs * 1e3 / rounds as f64
    );
}
