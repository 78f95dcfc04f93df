//! Arbitrary bytes as the files of a store directory (`head.zr`, the table,
//! chunk files, `dict.zr`): opening, gathering and verifying must return
//! `Ok` or a typed error, never panic or read out of bounds.
//!
//! Each file is either taken raw from the input or, when its flag says so,
//! given a valid header and checksum around the input's fields, so the fuzzer
//! gets past the checksums to the checks behind them.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zring_fuzz::{chunk_name, put, read_everything, table_header, table_name, Entry, Head};

#[derive(Debug, Arbitrary)]
enum HeadBytes {
    Raw(Vec<u8>),
    Valid(Head),
}

#[derive(Debug, Arbitrary)]
enum TableBytes {
    Raw(Vec<u8>),
    /// A valid header, then entries with valid entry checksums, then trailing bytes.
    Valid {
        entries: Vec<Entry>,
        trailing: Vec<u8>,
    },
}

#[derive(Debug, Arbitrary)]
struct Input {
    head: HeadBytes,
    table: TableBytes,
    /// Chunk files `chunk_base..`, at most four.
    chunks: Vec<Vec<u8>>,
    dict: Option<Vec<u8>>,
    /// Also try opening writable (which runs recovery) and appending.
    writable: bool,
}

fuzz_target!(|input: Input| {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (generation, base) = match &input.head {
        HeadBytes::Raw(b) => {
            put(d, "head.zr", b);
            (1, 0)
        }
        HeadBytes::Valid(h) => {
            // Few chunks (the engine stats every chunk the head names) and low
            // generation numbers; the chunk base stays arbitrary half the time.
            let chunk_base = if h.generation % 2 == 0 { h.chunk_base % 4 } else { h.chunk_base };
            let h = Head { generation: h.generation % 4, chunk_base, chunk_count: h.chunk_count % 6, ..*h };
            put(d, "head.zr", &h.encode());
            (h.generation, h.chunk_base)
        }
    };
    match &input.table {
        TableBytes::Raw(b) => put(d, &table_name(generation), b),
        TableBytes::Valid { entries, trailing } => {
            let mut b = table_header(generation).to_vec();
            for e in entries.iter().take(64) {
                b.extend_from_slice(
                    &Entry { chunk: base.wrapping_add(e.chunk % 6), codec: e.codec % 4, ..*e }.encode(),
                );
            }
            b.extend_from_slice(trailing);
            put(d, &table_name(generation), &b);
        }
    }
    for (k, c) in input.chunks.iter().take(4).enumerate() {
        put(d, &chunk_name(base.wrapping_add(k as u32)), c);
    }
    if let Some(dict) = &input.dict {
        put(d, "dict.zr", dict);
    }
    let _ = read_everything(d);
    if input.writable {
        if let Ok(s) = zring_engine::Store::builder(d).open_writable() {
            if s.append(&[b"fuzz".as_slice(), b"".as_slice()], None).is_ok() {
                let _ = s.sync();
            }
            drop(s);
            let _ = read_everything(d);
        }
    }
});
