//! The `hive` binary's global allocator, [`StartAlloc`]: a start-up arena
//! in front of the system allocator, for the processes claude and scripts
//! start often and briefly — `hive mcp`, `hive bash-mcp`, `hive wake` — so
//! that such a start asks the kernel for no heap. `main` installs it and
//! closes the arena for the daemons.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// The arena's size: what a start needs, with room to spare.
const SIZE: usize = 256 << 10;
/// Larger blocks (and stricter alignments) go to the system allocator.
const MAX_BLOCK: usize = 64 << 10;
const MAX_ALIGN: usize = 4096;

#[repr(C, align(4096))]
struct Arena(UnsafeCell<[u8; SIZE]>);

/// The allocator of the `hive` binary. Allocations are carved in order from an
/// arena in `.bss` until it is used up, then made by the system allocator
/// (musl's mallocng in the static build). A short process — `hive mcp` or `hive
/// bash-mcp` answering claude's start-up messages, `hive wake` — so never asks
/// the kernel for heap: mallocng maps a group of slots per size class as it
/// goes and unmaps each as soon as it is empty (14 `brk`/`mmap`/`munmap` in a
/// `hive mcp` start, and their faults; docs/performance.md). Freeing or
/// resizing the arena's newest block gives its space back or grows it in place
/// (a growing `Vec` or `String`); other arena blocks are never reused, so the
/// daemons close the arena once their command line is parsed (`main`).
pub struct StartAlloc {
    /// The offset of the arena's first free byte.
    next: AtomicUsize,
    arena: Arena,
}

// SAFETY: the arena's bytes are handed out in disjoint blocks, each one
// claimed by a compare-and-swap of `next`.
unsafe impl Sync for StartAlloc {}

impl Default for StartAlloc {
    fn default() -> StartAlloc {
        StartAlloc::new()
    }
}

impl StartAlloc {
    pub const fn new() -> StartAlloc {
        StartAlloc {
            next: AtomicUsize::new(0),
            arena: Arena(UnsafeCell::new([0; SIZE])),
        }
    }

    /// From now on every allocation is the system allocator's. Blocks
    /// already carved stay valid and are freed as arena blocks, and the
    /// arena's pages not yet touched are never touched.
    pub fn close(&self) {
        // Past the end, where no block ends: nothing is carved or given back.
        self.next.store(SIZE + 1, Release);
    }

    fn base(&self) -> usize {
        self.arena.0.get() as usize
    }

    /// The offset of `p` in the arena, if it is an arena block.
    fn offset(&self, p: *mut u8) -> Option<usize> {
        (p as usize).checked_sub(self.base()).filter(|&o| o < SIZE)
    }

    /// A block for `layout` from the arena; null when it does not fit.
    fn carve(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_BLOCK || layout.align() > MAX_ALIGN {
            return ptr::null_mut();
        }
        let base = self.base();
        let mut next = self.next.load(Acquire);
        loop {
            let start = (base + next).next_multiple_of(layout.align()) - base;
            let end = start + layout.size();
            if end > SIZE {
                return ptr::null_mut();
            }
            match self.next.compare_exchange_weak(next, end, AcqRel, Acquire) {
                Ok(_) => return (base + start) as *mut u8,
                Err(now) => next = now,
            }
        }
    }
}

unsafe impl GlobalAlloc for StartAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.carve(layout);
        if p.is_null() {
            System.alloc(layout)
        } else {
            p
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = self.carve(layout);
        if p.is_null() {
            System.alloc_zeroed(layout)
        } else {
            // A block given back and carved again is not zero any more.
            ptr::write_bytes(p, 0, layout.size());
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match self.offset(p) {
            // The newest block gives its space back; any other stays used.
            Some(off) => {
                let _ = self
                    .next
                    .compare_exchange(off + layout.size(), off, AcqRel, Relaxed);
            }
            None => System.dealloc(p, layout),
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(off) = self.offset(p) else {
            return System.realloc(p, layout, new_size);
        };
        // The newest block grows or shrinks where it is.
        if new_size <= MAX_BLOCK
            && off + new_size <= SIZE
            && self
                .next
                .compare_exchange(off + layout.size(), off + new_size, AcqRel, Relaxed)
                .is_ok()
        {
            return p;
        }
        // Another block shrinks where it is, its tail unused.
        if new_size <= layout.size() {
            return p;
        }
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let q = self.alloc(new_layout);
        if !q.is_null() {
            ptr::copy_nonoverlapping(p, q, layout.size());
            self.dealloc(p, layout);
        }
        q
    }
}
