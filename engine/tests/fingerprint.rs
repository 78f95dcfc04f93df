//! Store fingerprints: what changes them (appends, deletes, other data,
//! another codec), what keeps them (compaction, reopening, a copy), and
//! stores whose head predates the field.

use std::path::Path;

use zring_engine::{Codec, Fingerprint, Store};

/// Record `i`: runs of equal bytes, so zstd stores fewer bytes than raw.
fn rec(i: u64) -> Vec<u8> {
    (0..200 + i % 13).map(|k| ((i + k / 50) % 251) as u8).collect()
}

fn append(s: &Store, range: std::ops::Range<u64>, codec: Codec) {
    let recs: Vec<Vec<u8>> = range.map(rec).collect();
    let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
    s.append(&refs, Some(codec)).unwrap();
}

fn build(dir: &Path, n: u64, codec: Codec) -> Fingerprint {
    let s = Store::builder(dir).codec(codec).create().unwrap();
    append(&s, 0..n, codec);
    s.sync().unwrap();
    s.fingerprint().unwrap()
}

fn reader(dir: &Path) -> Fingerprint {
    Store::open(dir).unwrap().fingerprint().unwrap()
}

#[test]
fn appends_deletes_and_other_data_change_it_compaction_keeps_it() {
    let d = tempfile::tempdir().unwrap();
    let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
    let fa = build(&a, 500, Codec::Zstd);
    assert_eq!(fa.records, 500);
    assert_eq!(reader(&a), fa, "a reader sees the writer's fingerprint");
    assert_eq!(build(&b, 500, Codec::Zstd), fa, "the same records give the same fingerprint");
    assert_ne!(build(&c, 500, Codec::Raw), fa, "another codec stores other bytes");

    let s = Store::builder(&a).open_writable().unwrap();
    append(&s, 500..501, Codec::Zstd);
    let unsynced = s.fingerprint().unwrap();
    assert_ne!(unsynced, fa, "an append changes it before the sync");
    s.sync().unwrap();
    assert_eq!(s.fingerprint().unwrap(), unsynced);
    assert_eq!(reader(&a), unsynced, "and the synced head carries it");

    s.delete(&[500]).unwrap();
    assert_eq!(s.fingerprint().unwrap(), fa, "deleting the appended record restores the records");
    s.delete(&[3]).unwrap();
    let deleted = s.fingerprint().unwrap();
    assert_eq!(deleted.records, 499);
    assert_ne!(deleted, fa);
    s.compact().unwrap();
    assert_eq!(s.fingerprint().unwrap(), deleted, "compaction keeps it");
    drop(s);
    assert_eq!(reader(&a), deleted);
}

/// Zeroes the head's content field (a head written before it existed) and
/// fixes the head's own checksum.
fn forget_content(dir: &Path) {
    let p = dir.join("head.zr");
    let mut b = std::fs::read(&p).unwrap();
    b[56..60].fill(0);
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&p, b).unwrap();
}

#[test]
fn a_head_without_the_field_gets_it_computed_then_stored() {
    let d = tempfile::tempdir().unwrap();
    let fp = build(d.path(), 300, Codec::Zstd);
    forget_content(d.path());
    assert_eq!(reader(d.path()), fp, "computed from the table");
    // A writer's next commit stores it, covering the old records too.
    let s = Store::builder(d.path()).open_writable().unwrap();
    append(&s, 300..310, Codec::Zstd);
    s.sync().unwrap();
    let want = s.fingerprint().unwrap();
    drop(s);
    let head = std::fs::read(d.path().join("head.zr")).unwrap();
    assert_ne!(head[56..60], [0; 4], "the sync stored the content");
    assert_eq!(reader(d.path()), want);
    let fresh = tempfile::tempdir().unwrap();
    assert_eq!(build(fresh.path(), 310, Codec::Zstd), want, "and it is the content of the same records");
}

/// A resumed run asks whether its store only grew: `extends` is true for
/// the same records and for more appended after them, false once any of
/// the earlier records was deleted or replaced (here: the same count, other
/// bytes at the end), and it holds across reopening and compaction.
#[test]
fn extends_tells_a_store_that_only_grew_from_one_that_changed() {
    let dir = tempfile::tempdir().unwrap();
    let saved = build(dir.path(), 100, Codec::Zstd);
    {
        let s = Store::builder(dir.path()).open_writable().unwrap();
        assert!(s.extends(saved).unwrap(), "the same records");
        append(&s, 100..130, Codec::Zstd);
        s.sync().unwrap();
        assert!(s.extends(saved).unwrap(), "30 more appended");
        s.compact_to(2).unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.len(), 130);
    assert!(s.extends(saved).unwrap(), "reopened and compacted");
    let grown = s.fingerprint().unwrap();
    assert!(!s.extends(Fingerprint { records: 131, ..grown }).unwrap(), "more records than the store holds");
    drop(s);
    let s = Store::builder(dir.path()).open_writable().unwrap();
    // Replace record 99 (delete it, append other bytes): 130 records again.
    s.delete(&[99]).unwrap();
    s.append(&[&[7u8; 300][..]], None).unwrap();
    s.sync().unwrap();
    assert_eq!(s.len(), 130);
    assert!(!s.extends(saved).unwrap(), "record 99 changed");
    assert!(!s.extends(grown).unwrap());
}
