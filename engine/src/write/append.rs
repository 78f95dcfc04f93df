//! The append pipeline: records are encoded on every core while the blocks
//! encoded before them are written.
//!
//! An append is cut into blocks of consecutive records, about [`BLOCK_BYTES`]
//! of input each. Every core takes the next unclaimed block and encodes its
//! records back to back into one buffer, with their checksums: the decode
//! pool's threads and the calling thread alike. The calling thread alone
//! writes, in record order: whenever the block after the last written one is
//! ready, it hands every ready block in order to the writer in one call (one
//! batch of transfers: a write per block and chunk, one for the table
//! entries), and otherwise it encodes. Raw records that lie back to back in
//! the caller's memory (a NumPy array) are written from there, uncopied.
//!
//! Why these numbers:
//! - [`BLOCK_BYTES`] = 1 MiB of input: zstd at level 3 encodes that in about
//!   2 ms on one core, so a claim, a wake-up and a transfer per block (a few
//!   microseconds each) cost well under 1%, while a 64 MiB append still has
//!   64 blocks to share out, so the threads finish within a block of each
//!   other and the pipeline fills and drains in one block's time.
//! - [`AHEAD_PER_THREAD`] = 4: encoders stop claiming once they are that many
//!   blocks per thread past the last block written. It covers one slow write
//!   (the writer takes every ready block at once) and bounds the memory of an
//!   append of any size to about `threads × 4 × 1 MiB` of encoded bytes.

use std::borrow::Cow;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::error::Result;
use crate::format::codec::{self, Codec, Dict};

/// Input bytes per block (see the module docs).
const BLOCK_BYTES: usize = 1 << 20;
/// Blocks per thread that encoders may run ahead of the writer.
const AHEAD_PER_THREAD: usize = 4;

/// Consecutive records, encoded back to back.
pub(crate) struct Block<'a> {
    /// The stored bytes of every record, in order.
    pub bytes: Cow<'a, [u8]>,
    /// One entry per record: where its stored bytes end in `bytes` follows
    /// from the lengths.
    pub records: Vec<Meta>,
}

/// How one record of a [`Block`] is stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub stored_len: u32,
    pub logical_len: u32,
    pub codec: Codec,
    pub crc: u32,
}

/// What an append encodes with.
pub(crate) struct Encoder<'d> {
    pub codec: Codec,
    pub level: i32,
    pub dict: Option<&'d Dict>,
}

/// The records of one append.
#[derive(Clone, Copy)]
pub(crate) enum Input<'r, 'a> {
    /// Records of any lengths, anywhere.
    List(&'r [&'a [u8]]),
    /// Records of `len` bytes each, back to back in `src`.
    Fixed { src: &'a [u8], len: usize },
}

impl<'a> Input<'_, 'a> {
    pub fn count(&self) -> usize {
        match *self {
            Input::List(l) => l.len(),
            Input::Fixed { src, len } => src.len() / len,
        }
    }

    fn get(&self, k: usize) -> &'a [u8] {
        match *self {
            Input::List(l) => l[k],
            Input::Fixed { src, len } => &src[k * len..][..len],
        }
    }

    /// Records `range` as one slice, where they lie back to back.
    fn span(&self, range: Range<usize>) -> Option<&'a [u8]> {
        match *self {
            Input::List(_) => None,
            Input::Fixed { src, len } => Some(&src[range.start * len..range.end * len]),
        }
    }
}

impl Encoder<'_> {
    /// Encodes records `range` of `input` into one block.
    fn block<'a>(&self, input: Input<'_, 'a>, range: Range<usize>) -> Result<Block<'a>> {
        if self.codec == Codec::Raw {
            let records = range
                .clone()
                .map(|k| {
                    let r = input.get(k);
                    Meta {
                        stored_len: r.len() as u32,
                        logical_len: r.len() as u32,
                        codec: Codec::Raw,
                        crc: crate::format::crc::crc32c(r),
                    }
                })
                .collect();
            let bytes = match input.span(range.clone()) {
                Some(span) => Cow::Borrowed(span),
                None => Cow::Owned(range.flat_map(|k| input.get(k).iter().copied()).collect()),
            };
            return Ok(Block { bytes, records });
        }
        let size: usize = range.clone().map(|k| input.get(k).len()).sum();
        let mut out = Vec::with_capacity(size + size / 64 + 1024);
        let mut records = Vec::with_capacity(range.len());
        for k in range {
            let r = input.get(k);
            let start = out.len();
            let codec = codec::encode_into(self.codec, self.level, r, self.dict, &mut out)?;
            let stored = &out[start..];
            records.push(Meta {
                stored_len: stored.len() as u32,
                logical_len: r.len() as u32,
                codec,
                crc: crate::format::crc::crc32c(stored),
            });
        }
        Ok(Block { bytes: Cow::Owned(out), records })
    }
}

