//! `Loader::next_timeout`: a consumer waiting in slices (to look for signals
//! between them) gets each step exactly once, in order, and a timed-out wait
//! changes nothing.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use zring_loader::{Layout, Loader, LoaderConfig, Request, Source, SourceError, Stream};

/// A source whose gathers wait until the test opens the gate.
struct Gated {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gated {
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Source for Gated {
    fn len(&self) -> u64 {
        1000
    }
    fn layout(&self) -> Layout {
        Layout::Fixed { record_bytes: 8 }
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        for (i, slot) in req.indices.iter().zip(req.slots(self, dst)?) {
            slot.copy_from_slice(&i.to_le_bytes());
        }
        Ok(())
    }
    fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
        unreachable!("fixed layout")
    }
}

#[test]
fn timed_out_waits_deliver_every_step_once_in_order() {
    let source = Arc::new(Gated { open: Mutex::new(false), cv: Condvar::new() });
    let config = LoaderConfig { threads: 2, depth: 2, ..LoaderConfig::new(4) };
    let mut loader = Loader::new(vec![Stream::new("x", source.clone())], config).unwrap();
    for _ in 0..3 {
        assert!(loader.next_timeout(Duration::from_millis(20)).unwrap().is_none(), "nothing gathered yet");
    }
    assert_eq!(loader.state().sampler.step, 0, "a timed-out wait does not move the position");
    assert_eq!(loader.stats().steps_delivered, 0);
    source.release();
    let mut steps = Vec::new();
    while steps.len() < 6 {
        if let Some(batch) = loader.next_timeout(Duration::from_millis(20)).unwrap() {
            let first = u64::from_le_bytes(batch.record("x", 0).unwrap().try_into().unwrap());
            assert_eq!(first, batch.indices[0], "the batch holds its own indices");
            steps.push(batch.step);
        }
    }
    assert_eq!(steps, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(loader.stats().steps_delivered, 6);
    loader.close().unwrap();
    assert!(matches!(loader.next_timeout(Duration::from_millis(1)), Err(zring_loader::Error::Closed)));
}
