#!/usr/bin/env python3
"""Plots one run of `max_rate = "auto"` from scripts/realfs/sample-ctl.py's CSV as an SVG:
above, Max_R and each job's usage (calls a second); below, the resource's median
service time per interval against the target.

usage: plot.py CSV TARGET_P50_MS OUT.svg
"""
import csv
import sys

WIDTH, HEIGHT, MARGIN = 900, 560, 70
PANEL = (HEIGHT - 3 * MARGIN) / 2
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: plot.py CSV TARGET_P50_MS OUT.svg")
    path, target, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"plot.py: {path} has no samples")
    t = sorted({float(r["t"]) for r in rows})
    by_t = {float(r["t"]): r for r in rows}
    rates = {"Max_R": [(x, float(by_t[x]["max_rate"])) for x in t]}
    for r in rows:
        rates.setdefault(f"{r['job']} usage", []).append((float(r["t"]), float(r["usage"])))
    p50 = [(x, float(by_t[x]["p50_ms"])) for x in t if by_t[x]["p50_ms"]]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>']
    x_max = max(t)
    y_rate = max(v for series in rates.values() for _, v in series) * 1.1 or 1
    y_p50 = max([v for _, v in p50] + [target]) * 1.3
    panel(svg, MARGIN, "calls/s", y_rate, x_max, rates, "{:,.0f}")
    panel(svg, 2 * MARGIN + PANEL, "p50 service time, ms", y_p50, x_max,
          {"p50 (all calls)": p50, f"target {target} ms": [(0, target), (x_max, target)]},
          "{:.2f}")
    svg.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 15}" text-anchor="middle">seconds</text></svg>')
    open(out, "w").write("\n".join(svg) + "\n")


def panel(svg, top, label, y_max, x_max, series, tick):
    left, width = MARGIN, WIDTH - 2 * MARGIN
    def xy(x, y):
        return left + width * x / x_max, top + PANEL * (1 - y / y_max)
    svg.append(f'<rect x="{left}" y="{top}" width="{width}" height="{PANEL}" fill="none" stroke="#888"/>')
    for i in range(5):
        y = y_max * i / 4
        _, py = xy(0, y)
        svg.append(f'<text x="{left - 6}" y="{py + 4}" text-anchor="end">{tick.format(y)}</text>')
        svg.append(f'<line x1="{left}" y1="{py}" x2="{left + width}" y2="{py}" stroke="#eee"/>')
    for i in range(6):
        x = x_max * i / 5
        px, _ = xy(x, 0)
        svg.append(f'<text x="{px}" y="{top + PANEL + 15}" text-anchor="middle">{x:.0f}</text>')
    svg.append(f'<text x="18" y="{top + PANEL / 2}" transform="rotate(-90 18 {top + PANEL / 2})" '
               f'text-anchor="middle">{label}</text>')
    for i, (name, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in (xy(x, y) for x, y in points))
        svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        svg.append(f'<text x="{left + 10 + 170 * i}" y="{top - 8}" fill="{colour}">{name}</text>')


if __name__ == "__main__":
    main()
