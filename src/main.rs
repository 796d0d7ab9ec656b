//! The `hive` binary: parses the command line (`cli`), resolves each
//! command's flags against the environment and the defaults into what its
//! module takes, and dispatches to the library. Usage errors exit with 2,
//! failures with 1.

use hyperhive::cli::{self, BashDaemonArgs, BrokerArgs, Cmd, MatrixBridgeArgs};
use hyperhive::proto::{paths, HYPERHIVE_REV};
use hyperhive::sys::env::Env;
use hyperhive::{bash, bridge, broker, fleet, harness, mcp, ops, sys};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static ALLOC: start_alloc::StartAlloc = start_alloc::StartAlloc::new();

// The entry point of the static musl binary (tools/link-musl links with `-e
// hive_start -z pack-relative-relocs` when it is defined). Before musl's
// `_start` it does the static PIE's self-relocation, faster than musl would:
//
// 1. `madvise(MADV_POPULATE_WRITE)` from the page after `.text` (where the
//    writable segments start) to `_edata`: the 35 or so pages of
//    `.data.rel.ro`, `.got` and `.data` the relocation writes, each otherwise
//    copied on a write fault of its own. (A kernel older than 5.14 answers
//    EINVAL, and the faults happen as before.)
// 2. Applies the `DT_RELR` table (some 7,000 relative relocations packed in
//    2 KB, where `.rela.dyn` took 167 KB) a set bit at a time, then sets
//    `DT_RELRSZ` to 0 so that musl's `_start_c`, whose loop tests every bit
//    of every bitmap word (about 98k instructions here), finds nothing left.
//    Without a `DT_RELR` (a link without tools/link-musl) it leaves the
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
    // 1. madvise(page after .text, up to _edata, MADV_POPULATE_WRITE)
    "lea rdi, [rip + _etext]",
    "add rdi, 4095",
    "and rdi, -4096",
    "lea rsi, [rip + _edata]",
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
mod start_alloc {
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

    pub struct StartAlloc {
        arena: Arena,
        /// The offset of the arena's first free byte.
        next: AtomicUsize,
    }

    // SAFETY: the arena's bytes are handed out in disjoint blocks, each one
    // claimed by a compare-and-swap of `next`.
    unsafe impl Sync for StartAlloc {}