/// Cuts `n` records of the given lengths into blocks of about
/// [`BLOCK_BYTES`] (at least one record each).
fn spans(lens: impl Iterator<Item = usize>) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let (mut start, mut bytes, mut k) = (0, 0, 0);
    for len in lens {
        if k > start && bytes + len > BLOCK_BYTES {
            spans.push(start..k);
            start = k;
            bytes = 0;
        }
        bytes += len;
        k += 1;
    }
    if k > start {
        spans.push(start..k);
    }
    spans
}

type Encoded<'a> = std::thread::Result<Result<Block<'a>>>;

struct State<'a> {
    /// The first block no thread has claimed.
    next: usize,
    /// Blocks handed to the writer.
    written: usize,
    /// Encoded blocks waiting for the writer, by block number.
    ready: Vec<Option<Encoded<'a>>>,
    /// Set when the writer gives up; encoders stop claiming.
    stop: bool,
}

struct Pipeline<'r, 'a> {
    input: Input<'r, 'a>,
    spans: Vec<Range<usize>>,
    ahead: usize,
    state: Mutex<State<'a>>,
    changed: Condvar,
}

impl<'a> Pipeline<'_, 'a> {
    fn lock(&self) -> MutexGuard<'_, State<'a>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'g>(&self, g: MutexGuard<'g, State<'a>>) -> MutexGuard<'g, State<'a>> {
        self.changed.wait(g).unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims the next block if one may be encoded now.
    fn claim(&self, st: &mut State<'a>) -> Option<usize> {
        (!st.stop && st.next < self.spans.len() && st.next < st.written + self.ahead).then(|| {
            st.next += 1;
            st.next - 1
        })
    }

    /// Encodes block `k` outside the lock and files it as ready. A panic is
    /// caught and filed too, so the writer, which waits for block `k`, is
    /// woken and re-raises it rather than waiting forever.
    fn encode<'g>(&'g self, enc: &Encoder<'_>, k: usize, st: MutexGuard<'g, State<'a>>) -> MutexGuard<'g, State<'a>> {
        drop(st);
        let block = catch_unwind(AssertUnwindSafe(|| enc.block(self.input, self.spans[k].clone())));
        let mut st = self.lock();
        st.ready[k] = Some(block);
        self.changed.notify_all();
        st
    }

    /// A pool thread's part: encode blocks until none is left to claim.
    fn encode_loop(&self, enc: &Encoder<'_>) {
        let mut st = self.lock();
        while !st.stop && st.next < self.spans.len() {
            st = match self.claim(&mut st) {
                Some(k) => self.encode(enc, k, st),
                None => self.wait(st),
            };
        }
    }

    /// The calling thread's part: write ready blocks in order, encode when
    /// none is ready, until every block is written or one fails.
    fn write_loop(&self, enc: &Encoder<'_>, write: &mut dyn FnMut(&[Block<'a>]) -> Result<()>) -> Result<()> {
        let n = self.spans.len();
        let mut st = self.lock();
        loop {
            let mut batch = Vec::new();
            let mut failed = None;
            while st.written + batch.len() < n {
                let k = st.written + batch.len();
                match st.ready[k].take() {
                    Some(Ok(Ok(b))) => batch.push(b),
                    Some(other) => {
                        failed = Some(other);
                        break;
                    }
                    None => break,
                }
            }
            if failed.is_some() {
                st.stop = true;
                self.changed.notify_all();
            }
            if !batch.is_empty() {
                drop(st);
                let r = write(&batch);
                st = self.lock();
                if let Err(e) = r {
                    st.stop = true;
                    self.changed.notify_all();
                    return Err(e);
                }
                st.written += batch.len();
                self.changed.notify_all();
            }
            match failed {
                Some(Err(panic)) => {
                    drop(st);
                    resume_unwind(panic)
                }
                Some(Ok(Err(e))) => return Err(e),
                _ => {}
            }
            if st.written == n {
                return Ok(());
            }
            if !batch.is_empty() {
                continue;
            }
            st = match self.claim(&mut st) {
                Some(k) => self.encode(enc, k, st),
                None => self.wait(st),
            };
        }
    }
}

