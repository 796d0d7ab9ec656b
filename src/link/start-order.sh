#!/bin/sh
# `make start-order`: writes src/link/start-order.txt, the functions the static
# musl `hive` runs at its per-turn and per-script starts, which src/link/link-musl
# places first in .text. Takes the binary `make musl` built (the linker also
# leaves it unstripped next to it), runs under callgrind `hive
# --version`, `hive mcp` and `hive bash-mcp` answering claude's start-up
# messages (initialize, initialized, tools/list) and `hive wake` storing a
# message in a real broker, and lists every function they executed. Needs
# valgrind. Run it again when start-up code changes or after a toolchain or
# dependency update: `make musl` says when the list has gone stale.
set -eu

cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "start-order: valgrind is needed" >&2; exit 1; }
target=x86_64-unknown-linux-musl
release=target/$target/release
linked=$(find $release/deps -samefile $release/hive | head -1)
hive=$PWD/$linked.unstripped
[ -x "$hive" ] || { echo "start-order: no $hive: run make musl (the linker must be src/link/link-musl)" >&2; exit 1; }

tmp=$(mktemp -d)
broker=
cleanup() {
    [ -n "$broker" ] && kill "$broker" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

printf '%s\n' \
    '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"start-order","version":"1"}}}' \
    '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
    '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' >"$tmp/handshake"

"$hive" broker --agents ana --state-dir "$tmp/state" --run-dir "$tmp/run" 2>"$tmp/broker.log" &
broker=$!
sock=$tmp/run/agents/ana/mcp.sock
i=0
while [ ! -S "$sock" ]; do
    i=$((i + 1))
    [ $i -le 100 ] || { cat "$tmp/broker.log" >&2; echo "start-order: no broker socket" >&2; exit 1; }
    sleep 0.1
done

# Each start twice: with RUST_LOG=warn (as the bench runs them) and with the
# default, info (as claude and scripts mostly do: the log lines' code runs too).
profile() {
    name=$1
    shift
    RUST_LOG=warn valgrind -q --tool=callgrind --demangle=no \
        --callgrind-out-file="$tmp/$name.warn.cg" "$@" <"$input" >/dev/null
    env -u RUST_LOG valgrind -q --tool=callgrind --demangle=no \
        --callgrind-out-file="$tmp/$name.info.cg" "$@" <"$input" >/dev/null 2>&1
}
input=/dev/null profile version "$hive" --version
HIVE_SOCKET=/nonexistent/hive.sock input=$tmp/handshake profile mcp "$hive" mcp
input=$tmp/handshake profile bash-mcp "$hive" bash-mcp --socket /nonexistent/bash.sock
HIVE_SOCKET=$sock input=/dev/null profile wake "$hive" wake --from start-order --body ping

# Every function named in the profiles (callgrind marks a recursion level with
# a 'N suffix) that the binary defines. Callgrind names musl's assembly
# (_start, memcpy, …) by address only and calls __libc_start_main
# "(below main)": those are looked up among the binary's functions.
for p in "$tmp"/*.cg; do
    sed -n "s/^c\{0,1\}fn=([0-9]*) //p" "$p"
done | sed "s/'[0-9]*\$//" | sort -u >"$tmp/named"
readelf -sW "$hive" | awk '$4 == "FUNC" && $7 != "UND" && NF == 8 { print $2, 0, $8, $3 }' >"$tmp/text"
sed -n 's/^0x\([0-9a-f]*\)$/\1 1 0x\1/p' "$tmp/named" >"$tmp/addresses"
# An address within the function before it (or past one of unknown size).
LC_ALL=C sort "$tmp/text" "$tmp/addresses" | awk '
    function hex(s,   i, n) { n = 0; for (i = 1; i <= length(s); i++) n = n * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1; return n }
    $2 == 0 { last = $3; from = hex($1); size = $4 + 0 }
    $2 == 1 && last != "" && (size == 0 || hex($1) < from + size) { print $3, last }' >"$tmp/resolved"
awk 'FNR == NR { at[$1] = $2; next }
     /^0x/ { if ($0 in at) print at[$0]; next }
     $0 == "(below main)" { print "__libc_start_main"; next }
     { print }' "$tmp/resolved" "$tmp/named" >"$tmp/executed"
awk '{ print $3 }' "$tmp/text" | sort -u >"$tmp/defined"
# _Exit ends the process in its own exit_group, before callgrind records it.
echo _Exit >>"$tmp/executed"
awk 'FNR == NR { defined[$1] = 1; next } $0 in defined' "$tmp/defined" "$tmp/executed" \
    | LC_ALL=C sort -u >"$tmp/names"

{
    echo "# Written by src/link/start-order.sh (make start-order), read by src/link/link-musl:"
    echo "# the functions hive --version, hive mcp, hive bash-mcp and hive wake ran"
    echo "# (with RUST_LOG=warn and with the default, info),"
    echo "# $(wc -l <"$tmp/names") names, sorted (the order within the group matters little)."
    cat "$tmp/names"
} >src/link/start-order.txt
echo "start-order: $(wc -l <"$tmp/names") functions written to src/link/start-order.txt"
