//! A saved state knows the records it was drawn over. Before, a state held
//! the streams' length only: a resume over replaced records (the same
//! count) went on silently with other records at the saved indices, and a
//! resume over a store that grew by appends was refused outright. Now a
//! state carries each stream's fingerprint, and:
//!
//! * a resume over changed records is refused, naming the stream;
//! * a resume over a store that only grew finishes the cycle under way
//!   exactly as the uninterrupted run would have, and the new records join
//!   from the next cycle;
//! * a state without fingerprints (saved before they existed) resumes as
//!   before.
//!
//! Also here: each step reads one view of each source, so a source that
//! changes between the lengths of a ragged step and its gather cannot mix
//! two states in one batch.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{with_timeout, DEADLOCK};
use zring_engine::Store;
use zring_loader::{
    Error, Layout, Loader, LoaderConfig, LoaderState, Mode, Request, Slots, Source, SourceError, StoreSource, Stream,
};

fn rec(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; 1 + (i % 5) as usize]
}

fn append(store: &Store, range: std::ops::Range<u64>) {
    let recs: Vec<Vec<u8>> = range.map(rec).collect();
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
}

fn store(dir: &std::path::Path, n: u64) {
    let s = Store::builder(dir).create().unwrap();
    append(&s, 0..n);
}

fn loader(dir: &std::path::Path, config: LoaderConfig) -> Result<Loader, Error> {
    let store = Arc::new(Store::open(dir).unwrap());
    Loader::new(vec![Stream::new("x", Arc::new(StoreSource::ragged(store)))], config)
}

/// Each step's indices, checking every row holds its record.
fn steps(l: &mut Loader, n: usize) -> Vec<Vec<u64>> {
    (0..n)
        .map(|_| {
            let b = l.next().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(b.record("x", k).unwrap(), &rec(i)[..], "step {} row {k}", b.step);
            }
            b.indices.to_vec()
        })
        .collect()
}

#[test]
fn a_resume_over_replaced_records_is_refused_naming_the_stream() {
    with_timeout(DEADLOCK, || {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), 200);
        let mut l = loader(dir.path(), LoaderConfig { mode: Mode::Cyclic, ..LoaderConfig::new(16) }).unwrap();
        steps(&mut l, 5);
        let state = l.state();
        assert_eq!(state.fingerprints["x"].records, 200);
        drop(l);
        {
            // Replace a record: 200 records again, one of them other bytes.
            let w = Store::builder(dir.path()).open_writable().unwrap();
            w.delete(&[7]).unwrap();
            w.append(&[&b"other"[..]], None).unwrap();
            w.sync().unwrap();
            assert_eq!(w.len(), 200);
        }
        let err = loader(dir.path(), LoaderConfig::from_state(&state)).unwrap_err();
        assert!(matches!(&err, Error::StreamChanged { stream, .. } if stream == "x"), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("\"x\"") && msg.contains("changed") && msg.contains("200"), "{msg}");
    });
}

