//! Staging and committing parts for the parts tests.
#![allow(dead_code)]

use std::path::Path;

use zring_engine::parts::{read_manifest, Mode, PartWriter, Request, Staged};
use zring_engine::Store;

/// Stages a part of `n` records (each its index's bytes) in `root`.
pub fn stage(root: &Path, n: u32, job: Option<&str>) -> Staged {
    let w = PartWriter::new(root, job).unwrap();
    let name = format!("p-{:032x}", rand_u128());
    let store = Store::builder(w.staging_path().join(&name)).create().unwrap();
    for i in 0..n {
        store.append(&[&i.to_le_bytes()[..]], None).unwrap();
    }
    store.sync().unwrap();
    drop(store);
    let (fp, _) = w.finish(&name).unwrap();
    Staged { name, records: fp.records, content: format!("{:08x}", fp.content) }
}

pub fn rand_u128() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    t ^ (u128::from(std::process::id()) << 64) ^ u128::from(N.fetch_add(1, Ordering::Relaxed)) << 96
}

pub fn req(root: &Path, parts: Vec<Staged>, mode: Mode) -> Request {
    Request { root: root.to_path_buf(), parts, mode }
}

pub fn listed(root: &Path) -> Vec<String> {
    read_manifest(root).unwrap().parts.into_iter().map(|p| p.dir).collect()
}
