#!/usr/bin/env python3
"""Where a wake's time goes between the broker and claude's start, thread by
thread, from the scheduler's own record of the wake → spawn bench
(`make wake-path`, which runs `perf sched record -a` around
`make bench`'s `--only latency` and feeds `perf script` to this).

For every claude the bench's harnesses spawn (hive's, the floor's and the
floor's with a hand-over between two threads), it walks back from the spawn
through the wake-ups that led to it and splits the path into:

  hub → reader   the broker's hub wakes the thread parked on `recv_next`,
                 until that thread runs;
  reader         it reads the answer, until it wakes the spawning thread
                 (hive: the poller waking the turn loop) or spawns itself;
  hop            the spawning thread woken, until it runs;
  spawner        it runs until the clone (its own work, the pipes, the clone);
  exec           the clone until the child runs as claude (`claude-stamp`):
                 the child's set-up, `execve`, and, when the kernel started
                 the child on the other CPU, waking that CPU.

It prints each segment's median, p90, p99 and slowest per harness, how often
the child started on another CPU than its parent's, and the slowest wakes
whole, so a slow sample shows which thread waited. Reads `perf script -F
trace:comm,pid,tid,cpu,time,event,trace` on stdin (or the file named first).
"""

import re
import statistics
import sys

LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)$")
CHILD = "claude-stamp"
SEGMENTS = ["hub → reader", "reader", "hop", "spawner", "exec", "total"]


def events(lines):
    out = []
    for line in lines:
        m = LINE.match(line)
        if m:
            comm, pid, tid, cpu, t, name, rest = m.groups()
            out.append((float(t), comm, int(pid), int(tid), int(cpu), name, rest))
    return out


def woken_pid(rest):
    m = re.search(r" pid=(\d+) ", rest + " ")
    return int(m.group(1)) if m else None


def last_waking(ev, target, before):
    """The index of the last `sched_waking` of thread `target` at or before
    index `before`, or None."""
    for j in range(before, -1, -1):
        if ev[j][5] == "sched:sched_waking" and woken_pid(ev[j][6]) == target:
            return j
    return None


def switch_in(ev, target, lo, hi):
    """When thread `target` first ran between indexes `lo` and `hi` (the
    time of `lo` if the record shows no switch to it: it was running)."""
    for e in ev[lo : hi + 1]:
        if e[5] == "sched:sched_switch" and f"next_pid={target} " in e[6] + " ":
            return e[0]
    return ev[lo][0]


def child_cpu(ev, i, child):
    """The CPU the kernel put new task `child` on, from the `sched_wakeup_new`
    just after its fork at index `i`."""
    for e in ev[i : i + 50]:
        if e[5] == "sched:sched_wakeup_new" and woken_pid(e[6]) == child:
            return int(re.search(r"target_cpu=(\d+)", e[6]).group(1))
    return None


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    ev = events(src)
    # When each claude first ran as claude (after its `execve`).
    first = {}
    for t, comm, pid, tid, cpu, name, rest in ev:
        if comm == CHILD and tid not in first:
            first[tid] = t
    results = {}
    for i, (t, comm, pid, spawner, cpu, name, rest) in enumerate(ev):
        if name != "sched:sched_process_fork":
            continue
        child = int(re.search(r"child_pid=(\d+)", rest).group(1))
        if child not in first:
            continue
        w = last_waking(ev, spawner, i)
        if w is None:
            continue
        if ev[w][1] == "hub":
            # The spawner read the answer itself (the floor): no hop.
            hub_at, reader_in = ev[w][0], switch_in(ev, spawner, w, i)
            woke_spawner = spawner_in = t
            label = comm
        else:
            reader = ev[w][3]
            h = last_waking(ev, reader, w)
            if h is None or ev[h][1] != "hub":
                continue
            hub_at, reader_in = ev[h][0], switch_in(ev, reader, h, w)
            woke_spawner, spawner_in = ev[w][0], switch_in(ev, spawner, w, i)
            label = f"{comm} ({ev[w][1]} → {comm})"
        if t - hub_at > 0.05:
            continue  # not a wake's path (a spawn long after the last wake-up)
        seg = {
            "hub → reader": reader_in - hub_at,
            "reader": woke_spawner - reader_in,
            "hop": spawner_in - woke_spawner,
            "spawner": t - spawner_in,
            "exec": first[child] - t,
            "total": first[child] - hub_at,
        }
        seg["other cpu"] = child_cpu(ev, i, child) not in (None, cpu)
        results.setdefault(label, []).append(seg)
    if not results:
        sys.exit("wake_path: no spawn of claude-stamp after a wake-up by the hub in this record")
    for label, rows in sorted(results.items()):
        print(f"{label}: {len(rows)} wakes (ms)")
        for s in SEGMENTS:
            v = sorted(r[s] * 1e3 for r in rows)
            if not any(v):
                continue
            print(
                f"  {s:13s} median {statistics.median(v):6.3f}  p90 {v[int(len(v) * .9)]:6.3f}"
                f"  p99 {v[min(len(v) - 1, int(len(v) * .99))]:6.3f}  slowest {v[-1]:6.3f}"
            )
        other = [r for r in rows if r["other cpu"]]
        same = [r for r in rows if not r["other cpu"]]
        if other and same:
            print(
                f"  claude started on another CPU than its parent's: {len(other)} of {len(rows)};"
                f" exec median {statistics.median(r['exec'] for r in other) * 1e3:.3f} ms there,"
                f" {statistics.median(r['exec'] for r in same) * 1e3:.3f} ms on the same"
            )
        for r in sorted(rows, key=lambda r: -r["total"])[:3]:
            print("  slow wake: " + ", ".join(f"{s} {r[s] * 1e3:.3f}" for s in SEGMENTS))


if __name__ == "__main__":
    main()