    impl StartAlloc {
        pub const fn new() -> StartAlloc {
            StartAlloc {
                arena: Arena(UnsafeCell::new([0; SIZE])),
                next: AtomicUsize::new(0),
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
}

/// `hive broker`'s flags as the broker takes them.
fn broker_settings(a: BrokerArgs) -> broker::BrokerSettings {
    broker::BrokerSettings {
        state_dir: a.state_dir,
        run_dir: a.run_dir,
        agents: a.agents,
        config: a.config,
        durability: match a.durability {
            cli::Durability::Normal => broker::db::Durability::Normal,
            cli::Durability::Full => broker::db::Durability::Full,
        },
    }
}

/// The settings of `hive bash-daemon`: its flags, else the environment, else
/// the defaults.
fn bash_daemon_settings(a: BashDaemonArgs, env: &Env) -> bash::daemon::DaemonSettings {
    let state_dir = a
        .state_dir
        .unwrap_or_else(|| env.path_or("HIVE_STATE_DIR", paths::DEFAULT_STATE_DIR));
    let mut s = bash::daemon::DaemonSettings::read(state_dir, env);
    if let Some(p) = a.socket {
        s.socket = p;
    }
    if let Some(p) = a.agent_socket {
        s.agent_socket = p;
    }
    if let Some(p) = a.bash_env {
        s.bash_env = Some(p);
    }
    s
}

/// The settings of `hive matrix-bridge`: its flags, else the defaults under
/// `hive broker`'s; the rest from the environment.
fn bridge_settings(a: MatrixBridgeArgs, env: &Env) -> Result<bridge::BridgeSettings, String> {
    let socket = a
        .socket
        .unwrap_or_else(|| PathBuf::from(cli::BROKER_RUN_DIR).join(cli::BRIDGE_SOCKET));
    let state = a
        .state_dir
        .unwrap_or_else(|| PathBuf::from(cli::BROKER_STATE_DIR).join(cli::BRIDGE_STATE));
    bridge::BridgeSettings::read(socket, state, env)
}

/// Whether `cmd` is a daemon: it allocates from the system allocator from the
/// start, since the start-up arena's blocks are never reused and would only
/// add to its memory (the MCP servers, which live for a session of claude,
/// keep it).
fn daemon(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Broker(_) | Cmd::Up(_) | Cmd::Serve(_) | Cmd::BashDaemon(_) | Cmd::MatrixBridge(_)
    )
}

/// Whether `cmd` runs until stopped: those get every descriptor the hard
/// limit allows.
fn long_running(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Broker(_)
            | Cmd::Up(_)
            | Cmd::Serve(_)
            | Cmd::Mcp
            | Cmd::BashMcp(_)
            | Cmd::BashDaemon(_)
            | Cmd::MatrixBridge(_)
    )
}

/// Runs `cmd`; `Err` is a failure to report (exit 1).
fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Help(None) => print!("{}", cli::main_usage()),
        Cmd::Help(Some(name)) => print!("{}", cli::usage_of(name)),
        Cmd::Version => println!("hive {} ({})", env!("CARGO_PKG_VERSION"), HYPERHIVE_REV),
        Cmd::Up(a) => {
            let data = a
                .data
                .unwrap_or_else(|| PathBuf::from(cli::DEFAULT_DATA_DIR));
            match fleet::run(&data, a.config) {
                Err(fleet::UpError::MatrixLogin(e)) => {
                    // The operator fixes the fleet file's matrix section.
                    eprintln!("hive up: {e}");
                    std::process::exit(2);
                }
                Err(fleet::UpError::Run(e)) => return Err(e),
                Ok(()) => {}
            }
        }
        Cmd::Broker(a) => match broker::run(broker_settings(a)) {
            Err(broker::BrokerError::Config(e)) => {
                // A config that does not load is a usage error.
                eprintln!("hive: {e}");
                std::process::exit(2);
            }
            Err(broker::BrokerError::Run(e)) => return Err(e),
            Ok(()) => {}
        },
        Cmd::Serve(a) => harness::serve::run(&a.state_dir, &a.run_dir)?,
        Cmd::Mcp => std::process::exit(mcp::hyperhive::main()?),
        Cmd::Wake(a) => ops::wake(&a)?,
        Cmd::Send(a) => ops::send(&a)?,
        Cmd::Inbox(a) => ops::inbox(&a)?,
        Cmd::Agents(h) => ops::agents(&h)?,
        Cmd::Failed(a) => ops::failed(&a)?,
        Cmd::Retry(a) => ops::retry(&a.host, a.id)?,
        Cmd::Budget(a) => ops::budget(&a)?,
        Cmd::Questions(h) => ops::questions(&h)?,
        Cmd::Versions(h) => ops::versions(&h)?,
        Cmd::Answer(a) => ops::answer(&a)?,
        Cmd::CancelQuestion(a) => ops::cancel_question(&a.host, a.id)?,
        Cmd::Approvals(h) => ops::approvals(&h)?,
        Cmd::Approve(a) => ops::approve(&a.host, a.id)?,
        Cmd::Deny(a) => ops::deny(&a)?,
        Cmd::Lifecycle(what, a) => ops::lifecycle(what, &a)?,
        Cmd::Search(a) => ops::search(&a)?,
        Cmd::History(a) => ops::history(&a)?,
        Cmd::BashDaemon(a) => bash::daemon::run_command(bash_daemon_settings(a, &Env::process()))?,
        Cmd::BashMcp(a) => bash::mcp::run_server(bash::daemon::socket_or_env(a.socket))?,
        Cmd::EnvScript => print!("{}", bash::env_script::SCRIPT),
        Cmd::MatrixBridge(a) => match bridge::run(bridge_settings(a, &Env::process())?) {
            Err(bridge::BridgeError::Fatal(e)) => {
                // The Matrix login or the configuration: the operator fixes it.
                eprintln!("hive matrix-bridge: {e}");
                std::process::exit(2);
            }
            Err(bridge::BridgeError::Run(e)) => return Err(e),
            Ok(()) => {}
        },
    }
    Ok(())
}

fn main() -> ExitCode {
    // `hive up`'s re-exec into an agent's sandbox: hidden, and single-threaded.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == fleet::sandbox::SUBCOMMAND) {
        fleet::sandbox::run_command(args.collect());
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        // ureq's debug lines print request headers, tokens included: never.
        .filter_module("ureq", log::LevelFilter::Info)
        .filter_module("ureq::unit", log::LevelFilter::Info)
        .init();
    let cmd = match cli::parse(std::env::args_os().skip(1).collect()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hive: {}\n\n{}", e.message, e.usage);
            return ExitCode::from(2);
        }
    };
    if daemon(&cmd) {
        ALLOC.close();
    }
    if long_running(&cmd) {
        match sys::raise_nofile_limit() {
            Ok(n) => log::debug!("descriptor limit: {n}"),
            Err(e) => log::warn!("cannot raise the descriptor limit: {e}"),
        }
    }
    match run(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors may quote what an agent or the broker said.
            eprintln!("hive: {}", ops::printable(&e, true));
            ExitCode::FAILURE
        }
    }
}
