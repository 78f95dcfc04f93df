//! Recovery cuts what a crash left past the committed state; what the head
//! says was committed but is missing is reported, and nothing is changed.

use zring_engine::{Codec, Error, Store};

#[test]
fn a_short_table_is_reported_not_zero_extended() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = Store::builder(d.path()).codec(Codec::Raw).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 40]).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        s.append(&refs, None).unwrap();
        s.sync().unwrap();
    }
    let table = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("table-"))
        .unwrap();
    let len = std::fs::metadata(&table).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&table).unwrap().set_len(len - 32 * 3).unwrap();

    let Err(e) = Store::builder(d.path()).open_writable() else { panic!("a short table opened") };
    assert!(matches!(e, Error::Corrupted { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&*table.file_name().unwrap().to_string_lossy()) && msg.contains("missing"), "{msg}");
    assert_eq!(std::fs::metadata(&table).unwrap().len(), len - 32 * 3, "the table was not extended");
    assert!(matches!(Store::open(d.path()), Err(Error::Corrupted { .. })), "readers refuse it too");
}
