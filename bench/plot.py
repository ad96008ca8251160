#!/usr/bin/env python3
"""Plots bench/throughput.py results (JSON) as a PNG: morris vs the reference
for each workload, as the ratio of medians. Needs matplotlib (pip install matplotlib).

  python3 bench/plot.py bench/results-throughput.json docs/throughput.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, out = sys.argv[1], sys.argv[2]
    r = json.load(open(src))
    med = r["median"]
    mb = ["seq-write", "cold-read", "warm-srv-read", "4proc-1mount", "4mounts"]
    ops = ["create", "stat", "unlink", "rand-4k-iops"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, keys, unit in ((axes[0], mb, "MiB/s"), (axes[1], ops, "ops/s")):
        xs = range(len(keys))
        m = [med[k]["morris"] for k in keys]
        ref = [med[k].get("local", float("nan")) for k in keys]
        ax.bar([x - 0.2 for x in xs], m, 0.4, label="morris (FUSE, 4 servers on loopback)")
        ax.bar([x + 0.2 for x in xs], ref, 0.4, label="local disk (same run)")
        if "warm-srv-read" in keys:
            i = keys.index("warm-srv-read")
            ax.plot([i + 0.2], [med["tcp-copy"]["ref"]], "k_", markersize=30, label="raw loopback TCP copy")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(keys, rotation=20)
        ax.set_ylabel(unit)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"morris throughput benchmark, {r['date']}, medians of {r['args']['runs']} runs")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
