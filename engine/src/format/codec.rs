//! Per-record codecs: raw, zstd, and zstd against a dictionary trained on the data.
//!
//! Every record is compressed on its own so any record can be read alone. A
//! record that does not shrink is stored raw, which also lets raw records be
//! read straight into the caller's buffer.

use std::cell::RefCell;

use zstd::zstd_safe::{CCtx, CDict, DCtx, DDict};

use crate::error::{Error, Result};

/// How a record's bytes are stored. The tags match loaderx 0.7.3's, so its
/// tables decode unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Codec {
    /// Stored as given.
    Raw = 0,
    /// zstd, each record its own frame.
    Zstd = 1,
    /// zstd against the store's trained dictionary.
    ZstdDict = 2,
}

impl Codec {
    /// The codec with this on-disk tag.
    pub fn from_tag(tag: u8) -> Option<Codec> {
        match tag {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ZstdDict),
            _ => None,
        }
    }

    /// Parses the names the Python API uses: `raw`, `zstd`, `zstd_dict`.
    pub fn from_name(name: &str) -> Result<Codec> {
        match name {
            "raw" => Ok(Codec::Raw),
            "zstd" => Ok(Codec::Zstd),
            "zstd_dict" | "zstdict" => Ok(Codec::ZstdDict),
            other => Err(Error::InvalidArgument(format!(
                "unknown codec {other:?}, expected one of \"raw\", \"zstd\", \"zstd_dict\""
            ))),
        }
    }

    /// The name [`Codec::from_name`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::ZstdDict => "zstd_dict",
        }
    }
}

/// A trained dictionary, shared by all threads: its compression side digested
/// once (zstd's digested dictionaries are immutable), its decompression side
/// once per decoding thread, over that thread's copy (`io::zprefix`).
///
/// The compression side is digested on the first encode, not when a store
/// opens: most handles only read, and a digested compression dictionary
/// costs as much time and memory as the decompression one.
pub(crate) struct Dict {
    pub bytes: Vec<u8>,
    /// This dictionary among every one this process made: the key of the
    /// decoding threads' copies (`io::zprefix`).
    id: u64,
    /// The level to compress at (`None`: this store never encodes with it).
    level: Option<i32>,
    cdict: std::sync::OnceLock<Option<CDict<'static>>>,
}

impl Dict {
    pub fn new(bytes: Vec<u8>, level: Option<i32>) -> Result<Dict> {
        // Checked once here; each decoding thread digests its own copy
        // (`io::zprefix`).
        DDict::try_create(&bytes)
            .ok_or_else(|| crate::error::corrupted("dictionary", "zstd rejected the dictionary bytes"))?;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Dict { bytes, id, level, cdict: std::sync::OnceLock::new() })
    }

    /// The digested compression dictionary, made on first use; `None` where
    /// the store does not compress with it or zstd rejects the bytes.
    fn cdict(&self) -> Option<&CDict<'static>> {
        let level = self.level?;
        self.cdict.get_or_init(|| CDict::try_create(&self.bytes, level)).as_ref()
    }

    /// Whether the compression side has been digested (tests).
    #[cfg(test)]
    pub fn has_cdict(&self) -> bool {
        self.cdict.get().is_some_and(Option::is_some)
    }
}

thread_local! {
    // One context per thread, reused for every record it handles. A context
    // made before fork() is plain memory, so a forked child may keep using it.
    static DCTX: RefCell<DCtx<'static>> = RefCell::new(DCtx::create());
    static CCTX: RefCell<CCtx<'static>> = RefCell::new(CCtx::create());
}

/// Decodes `src` (stored with `codec`) into exactly `dst`. Returns a
/// description of what went wrong; the caller turns it into a typed error
/// naming the record.
pub(crate) fn decode(codec: Codec, src: &[u8], dst: &mut [u8], dict: Option<&Dict>) -> std::result::Result<(), String> {
    match codec {
        Codec::Raw => {
            if src.len() != dst.len() {
                return Err(format!("raw record of {} bytes for a {}-byte slot", src.len(), dst.len()));
            }
            dst.copy_from_slice(src);
            Ok(())
        }
        Codec::Zstd | Codec::ZstdDict => {
            if codec == Codec::ZstdDict && dict.is_none() {
                return Err("zstd_dict record but the store has no dictionary".into());
            }
            let n = match dict.filter(|_| codec == Codec::ZstdDict) {
                // Decoded after a copy of the dictionary, so that matches into
                // it take libzstd's fast path (`io::zprefix`).
                Some(d) => crate::io::zprefix::decode(d.id, &d.bytes, src, dst),
                None => DCTX.with(|c| c.borrow_mut().decompress(dst, src)),
            };
            match n {
                Ok(n) if n == dst.len() => Ok(()),
                Ok(n) => Err(format!("decoded {n} bytes, table says {}", dst.len())),
                Err(code) => Err(format!("zstd: {}", zstd::zstd_safe::get_error_name(code))),
            }
        }
    }
}