/// Encodes `records` on every core and passes the blocks, in order, to
/// `write` on the calling thread as they become ready. Stops at the first
/// error (an encoding error, or `write`'s), after which no further block is
/// passed on; the blocks passed before it stay written.
pub(crate) fn encode_and_write<'a>(
    input: Input<'_, 'a>,
    enc: &Encoder<'_>,
    write: &mut dyn FnMut(&[Block<'a>]) -> Result<()>,
) -> Result<()> {
    let spans = spans((0..input.count()).map(|k| input.get(k).len()));
    if spans.len() <= 1 {
        for s in spans {
            write(&[enc.block(input, s)?])?;
        }
        return Ok(());
    }
    let pool = crate::pool::get();
    let helpers = pool.current_num_threads().min(spans.len() - 1);
    let p = Pipeline {
        input,
        ahead: (helpers + 1) * AHEAD_PER_THREAD,
        state: Mutex::new(State { next: 0, written: 0, ready: (0..spans.len()).map(|_| None).collect(), stop: false }),
        spans,
        changed: Condvar::new(),
    };
    pool.in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| p.encode_loop(enc));
        }
        let r = p.write_loop(enc, write);
        // Whatever happened, no helper may be left waiting for the writer.
        p.lock().stop = true;
        p.changed.notify_all();
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_hold_about_a_block_of_input_and_at_least_one_record() {
        let s = spans([BLOCK_BYTES / 2; 5].into_iter());
        assert_eq!(s, vec![0..2, 2..4, 4..5]);
        let s = spans([3 * BLOCK_BYTES, 1, 1].into_iter());
        assert_eq!(s, vec![0..1, 1..3]);
        assert!(spans(std::iter::empty()).is_empty());
    }

    #[test]
    fn raw_records_cut_from_one_slice_are_not_copied() {
        let src: Vec<u8> = (0..64u8).collect();
        let enc = Encoder { codec: Codec::Raw, level: 3, dict: None };
        let b = enc.block(Input::Fixed { src: &src, len: 16 }, 0..4).unwrap();
        assert!(matches!(b.bytes, Cow::Borrowed(_)), "adjacent records are written from the caller's memory");
        assert_eq!(&*b.bytes, &src[..]);
        let apart: Vec<&[u8]> = vec![&src[0..8], &src[16..24]];
        let b = enc.block(Input::List(&apart), 0..2).unwrap();
        assert!(matches!(b.bytes, Cow::Owned(_)));
        assert_eq!(&*b.bytes, [&src[0..8], &src[16..24]].concat().as_slice());
        assert_eq!(
            b.records.iter().map(|m| m.crc).collect::<Vec<_>>(),
            vec![crate::format::crc::crc32c(&src[0..8]), crate::format::crc::crc32c(&src[16..24])]
        );
    }

    #[test]
    fn blocks_reach_the_writer_in_order_and_an_error_stops_the_rest() {
        let recs: Vec<Vec<u8>> = (0..200u32).map(|i| vec![(i % 251) as u8; 64 << 10]).collect();
        let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
        let enc = Encoder { codec: Codec::Zstd, level: 1, dict: None };
        let mut seen = Vec::new();
        encode_and_write(Input::List(&refs), &enc, &mut |blocks| {
            for b in blocks {
                let mut pos = 0;
                for m in &b.records {
                    let mut back = vec![0u8; m.logical_len as usize];
                    codec::decode(m.codec, &b.bytes[pos..pos + m.stored_len as usize], &mut back, None).unwrap();
                    seen.push(back);
                    pos += m.stored_len as usize;
                }
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, recs);

        let mut calls = 0;
        let r = encode_and_write(Input::List(&refs), &enc, &mut |_| {
            calls += 1;
            Err(crate::Error::InvalidArgument("disk full".into()))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1, "nothing is written after a failed write");
    }
}
