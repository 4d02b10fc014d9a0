#!/usr/bin/env python3
"""What each call costs a MooseFS metadata server: N calls of each kind on the mount,
the master's own operation counters (`scripts/moosefs.sh ops PID`) read before and
after, printed as master requests per call (a Markdown table). Run inside
`scripts/moosefs.sh run -- …` (it sets MFS_MOUNT and MFS_PID); the figures back the
`weights` of etc/README.md.

usage: scripts/moosefs.sh run -- scripts/realfs/op-costs.py [N]
"""
import os
import subprocess
import sys

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
MOUNT = os.environ.get("MFS_MOUNT") or sys.exit("op-costs.py: run it inside scripts/moosefs.sh run")
PID = os.environ["MFS_PID"]
OPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moosefs.sh")


def counters():
    line = subprocess.run([OPS, "ops", PID], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (field.split("=") for field in line.split())}


def measure(name, setup, call, teardown=lambda i: None):
    for i in range(N):
        setup(i)
    before = counters()
    for i in range(N):
        call(i)
    after = counters()
    for i in range(N):
        teardown(i)
    per_call = {k: (after[k] - before[k]) / N for k in after if k != "total" and after[k] != before[k]}
    total = (after["total"] - before["total"]) / N
    shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_call.items()) if v >= 0.01)
    print(f"| {name} | {total:.2f} | {shown or '–'} |")


def path(i, kind="f"):
    return f"{d}/{kind}{i}"


d = os.path.join(MOUNT, f"op-costs-{os.getpid()}")
os.makedirs(d)
nothing = lambda i: None
create = lambda i: os.close(os.open(path(i), os.O_CREAT | os.O_WRONLY, 0o644))
print(f"{N} calls of each kind on {MOUNT}; master requests per call (mfscli -SMO):\n")
print("| call (stage operation) | master requests | of which |")
print("|---|---:|---|")
measure("open(O_CREAT) + close (`open`, `close`)", nothing, create)
measure("open existing + close (`open`, `close`)", nothing,
        lambda i: os.close(os.open(path(i), os.O_RDONLY)))
measure("stat (`getattr`)", nothing, lambda i: os.stat(path(i)))
measure("chmod (`setattr`)", nothing, lambda i: os.chmod(path(i), 0o600))
measure("rename (`rename`)", nothing, lambda i: os.rename(path(i), path(i, "r")))
measure("unlink (`unlink`)", nothing, lambda i: os.unlink(path(i, "r")))
measure("mkdir (`mkdir`)", nothing, lambda i: os.mkdir(path(i, "d")))
measure("listdir of an empty directory (`opendir`, `readdir`, `closedir`)", nothing,
        lambda i: os.listdir(path(i, "d")))
measure("rmdir (`rmdir`)", nothing, lambda i: os.rmdir(path(i, "d")))
os.rmdir(d)
