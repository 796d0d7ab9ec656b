# hive — build, test, lint and benchmark. Installing toolchains and system
# packages is not done here: see .ci/run and the README.

CARGO ?= cargo
MUSL_TARGET := x86_64-unknown-linux-musl
MUSL_BIN := target/$(MUSL_TARGET)/release/hive
export CC_x86_64_unknown_linux_musl ?= musl-gcc

.PHONY: all build test lint musl musl-check musl-if-available bench bench-build bench-scale bench-cost wake-path soak fuzz clean

all: build

build:
	$(CARGO) build --release

## Every test: unit tests, integration tests against real hive processes. The
## static musl binary is built first when its toolchain is installed, so
## tests/release.rs runs it alone in an empty root.
test: musl-if-available
	$(CARGO) test --all-targets

musl-if-available:
	@if $(MAKE) -s musl-check >/dev/null 2>&1; then $(MAKE) --no-print-directory musl; \
	else echo "make test: no musl toolchain, tests/release.rs will skip (see make musl-check)"; fi

## The crash-loop suite at length: HIVE_SOAK_CYCLES kill cycles (default 1000);
## HIVE_SOAK_SEED=N replays a run. Prints the summary table.
HIVE_SOAK_CYCLES ?= 1000
soak:
	HIVE_SOAK_CYCLES=$(HIVE_SOAK_CYCLES) $(CARGO) test --release --test soak -- --nocapture 2>&1 \
	  | grep -v '^\[\|^hive broker'

## Each cargo-fuzz target for FUZZ_SECS seconds (nightly, `cargo install
## cargo-fuzz`). The corpus grows in tests/fuzz/corpus (only seed-* is committed);
## a crash lands in tests/fuzz/artifacts: copy it to tests/fuzz/regressions/TARGET/.
FUZZ_SECS ?= 60
FUZZ_TARGETS := wire jsonrpc classify prompt web
fuzz:
	@for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t for $(FUZZ_SECS)s"; \
	  (cd tests/fuzz && ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0 cargo +nightly fuzz run --fuzz-dir . $$t -- \
	    -max_total_time=$(FUZZ_SECS) -detect_leaks=0 -print_final_stats=1 2>&1 \
	    | grep -E 'stat::number_of_executed_units|SUMMARY|panicked|ERROR') || exit 1; \
	done

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

musl-check:
	@rustup target list --installed 2>/dev/null | grep -qx '$(MUSL_TARGET)' || { \
	  echo "make musl: the Rust target $(MUSL_TARGET) is missing; install it with:"; \
	  echo "    rustup target add $(MUSL_TARGET)"; exit 1; }
	@command -v musl-gcc >/dev/null || { \
	  echo "make musl: musl-gcc is missing (needed to build the bundled sqlite); install it with:"; \
	  echo "    apt-get install musl-tools"; exit 1; }

## A static x86_64 musl `hive` at $(MUSL_BIN).
musl: musl-check
	$(CARGO) build --release --target $(MUSL_TARGET) --bin hive
	@ls -l $(MUSL_BIN)

## Benchmarks, printed as ratios against baselines run side by side, and the
## goals of issues 19 and 42 at the end (the scale rows run a `hive up` of
## BENCH_AGENTS agents, 1000, and watch it idle BENCH_IDLE_SECS, 300). The
## MCP servers compared with `hive mcp` (the floor and an rmcp 1.7 server)
## are their own package with their own lockfile (tests/bench/servers), built
## here only.
BENCH_SERVERS := target/bench-servers/$(MUSL_TARGET)/release
BENCH := $(CARGO) bench --bench hive -- \
	  --hive $(MUSL_BIN) --empty target/$(MUSL_TARGET)/release/examples/empty \
	  --floor $(BENCH_SERVERS)/mcp-floor --rmcp $(BENCH_SERVERS)/mcp-rmcp \
	  --wake-floor $(BENCH_SERVERS)/wake-floor --turn-floor $(BENCH_SERVERS)/turn-floor \
	  --cycle-floor $(BENCH_SERVERS)/cycle-floor --claude-stamp $(BENCH_SERVERS)/claude-stamp \
	  --agents $(BENCH_AGENTS) --idle-secs $(BENCH_IDLE_SECS)
BENCH_AGENTS ?= 1000
BENCH_IDLE_SECS ?= 300
bench: bench-build
	$(BENCH)
	$(MAKE) --no-print-directory bench-cost

## The cost bench (issue 42): a recorded week of one agent's mail
## (tests/bench/cost-trace.jsonl) through `hive serve` and through the naive
## `claude -p --continue` loop, the real CLI against the fake API's prompt-cache
## model; dollars and tokens by kind, per day, hive/naive ratios, then each
## lever off (HIVE_COST_LEVERS=0 skips those, =all adds one message per turn).
## About 12 minutes on the 2-core VM. Needs the real CLI (.ci/run).
bench-cost:
	HIVE_REQUIRE_REAL_CLAUDE=1 $(CARGO) test --test cost_bench -- --ignored --nocapture cost_bench

## The scale rows alone (tests/bench/scale.rs).
bench-scale: bench-build
	$(BENCH) --only scale

bench-build: musl
	$(CARGO) build --release --target $(MUSL_TARGET) --example empty
	$(CARGO) build --release --target $(MUSL_TARGET) --locked \
	  --manifest-path tests/bench/servers/Cargo.toml --target-dir target/bench-servers
	$(CARGO) bench --bench hive --no-run

## Where a wake's time goes between the broker and claude's start, thread by
## thread: the wake → spawn bench alone under `perf sched record -a` (needs
## perf, and root or kernel.perf_event_paranoid <= -1), read by
## tests/bench/wake_path.py.
wake-path: bench-build
	perf sched record -a -o target/wake-path.data -- $(BENCH) --only latency
	perf script -i target/wake-path.data -F trace:comm,pid,tid,cpu,time,event,trace \
	  | python3 tests/bench/wake_path.py

clean:
	$(CARGO) clean