/// Encodes `src` onto the end of `out` and returns the codec it is stored
/// with: `codec`, or `Raw` (the bytes copied as they are) when compression
/// would not make the record smaller.
pub(crate) fn encode_into(
    codec: Codec,
    level: i32,
    src: &[u8],
    dict: Option<&Dict>,
    out: &mut Vec<u8>,
) -> Result<Codec> {
    if codec == Codec::Raw || src.is_empty() {
        out.extend_from_slice(src);
        return Ok(Codec::Raw);
    }
    let start = out.len();
    out.reserve(zstd::zstd_safe::compress_bound(src.len()));
    // The cursor starts at the end of `out`, so zstd writes into its spare
    // capacity and `out` grows by exactly the compressed length.
    let mut cursor = std::io::Cursor::new(&mut *out);
    cursor.set_position(start as u64);
    let r = CCTX.with(|c| {
        let mut c = c.borrow_mut();
        match codec {
            Codec::ZstdDict => {
                let cdict = dict.and_then(Dict::cdict).ok_or(Error::NoDictionary)?;
                Ok(c.compress_using_cdict(&mut cursor, src, cdict))
            }
            _ => Ok(c.compress(&mut cursor, src, level)),
        }
    })?;
    match r {
        Ok(n) if n < src.len() => Ok(codec),
        Ok(_) => {
            out.truncate(start);
            out.extend_from_slice(src);
            Ok(Codec::Raw)
        }
        Err(code) => {
            out.truncate(start);
            Err(Error::InvalidArgument(format!(
                "zstd could not compress a record: {}",
                zstd::zstd_safe::get_error_name(code)
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in [Codec::Raw, Codec::Zstd, Codec::ZstdDict] {
            assert_eq!(Codec::from_name(c.name()).unwrap(), c);
            assert_eq!(Codec::from_tag(c as u8), Some(c));
        }
        assert!(Codec::from_name("gzip").is_err());
        assert_eq!(Codec::from_tag(3), None);
    }

    #[test]
    fn incompressible_records_stay_raw_and_garbage_is_an_error() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let mut out = b"head".to_vec();
        assert_eq!(encode_into(Codec::Zstd, 3, &noise, None, &mut out).unwrap(), Codec::Raw);
        assert_eq!(&out[..4], b"head");
        assert_eq!(&out[4..], &noise[..], "an incompressible record is stored as it is");
        let zeros = vec![0u8; 4096];
        let mut z = vec![7u8; 3];
        assert_eq!(encode_into(Codec::Zstd, 3, &zeros, None, &mut z).unwrap(), Codec::Zstd);
        assert_eq!(z.drain(..3).collect::<Vec<_>>(), [7, 7, 7], "bytes before the record stay");
        assert!(z.len() < 100);
        let mut back = vec![1u8; 4096];
        decode(Codec::Zstd, &z, &mut back, None).unwrap();
        assert_eq!(back, zeros);
        let mut short = vec![0u8; 100];
        assert!(decode(Codec::Zstd, &z, &mut short, None).is_err());
        assert!(decode(Codec::Zstd, &noise, &mut back, None).is_err());
        assert!(decode(Codec::ZstdDict, &z, &mut back, None).is_err());
    }

    fn trained() -> Vec<u8> {
        trained_on("the quick brown fox")
    }

    fn trained_on(words: &str) -> Vec<u8> {
        let samples: Vec<Vec<u8>> =
            (0..400u32).map(|i| format!("record {i}: {words} {} jumps", i % 17).into_bytes()).collect();
        zstd::dict::from_samples(&samples, 4096).unwrap()
    }

    #[test]
    fn dictionary_records_decode_after_each_threads_copy_of_their_own_dictionary() {
        use crate::io::zprefix::DIGESTS;
        let digests = || DIGESTS.with(std::cell::Cell::get);
        let words = ["the quick brown fox", "a lazy dog sleeps", "seven green apples", "one blue whale", "tiny ants"];
        let dicts: Vec<Dict> = words.iter().map(|w| Dict::new(trained_on(w), Some(3)).unwrap()).collect();
        let record = |k: usize, i: usize, len: usize| -> Vec<u8> {
            let mut r = Vec::new();
            while r.len() < len {
                r.extend_from_slice(format!("record {i}: {} {} jumps ", words[k], i % 17).as_bytes());
            }
            r.truncate(len);
            r
        };
        let encoded = |k: usize, rec: &[u8]| -> Vec<u8> {
            let mut out = Vec::new();
            assert_eq!(encode_into(Codec::ZstdDict, 3, rec, Some(&dicts[k]), &mut out).unwrap(), Codec::ZstdDict);
            out
        };
        let check = |k: usize, rec: &[u8]| {
            let mut back = vec![0u8; rec.len()];
            decode(Codec::ZstdDict, &encoded(k, rec), &mut back, Some(&dicts[k])).unwrap();
            assert_eq!(back, rec, "dictionary {k}");
        };
        let start = digests();
        // Two dictionaries alternating: each digested once on this thread.
        for i in 0..20 {
            check(i % 2, &record(i % 2, i, 300 + i));
        }
        assert_eq!(digests() - start, 2);
        // A record larger than the room after the copy: a new copy with more room.
        check(0, &record(0, 7, 40_000));
        assert_eq!(digests() - start, 3);
        check(0, &record(0, 8, 30_000));
        assert_eq!(digests() - start, 3, "the larger room stays");
        // Past the largest room, straight into the caller's buffer, no new copy.
        check(0, &record(0, 9, (1 << 20) + 5_000));
        assert_eq!(digests() - start, 3);
        // A fifth dictionary drops the least recently used one (1), not the others.
        for k in [2, 3, 4, 0, 2, 3, 4] {
            check(k, &record(k, k, 500));
        }
        assert_eq!(digests() - start, 6);
        check(1, &record(1, 1, 500));
        assert_eq!(digests() - start, 7);
        // A record compressed with another dictionary is an error, not wrong bytes.
        let rec = record(0, 3, 500);
        let mut back = vec![0u8; rec.len()];
        assert!(decode(Codec::ZstdDict, &encoded(0, &rec), &mut back, Some(&dicts[1])).is_err());
    }

    #[test]
    fn zstd_errors_are_named_not_taken_for_a_missing_dictionary() {
        // A generic zstd failure has the error code usize::MAX (-1), which a
        // sentinel once made read as "no dictionary".
        let d = Dict::new(trained(), None).unwrap();
        let mut dst = vec![0u8; 64];
        let e = decode(Codec::ZstdDict, b"not a zstd frame at all", &mut dst, Some(&d)).unwrap_err();
        assert!(e.starts_with("zstd: "), "{e}");
        assert!(!e.contains("dictionary"), "{e}");
        let e = decode(Codec::ZstdDict, b"x", &mut dst, None).unwrap_err();
        assert!(e.contains("no dictionary"), "{e}");
    }

    #[test]
    fn the_compression_dictionary_is_digested_on_the_first_encode_only() {
        let reader = Dict::new(trained(), None).unwrap();
        let mut out = Vec::new();
        assert!(matches!(encode_into(Codec::ZstdDict, 3, b"abc", Some(&reader), &mut out), Err(Error::NoDictionary)));
        assert!(!reader.has_cdict(), "a reader's dictionary never digests the compression side");
        let writer = Dict::new(trained(), Some(3)).unwrap();
        assert!(!writer.has_cdict(), "not when the store opens");
        let rec = b"record 5: the quick brown fox 5 jumps record 5: the quick brown fox 5 jumps".to_vec();
        assert_eq!(encode_into(Codec::ZstdDict, 3, &rec, Some(&writer), &mut out).unwrap(), Codec::ZstdDict);
        assert!(writer.has_cdict());
        let mut back = vec![0u8; rec.len()];
        decode(Codec::ZstdDict, &out, &mut back, Some(&writer)).unwrap();
        assert_eq!(back, rec);
    }
}
