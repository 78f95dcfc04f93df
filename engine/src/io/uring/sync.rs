//! The reference backend, and the fallback where io_uring is unavailable:
//! one blocking `pread` or `pwrite` per transfer.

use std::io;

use super::req::{Op, Prepare, Req, ReqError, ReqErrorKind};

/// The reference backend: one blocking system call per transfer.
///
/// # Safety
/// As for [`run`](super::run).
pub(super) unsafe fn run_sync(
    op: Op,
    reqs: &mut [Req],
    prepare: Prepare<'_>,
    on_done: &mut dyn FnMut(usize),
) -> Result<(), ReqError> {
    for (i, r) in reqs.iter_mut().enumerate() {
        if r.ptr.is_null() {
            r.ptr = prepare(i);
        }
        let mut done = 0usize;
        while done < r.len {
            // SAFETY: `ptr + done .. ptr + len` lies inside the request's range,
            // which the caller guarantees valid and unaliased during this call.
            let n = unsafe {
                let p = r.ptr.add(done);
                let off = (r.offset + done as u64) as libc::off_t;
                match op {
                    Op::Read => libc::pread(r.fd, p.cast(), r.len - done, off),
                    Op::Write => libc::pwrite(r.fd, p.cast_const().cast(), r.len - done, off),
                }
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) {
                    continue;
                }
                return Err(ReqError { req: i, kind: ReqErrorKind::Os(e) });
            }
            if n == 0 {
                if done >= r.need {
                    break;
                }
                return Err(ReqError { req: i, kind: ReqErrorKind::Eof { got: done } });
            }
            done += n as usize;
        }
        on_done(i);
    }
    Ok(())
}
