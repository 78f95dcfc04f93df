//! Workers lend their gathers the store's decode pool only while fewer
//! gathers run at once than there are cores.

use std::sync::{Arc, Mutex};

use zring_loader::{Layout, Loader, LoaderConfig, Request, Source, SourceError, Stream};

/// A source that records, for each gather, whether the loader let it use
/// the engine's decode pool.
struct Probe(Arc<Mutex<Vec<bool>>>);

impl Source for Probe {
    fn len(&self) -> u64 {
        64
    }
    fn layout(&self) -> Layout {
        Layout::Fixed { record_bytes: 1 }
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        self.0.lock().unwrap().push(req.fan_out);
        dst.fill(1);
        Ok(())
    }
    fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
        unreachable!("fixed layout")
    }
}

fn fan_out_seen(threads: usize, depth: usize) -> Vec<bool> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let config = LoaderConfig { threads, depth, ..LoaderConfig::new(8) };
    let mut loader = Loader::new(vec![Stream::new("x", Arc::new(Probe(Arc::clone(&seen))))], config).unwrap();
    for _ in 0..6 {
        loader.next().unwrap();
    }
    loader.close().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    seen
}

#[test]
fn workers_gather_alone_once_gathers_fill_the_cores() {
    if std::env::var_os("ZRING_LOADER_FAN_OUT").is_some() {
        eprintln!("ZRING_LOADER_FAN_OUT is set: it decides instead");
        return;
    }
    let cores = std::thread::available_parallelism().unwrap().get();
    // One gather at a time: the pool's threads would otherwise idle.
    if cores > 1 {
        assert!(fan_out_seen(1, 4).iter().all(|&f| f));
        assert!(fan_out_seen(4, 1).iter().all(|&f| f));
    }
    // As many gathers as cores: each worker decodes alone.
    assert!(fan_out_seen(cores, cores).iter().all(|&f| !f));
}
