//! Arbitrary stored bytes behind a valid table entry (valid checksums, an
//! arbitrary codec tag and logical length): a gather returns `Ok` or a typed
//! error, never panics. When it succeeds, the bytes must be what the codec
//! defines: the stored bytes for raw records, zstd's own decoding otherwise.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zring_fuzz::{chunk_name, put, read_everything, table_header, table_name, Entry, Head, MAX_LOGICAL};

#[derive(Debug, Arbitrary)]
struct Record {
    codec: u8,
    logical_len: u32,
    stored: Vec<u8>,
    /// Store a wrong checksum (then the gather must fail).
    bad_crc: bool,
}

#[derive(Debug, Arbitrary)]
struct Input {
    records: Vec<Record>,
    dict: Option<Vec<u8>>,
}

fuzz_target!(|input: Input| {
    let recs: Vec<&Record> = input.records.iter().take(8).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let mut chunk = Vec::new();
    let mut table = table_header(1).to_vec();
    for r in &recs {
        let logical = if r.codec % 3 == 0 { r.stored.len() as u32 } else { r.logical_len % (MAX_LOGICAL as u32 + 1) };
        let crc = crc32c::crc32c(&r.stored) ^ u32::from(r.bad_crc);
        let e = Entry {
            offset: chunk.len() as u64,
            chunk: 0,
            stored_len: r.stored.len() as u32,
            logical_len: logical,
            crc,
            codec: r.codec % 4,
        };
        table.extend_from_slice(&e.encode());
        chunk.extend_from_slice(&r.stored);
    }
    let (dict_len, dict_crc) = match &input.dict {
        Some(b) => {
            put(d, "dict.zr", b);
            (b.len() as u32, crc32c::crc32c(b))
        }
        None => (0, 0),
    };
    let head = Head {
        generation: 1,
        records: recs.len() as u64,
        chunk_base: 0,
        chunk_count: 1,
        tail_len: chunk.len() as u64,
        dict_len,
        dict_crc,
        chunk_target: 1 << 30,
    };
    put(d, "head.zr", &head.encode());
    put(d, &table_name(1), &table);
    put(d, &chunk_name(0), &chunk);
    let Some(got) = read_everything(d) else { return };
    for (r, g) in recs.iter().zip(&got) {
        assert!(!r.bad_crc, "a record with a wrong checksum was returned");
        match r.codec % 4 {
            0 => assert_eq!(g, &r.stored, "raw record changed"),
            1 => {
                let want = zstd::bulk::decompress(&r.stored, g.len()).expect("engine decoded what zstd rejects");
                assert_eq!(&want, g, "zstd record decoded differently");
            }
            2 => assert!(input.dict.is_some(), "zstd_dict record decoded without a dictionary"),
            _ => panic!("unknown codec tag {} accepted", r.codec % 4),
        }
    }
});
