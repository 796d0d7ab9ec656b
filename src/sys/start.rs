//! How the `hive` binary starts: its entry point in the static musl build
//! (`hive_start`, which does the static PIE's self-relocation before musl's
//! `_start`, faster than musl does), what runs before `main`'s own code in
//! place of std's runtime start ([`enter`]), and its global allocator (a
//! start-up arena in front of the system allocator, [`StartAlloc`]). All
//! three serve the processes claude and scripts start often and briefly —
//! `hive mcp`, `hive bash-mcp`, `hive wake` — whose whole run is a few
//! hundred microseconds; `docs/performance.md` ("Process start", "std's
//! runtime start, and claude's spawn") has what each saves. `main` installs
//! the allocator, enters through [`enter`] and closes the arena for the
//! daemons.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, CStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering::*};

// The entry point of the static musl binary (src/link/link-musl links with `-e
// hive_start -z pack-relative-relocs` when it is defined). Before musl's
// `_start` it does the static PIE's self-relocation, faster than musl would:
//
// 1. `madvise(MADV_POPULATE_WRITE)` from the page after `.text` (where the
//    writable segments start) to 36 KiB past `_edata`: the 35 or so pages of
//    `.data.rel.ro`, `.got` and `.data` the relocation writes, each otherwise
//    copied on a write fault of its own, and the first nine pages of `.bss`,
//    each otherwise zeroed on a fault of its own: musl's statics, which every
//    start writes, and the start of the allocator's arena (`StartAlloc`, the
//    first Rust static in `.bss`), which `hive mcp` fills five pages of
//    before its first answer. (A kernel older than 5.14 answers EINVAL, and
//    the faults happen as before; `.bss` is longer than the arena, so the
//    range never runs past the mapping.)
// 2. Applies the `DT_RELR` table (some 7,000 relative relocations packed in
//    2 KB, where `.rela.dyn` took 167 KB) a set bit at a time, then sets
//    `DT_RELRSZ` to 0 so that musl's `_start_c`, whose loop tests every bit
//    of every bitmap word (about 98k instructions here), finds nothing left.
//    Without a `DT_RELR` (a link without src/link/link-musl) it leaves the
//    relocation to musl.
//
// Nothing is relocated yet, so it is position-independent code that needs
// no stack; it leaves the stack pointer, which `_start` reads, as it was.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "musl"))]
std::arch::global_asm!(
    // Weak: a link that is no static PIE has no _DYNAMIC (then 0: step 2 is skipped).
    ".weak _DYNAMIC",
    ".globl hive_start",
    ".type hive_start,@function",
    "hive_start:",
    // 1. madvise(page after .text, up to _edata + 36 KiB, MADV_POPULATE_WRITE)
    "lea rdi, [rip + _etext]",
    "add rdi, 4095",
    "and rdi, -4096",
    "lea rsi, [rip + _edata + 36864]",
    "sub rsi, rdi",
    "mov edx, 23",
    "mov eax, 28",
    "syscall",
    // 2. r8 = DT_RELR (36), r9 = &DT_RELRSZ (35) in _DYNAMIC
    "lea rcx, [rip + _DYNAMIC]",
    "xor r8d, r8d",
    "xor r9d, r9d",
    "test rcx, rcx",
    "jz 9f",
    "2:",
    "mov rax, [rcx]",
    "test rax, rax",
    "jz 4f",
    "cmp rax, 36",
    "jne 3f",
    "mov r8, [rcx + 8]",
    "3:",
    "cmp rax, 35",
    "jne 5f",
    "lea r9, [rcx + 8]",
    "5:",
    "add rcx, 16",
    "jmp 2b",
    "4:",
    "test r9, r9",
    "jz 9f",
    // r10 = load base, r8 = the table, r11 = its end, rdx = next address
    "lea r10, [rip + __ehdr_start]",
    "add r8, r10",
    "mov r11, [r9]",
    "add r11, r8",
    "xor edx, edx",
    "6:",
    "cmp r8, r11",
    "jae 8f",
    "mov rax, [r8]",
    "add r8, 8",
    "test al, 1",
    "jnz 7f",
    // an address: relocate it, the next bitmap starts after it
    "lea rdx, [r10 + rax]",
    "add [rdx], r10",
    "add rdx, 8",
    "jmp 6b",
    // a bitmap of the 63 words from rdx: relocate each one whose bit is set
    "7:",
    "shr rax, 1",
    "bsf rcx, rax",
    "jz 11f",
    "10:",
    "add [rdx + rcx * 8], r10",
    "lea rsi, [rax - 1]",
    "and rax, rsi",
    "bsf rcx, rax",
    "jnz 10b",
    "11:",
    "add rdx, 504",
    "jmp 6b",
    "8:",
    "mov qword ptr [r9], 0",
    "9:",
    "jmp _start",
);

