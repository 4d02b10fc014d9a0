#!/usr/bin/env python3
"""A metadata load like mdtest -F: in DIR/<pid>/, create (open O_CREAT + close),
stat and unlink one file after another for SECONDS, timing every call.

Prints one JSON line: calls made, calls per second, and the median and 99th
percentile of the calls' service times (open, close, stat and unlink each count as
one call: what the stage counts and times). Used by scripts/bench-realfs.sh; runs
under `padll run` or without it.

usage: metadata-load.py DIR SECONDS
"""
import json
import os
import sys
import time


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: metadata-load.py DIR SECONDS")
    try:
        seconds = float(sys.argv[2])
    except ValueError:
        sys.exit(f"metadata-load.py: SECONDS must be a number, got '{sys.argv[2]}'")
    if not seconds > 0:
        sys.exit(f"metadata-load.py: SECONDS must be positive, got '{sys.argv[2]}'")
    directory = os.path.join(sys.argv[1], str(os.getpid()))
    os.makedirs(directory, exist_ok=True)
    clock = time.perf_counter_ns
    times = []
    start = clock()
    end = start + int(seconds * 1e9)
    i = 0
    now = start
    while now < end:
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
        times += (b - a, c - b, d - c, now - d)
        i += 1
    elapsed = (now - start) / 1e9
    os.rmdir(directory)
    times.sort()
    quantile = lambda q: times[min(len(times) - 1, int(q * len(times)))] / 1e3
    print(json.dumps({
        "pid": os.getpid(),
        "calls": len(times),
        "seconds": round(elapsed, 3),
        "calls_per_s": round(len(times) / elapsed, 1),
        "p50_us": round(quantile(0.5), 1),
        "p99_us": round(quantile(0.99), 1),
    }))


if __name__ == "__main__":
    main()
