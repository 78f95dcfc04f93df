//! Decoding `zstd_dict` records with the dictionary as the output's prefix.
//!
//! libzstd copies a match that points into a dictionary with a `memmove` call
//! of a few bytes when the dictionary lies elsewhere in memory (its "extDict"
//! branch), but with its inline wild copy when the dictionary's content ends
//! exactly where the output begins (then the dictionary is the frame's
//! prefix). With the dictionary inside a `ZSTD_DDict` the first always
//! happens, and on records of 12 KiB it took a quarter of the decode time, so
//! a dictionary store decoded 1.5x slower than plain zstd
//! (bench-results/zstd-ceiling.md).
//!
//! So each thread keeps, per dictionary, its own copy of the dictionary's
//! bytes with room for one record after them and a `ZSTD_DDict` made *by
//! reference* over that copy (digested once per thread and dictionary);
//! a record decodes into the room and is copied out. A few dictionaries are
//! kept per thread, the least recently used one dropped first.

use std::cell::RefCell;

use zstd::zstd_safe::{DCtx, DDict};

/// Dictionaries kept per thread (a loader over a mixture of dictionary
/// stores uses one per store).
const KEPT: usize = 4;

/// Room after the dictionary at first; grown to the largest record seen.
const MIN_ROOM: usize = 16 << 10;

/// Records larger than this decode straight into the caller's buffer, the
/// dictionary not contiguous (libzstd's slower copies of matches into it,
/// a small share of a large record's work): the room is never grown past it,
/// so a thread does not keep a copy the size of its largest record.
const MAX_ROOM: usize = 1 << 20;

/// One dictionary's copy, with room for a record after it.
struct Prefixed {
    /// Which dictionary (`Dict::id`).
    key: u64,
    /// Declared before `buf`, so it is dropped first: it points into `buf`.
    ddict: DDict<'static>,
    /// The dictionary's bytes, then `room` bytes a record decodes into.
    buf: Box<[u8]>,
    dict_len: usize,
}

impl Prefixed {
    fn new(key: u64, dict: &[u8], room: usize) -> Prefixed {
        let mut buf = vec![0u8; dict.len() + room].into_boxed_slice();
        buf[..dict.len()].copy_from_slice(dict);
        // SAFETY: the slice covers the first `dict.len()` bytes of `buf`'s
        // heap allocation, which neither moves (moving the Box moves only its
        // pointer) nor is freed while the `DDict` lives: the `DDict` is
        // declared before `buf` in `Prefixed`, so it is dropped first, and
        // `buf` is never replaced (a larger room makes a new `Prefixed`).
        // Those bytes are never written again (records decode into the room
        // after them), and no Rust reference to them outlives this call: the
        // `DDict` keeps a raw pointer.
        let content: &'static [u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr(), dict.len()) };
        let ddict = DDict::create_by_reference(content);
        Prefixed { key, ddict, buf, dict_len: dict.len() }
    }
}

thread_local! {
    // One decoding context for these records per thread, and the thread's
    // dictionaries, most recently used last. Plain memory after fork(), as
    // the contexts of `format::codec` are.
    static DCTX: RefCell<DCtx<'static>> = RefCell::new(DCtx::create());
    static KEPT_DICTS: RefCell<Vec<Prefixed>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// Dictionaries this thread has digested (tests only).
    pub(crate) static DIGESTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Decodes `src`, a frame compressed with the dictionary `dict` (whose
/// identity is `key`), into `dst`; returns the decoded length, or zstd's
/// error code.
pub(crate) fn decode(key: u64, dict: &[u8], src: &[u8], dst: &mut [u8]) -> Result<usize, usize> {
    KEPT_DICTS.with(|kept| {
        let mut kept = kept.borrow_mut();
        // Room this record needs (none when it decodes straight into `dst`).
        let want = if dst.len() > MAX_ROOM { 0 } else { dst.len() };
        let at = match kept.iter().position(|p| p.key == key) {
            Some(i) if kept[i].buf.len() - kept[i].dict_len >= want => i,
            found => {
                let room = found.map_or(0, |i| kept[i].buf.len() - kept[i].dict_len);
                if let Some(i) = found {
                    kept.remove(i);
                } else if kept.len() == KEPT {
                    kept.remove(0);
                }
                kept.push(Prefixed::new(key, dict, want.max(MIN_ROOM).max(room * 2).min(MAX_ROOM)));
                #[cfg(test)]
                DIGESTS.with(|d| d.set(d.get() + 1));
                kept.len() - 1
            }
        };
        if at + 1 != kept.len() {
            let p = kept.remove(at);
            kept.push(p);
        }
        let p = kept.last_mut().expect("pushed above");
        if dst.len() > MAX_ROOM {
            return DCTX.with(|c| c.borrow_mut().decompress_using_ddict(dst, src, &p.ddict));
        }
        let room = &mut p.buf[p.dict_len..p.dict_len + dst.len()];
        let n = DCTX.with(|c| c.borrow_mut().decompress_using_ddict(room, src, &p.ddict))?;
        dst[..n].copy_from_slice(&room[..n]);
        Ok(n)
    })
}