#[test]
fn a_resume_over_a_grown_store_finishes_the_cycle_then_adds_the_new_records() {
    with_timeout(DEADLOCK * 3, || {
        // 200 records in batches of 16: cyclic and iid cycles of 12 steps;
        // sequential passes of 12.5, so the pass under way at step 5 ends
        // inside step 12 and the walk over 240 starts at step 13.
        for (mode, boundary) in [(Mode::Cyclic, 12u64), (Mode::Iid, 12), (Mode::Sequential, 13)] {
            let dir = tempfile::tempdir().unwrap();
            store(dir.path(), 200);
            let config = LoaderConfig { mode, seed: 4, ..LoaderConfig::new(16) };
            let mut whole = loader(dir.path(), config).unwrap();
            steps(&mut whole, 5);
            let state = whole.state();
            let uninterrupted = steps(&mut whole, boundary as usize - 5);
            drop(whole);

            append(&Store::builder(dir.path()).open_writable().unwrap(), 200..240);
            let json = serde_json::to_string(&state).unwrap();
            let saved: LoaderState = serde_json::from_str(&json).unwrap();
            let mut resumed = loader(dir.path(), LoaderConfig::from_state(&saved)).unwrap();
            let before = steps(&mut resumed, boundary as usize - 5);
            assert_eq!(before, uninterrupted, "{mode:?}: the cycle under way is unchanged");
            // The state still names the saved records until the boundary.
            let mid = resumed.state_at(boundary - 1);
            assert_eq!((mid.sampler.length, mid.fingerprints["x"].records), (200, 200));
            let at = resumed.state();
            assert_eq!(at.sampler.step, boundary);
            assert_eq!((at.sampler.length, at.sampler.origin, at.fingerprints["x"].records), (240, boundary, 240));

            // From the boundary on, cycles over all 240 records.
            let after = steps(&mut resumed, 15);
            let seen: BTreeSet<u64> = after.iter().flatten().copied().collect();
            assert!(seen.iter().any(|&i| i >= 200), "{mode:?}: new records join");
            if mode == Mode::Cyclic {
                let all: Vec<u64> = after.iter().flatten().copied().collect();
                assert_eq!(all.len(), 240);
                assert_eq!(seen, (0..240).collect(), "one whole cycle over 240 records");
            }
            if mode == Mode::Sequential {
                assert_eq!(after[0], (0..16).collect::<Vec<u64>>());
            }

            // A state saved after the boundary resumes the grown run exactly.
            let later = resumed.state();
            let next = steps(&mut resumed, 3);
            let mut again = loader(dir.path(), LoaderConfig::from_state(&later)).unwrap();
            assert_eq!(steps(&mut again, 3), next, "{mode:?}");
            // And the state saved before growth resumes the same way twice.
            let mut twice = loader(dir.path(), LoaderConfig::from_state(&saved)).unwrap();
            assert_eq!(steps(&mut twice, boundary as usize - 5 + 15)[boundary as usize - 5..], after[..]);
        }
    });
}

#[test]
fn a_state_without_fingerprints_resumes_as_before() {
    with_timeout(DEADLOCK, || {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), 100);
        let mut l = loader(dir.path(), LoaderConfig { mode: Mode::Cyclic, ..LoaderConfig::new(8) }).unwrap();
        steps(&mut l, 3);
        let mut json: serde_json::Value = serde_json::to_value(l.state()).unwrap();
        json.as_object_mut().unwrap().remove("fingerprints");
        let old: LoaderState = serde_json::from_value(json).unwrap();
        assert!(old.fingerprints.is_empty());
        let rest = steps(&mut l, 4);
        let mut resumed = loader(dir.path(), LoaderConfig::from_state(&old)).unwrap();
        assert_eq!(steps(&mut resumed, 4), rest);
        drop(resumed);
        // Without fingerprints nothing shows the store only grew.
        append(&Store::builder(dir.path()).open_writable().unwrap(), 100..110);
        let err = loader(dir.path(), LoaderConfig::from_state(&old)).unwrap_err();
        assert!(matches!(err, Error::StateMismatch { state_length: 100, stream_length: 110 }), "{err:?}");
    });
}

/// A ragged source that moves on at every call: its records at generation
/// `g` are `g` repeated `1 + (i + g) % 7` times. Its own `gather_var`
/// refuses offsets sized by another generation's lengths; its views are
/// frozen at one generation.
struct Moving {
    generation: AtomicU64,
}

fn moving_record(i: u64, g: u64) -> Vec<u8> {
    vec![g as u8; 1 + ((i + g) % 7) as usize]
}

fn fill(g: u64, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
    let Slots::Offsets(offsets) = req.slots else { return Err("ragged slots only".into()) };
    for (k, &i) in req.indices.iter().enumerate() {
        let r = moving_record(i, g);
        let slot = &mut dst[offsets[k] as usize..offsets[k + 1] as usize];
        if slot.len() != r.len() {
            return Err(format!("record {i} is {} bytes now, the slot {}", r.len(), slot.len()).into());
        }
        slot.copy_from_slice(&r);
    }
    Ok(())
}

struct Frozen(u64);

impl Source for Frozen {
    fn len(&self) -> u64 {
        64
    }
    fn layout(&self) -> Layout {
        Layout::Ragged
    }
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        for (o, &i) in out.iter_mut().zip(indices) {
            *o = moving_record(i, self.0).len() as u64;
        }
        Ok(())
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        fill(self.0, req, dst)
    }
}

