//! A loader's inputs: named streams of records, and the weighted sources
//! of a mixture.

use std::sync::Arc;

use crate::source::Source;

/// One named input of a loader. Every stream is gathered at the same indices,
/// so record `i` of each stream lines up: an image stream and a label stream
/// of the same length make (image, label) samples.
#[derive(Clone)]
pub struct Stream {
    /// The name of the stream's column in each [`Batch`](crate::Batch).
    pub name: String,
    /// Where the stream's records come from.
    pub source: Arc<dyn Source>,
}

impl Stream {
    /// A stream called `name` over `source`.
    pub fn new(name: impl Into<String>, source: Arc<dyn Source>) -> Self {
        Stream { name: name.into(), source }
    }
}

/// One source of a mixture ([`Loader::new_mixture`](crate::Loader::new_mixture)): its streams (the
/// same names and layouts in every source) and its weight, any positive
/// number (the weights are normalised to sum to 1).
#[derive(Clone, Debug)]
pub struct MixSource {
    /// The source's share of every batch, relative to the others.
    pub weight: f64,
    /// The source's streams, all of the same length.
    pub streams: Vec<Stream>,
}

impl MixSource {
    /// A source of `weight` over `streams`.
    pub fn new(weight: f64, streams: Vec<Stream>) -> Self {
        MixSource { weight, streams }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("name", &self.name)
            .field("len", &self.source.len())
            .field("layout", &self.source.layout())
            .finish()
    }
}
