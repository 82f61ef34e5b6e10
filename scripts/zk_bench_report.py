#!/usr/bin/env python3
"""Turns upright zk-bench's JSON lines (upright-zk and zookeeper in one run) into a markdown
table with the ratio to ZooKeeper and an SVG bar chart of throughput.

    zk_bench_report.py results.jsonl table.md throughput.svg
"""
import json
import sys


def main():
    src, table_path, svg_path = sys.argv[1:4]
    points = {}
    for line in open(src):
        line = line.strip()
        if line:
            p = json.loads(line)
            points[(p["label"], p["workload"], p["clients"])] = p
    workloads = [w for w in ["create", "set", "get", "mix"] if any(k[1] == w for k in points)]
    clients = sorted({k[2] for k in points})
    rows = [
        "| workload | clients | upright-zk ops/s | p50 / p99 ms | ZooKeeper ops/s | p50 / p99 ms | upright / ZooKeeper |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    bars = []
    for w in workloads:
        for c in clients:
            u = points.get(("upright-zk", w, c))
            z = points.get(("zookeeper", w, c))
            if not u or not z:
                continue
            ratio = u["ops_per_s"] / z["ops_per_s"] if z["ops_per_s"] else float("nan")
            rows.append(
                f"| {w} | {c} | {u['ops_per_s']:,.0f} | {u['p50_ms']:.2f} / {u['p99_ms']:.2f} "
                f"| {z['ops_per_s']:,.0f} | {z['p50_ms']:.2f} / {z['p99_ms']:.2f} | {ratio:.0%} |"
            )
            bars.append((f"{w} x{c}", u["ops_per_s"], z["ops_per_s"]))
    with open(table_path, "w") as f:
        f.write("\n".join(rows) + "\n")
    write_svg(svg_path, bars)


def write_svg(path, bars):
    width, row, left = 720, 26, 110
    top = 40
    height = top + row * len(bars) + 30
    peak = max([max(u, z) for _, u, z in bars] + [1])
    scale = (width - left - 90) / peak
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        '<text x="10" y="18" font-size="14">ZooKeeper requests per second: upright-zk (u = r = 1) and Apache ZooKeeper (3 servers)</text>',
        f'<rect x="{left}" y="24" width="10" height="10" fill="#3a6ea5"/><text x="{left + 14}" y="33">upright-zk</text>',
        f'<rect x="{left + 100}" y="24" width="10" height="10" fill="#d98c2b"/><text x="{left + 114}" y="33">ZooKeeper</text>',
    ]
    for i, (name, u, z) in enumerate(bars):
        y = top + i * row
        out.append(f'<text x="10" y="{y + 16}">{name}</text>')
        out.append(f'<rect x="{left}" y="{y + 2}" width="{u * scale:.1f}" height="10" fill="#3a6ea5"/>')
        out.append(f'<text x="{left + u * scale + 4:.1f}" y="{y + 11}" font-size="10">{u:,.0f}</text>')
        out.append(f'<rect x="{left}" y="{y + 13}" width="{z * scale:.1f}" height="10" fill="#d98c2b"/>')
        out.append(f'<text x="{left + z * scale + 4:.1f}" y="{y + 22}" font-size="10">{z:,.0f}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