impl Source for Moving {
    fn len(&self) -> u64 {
        64
    }
    fn layout(&self) -> Layout {
        Layout::Ragged
    }
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        Frozen(self.generation.fetch_add(1, Ordering::SeqCst)).lengths(indices, out)
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        fill(self.generation.fetch_add(1, Ordering::SeqCst), req, dst)
    }
    fn view(&self) -> Result<Option<Box<dyn Source>>, SourceError> {
        Ok(Some(Box::new(Frozen(self.generation.fetch_add(1, Ordering::SeqCst)))))
    }
}

#[test]
fn each_step_reads_one_view_of_a_changing_source() {
    with_timeout(DEADLOCK, || {
        let source = Arc::new(Moving { generation: AtomicU64::new(0) });
        let streams = vec![Stream::new("x", source as Arc<dyn Source>)];
        let mut l = Loader::new(streams, LoaderConfig { threads: 3, depth: 4, ..LoaderConfig::new(8) }).unwrap();
        for _ in 0..30 {
            let b = l.next().unwrap();
            // One generation per batch, every row of its length.
            let g = b.record("x", 0).unwrap()[0];
            for (k, &i) in b.indices.iter().enumerate() {
                assert_eq!(b.record("x", k).unwrap(), &moving_record(i, u64::from(g))[..], "step {}", b.step);
            }
        }
    });
}

/// A mixture's state carries every source's fingerprints (`"<source>/<name>"`):
/// a source that grew resumes (its cycle under way over the saved records,
/// its state listing the growth); replaced records in one source are
/// refused, naming it.
#[test]
fn a_mixture_resume_checks_every_source() {
    with_timeout(DEADLOCK, || {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        for d in &dirs {
            store(d.path(), 100);
        }
        let mixture = || {
            let sources = dirs
                .iter()
                .map(|d| {
                    let s = Arc::new(Store::open(d.path()).unwrap());
                    zring_loader::MixSource::new(1.0, vec![Stream::new("x", Arc::new(StoreSource::ragged(s)))])
                })
                .collect::<Vec<_>>();
            sources
        };
        let mut l = Loader::new_mixture(mixture(), LoaderConfig::new(8)).unwrap();
        l.next().unwrap();
        let state = l.state();
        assert_eq!(state.fingerprints.keys().collect::<Vec<_>>(), ["0/x", "1/x"]);
        drop(l);
        assert!(Loader::new_mixture(mixture(), LoaderConfig::from_state(&state)).is_ok());

        append(&Store::builder(dirs[0].path()).open_writable().unwrap(), 100..110);
        let grown = Loader::new_mixture(mixture(), LoaderConfig::from_state(&state)).unwrap().state();
        let m = grown.mixture.expect("a mixture's state");
        assert_eq!(m.lengths, [110, 100]);
        assert_eq!(m.growth.expect("the growth")[0], [(0, 100), (1, 110)]);

        {
            let w = Store::builder(dirs[1].path()).open_writable().unwrap();
            w.delete(&[3]).unwrap();
            w.append(&[&b"other"[..]], None).unwrap();
            w.sync().unwrap();
        }
        let err = Loader::new_mixture(mixture(), LoaderConfig::from_state(&state)).unwrap_err();
        assert!(matches!(&err, Error::StreamChanged { stream, .. } if stream == "1/x"), "{err:?}");
    });
}

/// A store smaller than one batch gave batches of all its records; after
/// it grew, batches of another length cannot continue the saved run, and
/// the resume says so.
#[test]
fn a_grown_store_that_would_change_the_batch_length_is_refused() {
    with_timeout(DEADLOCK, || {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), 10);
        let mut l = loader(dir.path(), LoaderConfig { mode: Mode::Cyclic, ..LoaderConfig::new(16) }).unwrap();
        l.next().unwrap();
        let state = l.state();
        drop(l);
        append(&Store::builder(dir.path()).open_writable().unwrap(), 10..30);
        let err = loader(dir.path(), LoaderConfig::from_state(&state)).unwrap_err();
        assert!(matches!(err, Error::CannotGrow { saved: 10, now: 30, .. }), "{err:?}");
        assert!(err.to_string().contains("batch_size 16"), "{err}");
    });
}
