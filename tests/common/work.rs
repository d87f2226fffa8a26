//! Counting work instead of timing it: a global allocator wrapper that counts, per thread, the
//! allocations and the bytes allocated. A test binary that wants it declares
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: common::work::Counting<mimalloc::MiMalloc> = common::work::Counting(mimalloc::MiMalloc);
//! ```
//!
//! and wraps the code under test in [`measure`]. The counts do not depend on the machine's load
//! or on other tests running in parallel (each thread has its own), so a bound on them is
//! steady where a bound in milliseconds flakes; a super-linear algorithm shows up as
//! super-linear allocation (the pod clone per secret request that made 10,000 annotations take
//! seconds allocated the whole pod 10,000 times).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

/// Wraps an allocator, counting on the calling thread.
pub struct Counting<A>(pub A);

fn count(bytes: usize) {
    // `try_with`: the thread may be tearing down its locals.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get() + bytes as u64));
}

unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A growth counts as an allocation of the new size (what a copy would cost).
        count(new_size);
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) }
    }
}

/// Work done on this thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Work {
    pub allocations: u64,
    pub bytes: u64,
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} allocations, {:.1} MiB allocated",
            self.allocations,
            self.bytes as f64 / (1 << 20) as f64
        )
    }
}

/// The counters of this thread so far (meaningful only under [`Counting`]).
pub fn now() -> Work {
    Work {
        allocations: ALLOCATIONS.with(Cell::get),
        bytes: BYTES.with(Cell::get),
    }
}

/// Work done on this thread between `before` and now.
pub fn since(before: Work) -> Work {
    let after = now();
    Work {
        allocations: after.allocations - before.allocations,
        bytes: after.bytes - before.bytes,
    }
}

/// Runs `f` on this thread and returns what it allocated. Panics when the binary does not
/// count (nothing allocated at all), so a bound can never pass vacuously.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Work) {
    let before = now();
    let out = f();
    let work = since(before);
    assert!(
        work.allocations > 0,
        "no allocation counted: declare common::work::Counting as the #[global_allocator]"
    );
    (out, work)
}
