#!/usr/bin/env python3
"""A metadata load like mdtest -F: in DIR/<pid>/, create (open O_CREAT + close),
stat and unlink one file after another for SECONDS, timing every call; as fast as it
can, or RATE files a second (a job with work to do between its calls).

Prints one JSON line: calls made, calls per second, and the median and 99th
percentile of the calls' times (open, close, stat and unlink each count as one call:
what the stage counts; under the stage a call's time includes any wait for tokens),
over the whole run and over the calls from its third second on (`…_from_2s_us`: after
a new job's first cycle, whose provisional share is the control plane's, not the
file system's). Used by scripts/bench-realfs.sh; runs
under `padll run` or without it.

usage: metadata-load.py DIR SECONDS [RATE]
"""
import json
import os
import sys
import time


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: metadata-load.py DIR SECONDS [RATE]")
    seconds = positive("SECONDS", sys.argv[2])
    rate = positive("RATE", sys.argv[3]) if len(sys.argv) == 4 else None
    directory = os.path.join(sys.argv[1], str(os.getpid()))
    os.makedirs(directory, exist_ok=True)
    clock = time.perf_counter_ns
    times = []
    steady = []
    start = clock()
    warm = start + 2_000_000_000
    end = start + int(seconds * 1e9)
    i = 0
    now = start
    while now < end:
        if rate is not None:
            due = start + int(i * 1e9 / rate)
            if due > now:
                time.sleep((due - now) / 1e9)
        path = f"{directory}/f{i}"
        a = clock()
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        b = clock()
        os.close(fd)
        c = clock()
        os.stat(path)
        d = clock()
        os.unlink(path)
        now = clock()
        calls = (b - a, c - b, d - c, now - d)
        times += calls
        if a >= warm:
            steady += calls
        i += 1
    elapsed = (now - start) / 1e9
    os.rmdir(directory)
    times.sort()
    steady.sort()

    def quantile(q, of=times):
        return of[min(len(of) - 1, int(q * len(of)))] / 1e3

    print(json.dumps({
        "pid": os.getpid(),
        "calls": len(times),
        "seconds": round(elapsed, 3),
        "calls_per_s": round(len(times) / elapsed, 1),
        "p50_us": round(quantile(0.5), 1),
        "p99_us": round(quantile(0.99), 1),
        "p50_from_2s_us": round(quantile(0.5, steady), 1) if steady else None,
        "p99_from_2s_us": round(quantile(0.99, steady), 1) if steady else None,
    }))


def positive(name, text):
    try:
        value = float(text)
    except ValueError:
        sys.exit(f"metadata-load.py: {name} must be a number, got '{text}'")
    if not value > 0:
        sys.exit(f"metadata-load.py: {name} must be positive, got '{text}'")
    return value


if __name__ == "__main__":
    main()
