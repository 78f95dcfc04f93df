//! The span tests' records: six of 100,000 bytes that no other record's
//! bytes repeat, and reading spans of them into a fresh buffer.

use zring_engine::{Codec, Error, Span, Spans, Store};

pub const RECORD: usize = 100_000;

pub fn record(i: u64) -> Vec<u8> {
    // splitmix64 of (record, position): no record repeats another's bytes.
    let mix = |x: u64| {
        let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    // Runs of 16 equal bytes, so that zstd has something to compress.
    (0..RECORD as u64).map(|j| mix((i << 32) | (j / 16)) as u8).collect()
}

/// A store of records 0..6 in `dir`, written and opened again.
pub fn store(dir: &std::path::Path, codec: Codec) -> Store {
    let store = Store::builder(dir).codec(codec).create().unwrap();
    let records: Vec<Vec<u8>> = (0..6).map(record).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
    drop(store);
    Store::open(dir).unwrap()
}

/// `spans` read into a buffer of 0xAB bytes just long enough.
pub fn read(store: &std::sync::Arc<Store>, spans: &[Span]) -> Result<Vec<u8>, Error> {
    let size = spans.iter().map(|p| p.at + p.len).max().unwrap_or(0);
    let mut dst = vec![0xAB; size as usize];
    store.view().read_spans(&Spans::new(spans), &mut dst)?;
    Ok(dst)
}

/// Flips a byte in the middle of record `i` in `dir`'s first chunk file.
pub fn damage(dir: &std::path::Path, i: u64) {
    let chunk = dir.join("chunk-000000.zr");
    let mut bytes = std::fs::read(&chunk).unwrap();
    let r = record(i);
    let at = bytes.windows(64).position(|w| w == &r[..64]).expect("the record in the chunk") + 50_000;
    bytes[at] ^= 0xFF;
    std::fs::write(&chunk, &bytes).unwrap();
}