/// The binary's `main` past libc's start, in place of std's runtime start
/// (the binary is `#![no_main]`): it does what std would do before and
/// after `main` that hive relies on, and leaves out what it does not use.
///
/// Kept, as std does them: a standard descriptor (0, 1, 2) that is closed
/// is opened on `/dev/null`, so no file hive opens later takes its number
/// and receives what was meant for the terminal (one `poll`); `SIGPIPE` is
/// ignored, so a write to a closed pipe or socket is an `EPIPE` error
/// (children still start with it at its default: std's spawn resets it);
/// a panic that reaches `main` exits with 101 after the panic hook printed
/// it; `std::process::exit` at the end flushes standard output.
///
/// Left out: std's stack-overflow handler (a `sigaltstack` mapped for the
/// main thread and for every thread std starts, with its guard page, and
/// the `SIGSEGV` and `SIGBUS` handlers: eleven system calls at every start
/// and four at every thread's), which only turns the crash of a stack
/// overflow into a message before the abort — an overflow is still a
/// `SIGSEGV` that ends the process. And the main thread's name, so a panic
/// on it is reported from thread `<unnamed>`. `std::env::args` is empty on
/// musl without std's start: `main` takes the arguments from here.
///
/// # Safety
/// `argv` must point to `argc` pointers to NUL-terminated strings, as libc
/// hands them to `main`.
pub unsafe fn enter(
    argc: c_int,
    argv: *const *const c_char,
    main: fn(Vec<OsString>) -> u8,
) -> c_int {
    standard_fds();
    // SAFETY: signal(2) with SIG_IGN installs no handler code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let args = (0..usize::try_from(argc).unwrap_or(0))
        // SAFETY: the caller's promise: argc pointers to C strings.
        .map(|i| unsafe { CStr::from_ptr(*argv.add(i)) })
        .map(|a| std::ffi::OsStr::from_bytes(a.to_bytes()).to_os_string())
        .collect();
    let code = std::panic::catch_unwind(|| main(args)).unwrap_or(101);
    std::process::exit(code.into())
}

/// Opens `/dev/null` on each of the standard descriptors that is closed, as
/// std's runtime start does (and aborts, as it does, when that fails: the
/// process could not keep its own files apart from its output).
fn standard_fds() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    let reopen = || {
        // SAFETY: open(2) of a constant C string; the descriptor is kept.
        if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR, 0) } == -1 {
            // SAFETY: abort(3) has no preconditions.
            unsafe { libc::abort() }
        }
    };
    // SAFETY: poll(2) on an array of three pollfd it owns.
    while unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } == -1 {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // A descriptor limit of 0 or no memory: one descriptor at a time.
            Some(libc::EINVAL | libc::EAGAIN | libc::ENOMEM) => {
                for fd in 0..3 {
                    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags.
                    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
                    {
                        reopen();
                    }
                }
                return;
            }
            // SAFETY: abort(3) has no preconditions.
            _ => unsafe { libc::abort() },
        }
    }
    for fd in fds {
        if fd.revents & libc::POLLNVAL != 0 {
            reopen();
        }
    }
}

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
// In this order (`repr(C)`): `next` on the page before the arena, which
// `hive_start` populates with the arena's first pages, rather than on a page
// of its own after it (two faults at every start, a read and then a write).
#[repr(C)]
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
