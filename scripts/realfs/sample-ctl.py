#!/usr/bin/env python3
"""Samples `cheferd ctl jobs --json` once a second until killed and writes one CSV row
per sample: seconds since start, the first resource's Max_R, its service times over
the last interval (p50, p99 in ms, calls), and each job's usage and assigned rate.

usage: sample-ctl.py CHEFERD ADMIN_SOCKET CSV
"""
import json
import subprocess
import sys
import time

cheferd, socket, out = sys.argv[1:4]
start = time.time()
with open(out, "w", buffering=1) as csv:
    csv.write("t,max_rate,p50_ms,p99_ms,calls,job,usage,assigned\n")
    while True:
        time.sleep(1)
        reply = subprocess.run([cheferd, "ctl", "--socket", socket, "--json", "jobs"],
                               capture_output=True, text=True)
        if reply.returncode != 0:
            continue
        view = json.loads(reply.stdout)
        resource = view["resources"][0]
        service = resource.get("service", {})
        head = [f"{time.time() - start:.1f}", f"{resource['max_rate']:.0f}",
                str(service.get("p50_ms") or ""), str(service.get("p99_ms") or ""),
                str(service.get("calls", 0))]
        for share in view["shares"]:
            if share["resource"] == resource["resource"]:
                row = head + [share["job"], f"{share['usage']:.0f}", f"{share['assigned']:.0f}"]
                csv.write(",".join(row) + "\n")
