//! The read path: a gather's request ([`request`]), its plan and transfers
//! ([`gather`]), the records it reads ([`item`]), those already in memory
//! ([`hot`]), and mode 3's block loads ([`blocks`]).

pub(crate) mod blocks;
pub(crate) mod gather;
pub(crate) mod hot;
pub(crate) mod item;
pub(crate) mod request;
