//! One positional transfer of a batch, which way it goes, and why it
//! failed.

use std::io;
use std::os::fd::RawFd;

/// Direction of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

/// One positional transfer of `len` bytes at `ptr` to or from `fd` at `offset`.
/// A read may stop early at end of file once `need` bytes have arrived (O_DIRECT
/// reads round their length up past the end of a file); short of `need`, the
/// file is shorter than the table says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Req {
    pub fd: RawFd,
    pub offset: u64,
    pub ptr: *mut u8,
    pub len: usize,
    pub need: usize,
}

/// Why request `req` failed.
#[derive(Debug)]
pub(crate) struct ReqError {
    pub req: usize,
    pub kind: ReqErrorKind,
}

#[derive(Debug)]
pub(crate) enum ReqErrorKind {
    /// End of file after `got` of the `need` bytes.
    Eof { got: usize },
    /// The operating system refused the transfer.
    Os(io::Error),
}

/// Gives a request with a null pointer its buffer at its first submission
/// ([`run`](super::run)).
pub(super) type Prepare<'p> = &'p mut dyn FnMut(usize) -> *mut u8;

/// For batches whose every request has its buffer.
pub(super) fn no_prepare(i: usize) -> *mut u8 {
    unreachable!("request {i} was given a buffer")
}
