//! Measures the `zstd_dict` codec's ratio, write speed and read speed per zstd
//! level and dictionary size on generated 12 KiB image tiles, to choose
//! `DEFAULT_DICT_LEVEL` and the Python layer's default dictionary size.
//!
//! `cargo run --release -p zring-benches --example dict_levels`

use std::time::Instant;

use zring_engine::{Codec, Store};

const RECORDS: usize = 4000;
const LEVELS: [i32; 8] = [1, 3, 5, 7, 9, 12, 15, 19];
const DICT_KIB: [usize; 4] = [16, 64, 256, 1024];

fn tile(i: usize, seed: &mut u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 * 64 * 64);
    for c in 0..3usize {
        for y in 0..64usize {
            for x in 0..64usize {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let base = (x * (1 + i % 3) + y * (1 + i % 5) + i + c * 40) % 256;
                out.push((base + (*seed % 6) as usize) as u8);
            }
        }
    }
    out
}

fn main() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let recs: Vec<Vec<u8>> = (0..RECORDS).map(|i| tile(i, &mut seed)).collect();
    let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
    let logical: usize = recs.iter().map(|r| r.len()).sum();
    println!("| dict KiB | level | ratio | write MiB/s | gather MiB/s |");
    println!("|---|---|---|---|---|");
    let plain = tempfile::tempdir_in(".").unwrap();
    let p = Store::builder(plain.path()).create().unwrap();
    p.append(&refs, Some(Codec::Zstd)).unwrap();
    println!("| plain zstd 3 | - | {:.2}x | - | - |", logical as f64 / p.stats().unwrap().live_bytes as f64);
    let runs: Vec<(usize, i32)> =
        LEVELS.iter().map(|&l| (112usize, l)).chain(DICT_KIB.iter().map(|&k| (k, 7))).collect();
    for (kib, level) in runs {
        let dir = tempfile::tempdir_in(".").unwrap();
        let store = Store::builder(dir.path()).dict_level(level).create().unwrap();
        store.train_dict(&refs[..1000], kib << 10).unwrap();
        let t = Instant::now();
        store.append(&refs, Some(Codec::ZstdDict)).unwrap();
        store.sync().unwrap();
        let secs = t.elapsed().as_secs_f64();
        let stats = store.stats().unwrap();
        let idx: Vec<u64> = (0..RECORDS as u64).map(|i| (i * 7919) % RECORDS as u64).collect();
        let mut dst = vec![0u8; RECORDS * 12288];
        let t = Instant::now();
        for _ in 0..5 {
            store.gather(&zring_engine::Gather::fixed(&idx, 12288), &mut dst).unwrap();
        }
        let read = 5.0 * logical as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
        println!(
            "| {kib} | {level} | {:.2}x | {:.0} | {read:.0} |",
            logical as f64 / stats.live_bytes as f64,
            logical as f64 / (1 << 20) as f64 / secs
        );
    }
}
