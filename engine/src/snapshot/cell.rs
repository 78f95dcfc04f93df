//! The published snapshot of one store handle ([`Cell`]): readers take the
//! current one, the writer (or a read-policy switch) publishes the next.

use super::Snapshot;
use std::sync::{Arc, RwLock};

/// The snapshot a handle's readers start from.
pub(crate) struct Cell(RwLock<Arc<Snapshot>>);

impl Cell {
    /// A cell publishing `snap`.
    pub fn new(snap: Snapshot) -> Cell {
        Cell(RwLock::new(Arc::new(snap)))
    }

    /// The snapshot published now.
    pub fn get(&self) -> Arc<Snapshot> {
        let _gate = crate::fork::enter();
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes `snap`: readers that start from now on read it; those under
    /// way keep theirs.
    pub fn publish(&self, snap: Snapshot) {
        let _gate = crate::fork::enter();
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
    }
}
