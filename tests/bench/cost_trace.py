#!/usr/bin/env python3
"""Writes tests/bench/cost-trace.jsonl, the cost bench's recorded week of one
agent's mail (tests/bench/cost_bench.rs replays it). Seeded: running it again
writes the same file.

Each line is one message: {"t": seconds since the trace's start, "from":
"operator", "body": "[mNNNN] ..."}. The week is 7 days of bursts (1 or 2 a day,
5 to 20 messages each, 10 to 90 s apart) separated by idle gaps from minutes
to hours; the bodies are 2 to 6 KiB of words, so the context of an agent
that keeps them grows past the harness's watermarks within the week."""

import json
import random
import sys

SEED = 42
DAY = 86400
WORDS = (
    "deploy build cache queue review branch merge release note ticket owner "
    "metric alert latency budget schema index migration backup restore shard "
    "replica config secret rotate token invoice customer report draft summary "
    "incident timeline root cause action item follow up blocked waiting ready "
    "test flaky green red retry timeout window quota limit scale node disk"
).split()


def body(rng, n):
    size = rng.randint(2048, 6144)
    words = []
    length = 0
    while length < size:
        w = rng.choice(WORDS)
        words.append(w)
        length += len(w) + 1
    return f"[m{n:04d}] " + " ".join(words)


def main():
    rng = random.Random(SEED)
    out = []
    n = 0
    for day in range(7):
        # Bursts start between 07:00 and 22:00; gaps between them range from
        # a few minutes (a warm cache) to hours.
        bursts = rng.choice([1, 2, 2])
        t = day * DAY + rng.randint(7 * 3600, 10 * 3600)
        for b in range(bursts):
            size = min(20, 5 + int(rng.expovariate(1 / 4)))
            for _ in range(size):
                n += 1
                out.append({"t": t, "from": "operator", "body": body(rng, n)})
                t += rng.randint(10, 90)
            gap = rng.choice([180, 240, 900, 1800, 2700, 5400, 3 * 3600, 5 * 3600])
            t += gap + rng.randint(0, 120)
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/bench/cost-trace.jsonl"
    with open(path, "w") as f:
        for m in out:
            f.write(json.dumps(m, separators=(",", ":")) + "\n")
    print(f"{path}: {len(out)} messages over {out[-1]['t'] / 3600:.1f} h", file=sys.stderr)


main()
