use super::ring::probe;
use super::*;
use io_uring::IoUring;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};

#[test]
fn the_probe_runs_a_read_and_agrees_with_ring_creation() {
    // Where a ring can be made on this kernel, the opcodes zring uses are
    // there and a read runs through it; where not, the probe says so.
    let ring = IoUring::new(2);
    assert_eq!(probe().is_ok(), ring.is_ok(), "probe {:?}, ring {:?}", probe(), ring.err());
    assert_eq!(uring_available().is_ok(), ring.is_ok());
}

fn backends() -> Vec<BackendKind> {
    let mut v = vec![BackendKind::Pread];
    match uring_available() {
        Ok(()) => v.push(BackendKind::Uring),
        Err(e) if crate::env::require_uring() => {
            panic!("io_uring required: {e}")
        }
        Err(e) => eprintln!("skipping io_uring: {e}"),
    }
    v
}

#[test]
fn slab_reads_take_their_slabs_at_submission_and_arrive_whole() {
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    f.write_all(&data).unwrap();
    for b in backends() {
        // More reads than the limit lets fly at once; the last one ends
        // past the end of the file, after all it needs.
        let reads: Vec<SlabRead<'_>> = (0..40)
            .map(|k| {
                let offset = k as u64 * 50_000;
                let len = if k == 39 { 60_000 } else { 50_000 };
                SlabRead { fd: f.as_fd(), offset, len, need: 50_000 }
            })
            .collect();
        let mut got = vec![false; reads.len()];
        read_slabs(b, &reads, 3, &mut |_, len| Slab::take_aligned(len), &mut |i, slab| {
            let at = i * 50_000;
            assert_eq!(&slab.as_ref()[..50_000], &data[at..at + 50_000], "read {i} on {b:?}");
            got[i] = true;
        })
        .unwrap();
        assert!(got.iter().all(|&g| g), "every read completed on {b:?}");
        let short = [SlabRead { fd: f.as_fd(), offset: 1_990_000, len: 20_000, need: 20_000 }];
        let err = read_slabs(b, &short, 1, &mut |_, len| Slab::take_aligned(len), &mut |_, _| {
            panic!("a short read is no completion")
        })
        .unwrap_err();
        assert!(matches!(err.kind, ReqErrorKind::Eof { got: 10_000 }), "{err:?} on {b:?}");
    }
}

#[test]
fn reads_many_ranges_and_reports_eof() {
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    f.write_all(&data).unwrap();
    for b in backends() {
        // More requests than the ring holds, to exercise refill.
        let mut out = vec![0u8; 600 * 100];
        let reqs: Vec<Req> = (0..600)
            .map(|k| Req {
                fd: f.as_raw_fd(),
                offset: (k * 157) as u64,
                // SAFETY: each request gets its own 100-byte slice of `out`.
                ptr: unsafe { out.as_mut_ptr().add(k * 100) },
                len: 100,
                need: 100,
            })
            .collect();
        let mut seen = vec![false; reqs.len()];
        let mut idled = 0;
        // SAFETY: ranges are disjoint parts of `out`, untouched until the call returns.
        unsafe {
            run(b, Op::Read, &mut reqs.clone(), usize::MAX, &mut no_prepare, &mut |i| seen[i] = true, &mut || {
                idled += 1
            })
        }
        .unwrap();
        assert!(seen.iter().all(|s| *s), "{b:?}: a completion was not reported");
        assert_eq!(idled, 1, "{b:?}: the idle work runs exactly once");
        // SAFETY: no requests.
        unsafe { run(b, Op::Read, &mut [], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || idled += 1) }.unwrap();
        assert_eq!(idled, 2, "{b:?}: an empty batch still runs the idle work");
        for k in 0..600 {
            assert_eq!(&out[k * 100..k * 100 + 100], &data[k * 157..k * 157 + 100], "{b:?} req {k}");
        }
        let mut tail = vec![0u8; 200];
        let past = Req { fd: f.as_raw_fd(), offset: 99_950, ptr: tail.as_mut_ptr(), len: 200, need: 200 };
        // SAFETY: one request into `tail`.
        let err =
            unsafe { run(b, Op::Read, &mut [past], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }.unwrap_err();
        assert!(matches!(err.kind, ReqErrorKind::Eof { got: 50 }), "{b:?}: {err:?}");
        let ok = Req { need: 50, ..past };
        // SAFETY: as above.
        unsafe { run(b, Op::Read, &mut [ok], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }.unwrap();
        assert_eq!(&tail[..50], &data[99_950..]);
    }
}

#[test]
fn writes_land_and_bad_fds_fail() {
    for b in backends() {
        let f = tempfile::tempfile().unwrap();
        let mut src: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let reqs: Vec<Req> = (0..4)
            .map(|k| Req {
                fd: f.as_raw_fd(),
                offset: (k * 1024) as u64,
                // SAFETY: disjoint 1 KiB parts of `src`.
                ptr: unsafe { src.as_mut_ptr().add(k * 1024) },
                len: 1024,
                need: 1024,
            })
            .collect();
        // SAFETY: disjoint ranges of `src`, alive for the call.
        unsafe { run(b, Op::Write, &mut reqs.clone(), usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }.unwrap();
        let mut back = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert_eq!(back, src);
        let bad = Req { fd: -1, ..reqs[0] };
        // SAFETY: as above.
        let err =
            unsafe { run(b, Op::Write, &mut [bad], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }.unwrap_err();
        assert!(matches!(err.kind, ReqErrorKind::Os(_)), "{b:?}: {err:?}");
    }
}

#[test]
fn reads_into_a_registered_region_land_there_even_after_it_grows() {
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 241) as u8).collect();
    f.write_all(&data).unwrap();
    for b in backends() {
        let mut scratch = AlignedBuf::new();
        let mut ids = Vec::new();
        // The buffer grows twice (a new allocation each time, maybe at
        // the same address): each is registered before reads land in it.
        for (round, n) in [(0, 10), (1, 10), (2, 60), (3, 200)] {
            let (buf, region) = scratch.get_in(n * 4096);
            ids.push(region.id);
            let reads: Vec<ReadBuf<'_>> = buf
                .chunks_mut(4096)
                .enumerate()
                .map(|(k, piece)| {
                    let offset = ((k * 7 + round) % 240) as u64 * 4096;
                    ReadBuf { fd: f.as_fd(), offset, buf: piece, need: 4096 }
                })
                .collect();
            let mut seen = 0;
            read_batch(
                b,
                reads,
                Some(region),
                &mut |k, got| {
                    let at = ((k * 7 + round) % 240) * 4096;
                    assert_eq!(got, &data[at..at + 4096], "{b:?} round {round} read {k}");
                    seen += 1;
                },
                &mut || {},
            )
            .unwrap();
            assert_eq!(seen, n);
        }
        assert_eq!(ids[0], ids[1], "a buffer that did not grow keeps its id");
        assert!(ids[1] != ids[2] && ids[2] != ids[3], "a new allocation gets a new id: {ids:?}");
        if b == BackendKind::Uring {
            // Registered (or refused, under a small locked-memory limit)
            // as the ring's buffer: the last allocation, not a stale one.
            assert_eq!(REGISTERED.with(std::cell::Cell::get).0, ids[3]);
        }
    }
}

#[test]
fn aligned_buffers_are_aligned() {
    let mut a = AlignedBuf::new();
    for len in [1, 4096, 10_000] {
        let (s, _) = a.get_in(len);
        assert_eq!(s.as_ptr() as usize % ALIGN, 0);
        assert_eq!(s.len(), len);
    }
}
