"""PNG plots of the cluster experiments' JSON results (matplotlib, Agg)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _title(r, what):
    return f"{what}\n{r['date']}: {r['command']}"


def _series_panel(ax, run, rate_mib, title):
    ser = run.get("link_series") or {}
    for ns, v in ser.items():
        if v["rx_MiBps"] and max(v["rx_MiBps"]) > 1 and max(v["rx_MiBps"]) >= max(v["tx_MiBps"] or [0]):
            ax.plot(v["t"], v["rx_MiBps"], lw=1.4, label=f"{ns} in")
        elif v["tx_MiBps"] and max(v["tx_MiBps"]) > 1:
            ax.plot(v["t"], v["tx_MiBps"], lw=0.8, ls="--", label=f"{ns} out")
    ax.axhline(rate_mib, color="gray", ls=":", lw=1, label="link rate")
    ax.set_xlabel("seconds")
    ax.set_ylabel("link MiB/s (wire bytes)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6, ncol=2)


def plot_fig4(r, out):
    s = r["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ns = sorted({int(n) for v in s.values() for n in v if n.isdigit()})
    for name, v in s.items():
        axes[0].plot(ns, [v[str(n)]["per_client"] for n in ns], "o-", label=name)
        axes[1].plot(ns, [v[str(n)]["aggregate"] for n in ns], "o-", label=name)
    link = r["link_goodput_mib_s"]
    axes[0].axhline(link, color="gray", ls="--", lw=1, label="one link (TCP goodput)")
    axes[1].plot(ns, [link * n for n in ns], color="gray", ls="--", lw=1, label="n client links")
    axes[0].set_ylabel("per-client MiB/s (mean of readers)")
    axes[1].set_ylabel("aggregate MiB/s")
    for ax in axes[:2]:
        ax.set_xlabel("concurrent reader hosts")
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if "morris" in r["raw"]:
        runs = r["raw"]["morris"][str(ns[-1])]
        aggs = [x["aggregate"] for x in runs]
        i = sorted(range(len(aggs)), key=lambda k: aggs[k])[len(aggs) // 2]
        _series_panel(axes[2], runs[i], r["rate_bps"] / 8 / 2**20,
                      f"morris, {ns[-1]} readers, median run: link rates (0.5 s samples)")
    else:
        axes[2].axis("off")
    fig.suptitle(_title(r, f"Fig. 4: 4 servers, same {r['size'] >> 20} MiB file, links {r['rate_bps'] / 1e6:g} Mbit/s, "
                           f"median of {r['args']['runs']} runs"), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_fig5(r, out):
    s = r["summary"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    names = list(s)
    xs = range(len(names))
    ax.bar(xs, [s[n]["total"] for n in names], color=["C0" if n.startswith("morris") else "C1" for n in names])
    ax.axhline(s[names[0]]["client_links_capacity"], color="gray", ls="--", lw=1, label="6 client links")
    for i, n in enumerate(names):
        ax.plot([i - 0.4, i + 0.4], [s[n]["server_links_capacity"]] * 2, "k:", lw=1)
        ax.text(i, s[n]["total"], f"{s[n]['total']:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names)
    ax.set_ylabel("total MiB/s, 6 concurrent reader hosts")
    ax.legend(fontsize=8, title="dotted: servers' links", title_fontsize=8)
    ax.set_title(_title(r, f"Fig. 5: {r['size'] >> 20} MiB file, links {r['rate_bps'] / 1e6:g} Mbit/s, "
                           f"median of {r['args']['runs']} runs"), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_single(r, out):
    s = r["summary"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2.2]})
    runs = [x["aggregate"] for x in r["raw"]]
    ax.bar(["morris (median)"], [s["throughput"]])
    ax.plot([0] * len(runs), runs, "k.", label="runs")
    ax.axhline(s["client_link_goodput"], color="gray", ls="--", label="client link TCP goodput")
    ax.axhline(0.9 * s["client_link_goodput"], color="red", ls=":", label="goal 90%")
    ax.set_ylabel("MiB/s (file bytes / read time)")
    ax.legend(fontsize=8, loc="lower right")
    # Link rates over time of the median run (wire bytes, 0.5 s samples).
    i = sorted(range(len(runs)), key=lambda k: runs[k])[len(runs) // 2]
    ser = r["raw"][i].get("link_series") or {}
    for ns, v in ser.items():
        if v["rx_MiBps"] and max(v["rx_MiBps"]) > 1:
            ax2.plot(v["t"], v["rx_MiBps"], lw=1.5, label=f"{ns} (client) in")
        elif v["tx_MiBps"] and max(v["tx_MiBps"]) > 1:
            ax2.plot(v["t"], v["tx_MiBps"], lw=0.8, label=f"{ns} (server) out")
    ax2.axhline(r["client_rate_bps"] / 8 / 2**20, color="gray", ls="--", lw=1, label="client link rate")
    ax2.axhline(r["rate_bps"] / 8 / 2**20, color="gray", ls=":", lw=1, label="server link rate")
    ax2.set_xlabel("seconds (median run)")
    ax2.set_ylabel("link MiB/s (wire bytes)")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(_title(r, f"Single client, link {r['client_rate_bps'] / 1e6:g} Mbit/s, 4 servers at "
                           f"{r['rate_bps'] / 1e6:g} Mbit/s, {r['size'] >> 20} MiB, median of {r['args']['runs']} runs"),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_blast(r, out):
    s = r["summary"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ns = sorted(int(n) for n in s["morris"])
    xs = list(range(len(ns)))
    w = 0.27
    ms = [s["morris"][str(n)]["search_s"] for n in ns]
    cs = [s["local"][str(n)]["copy_s"] for n in ns]
    ax.bar([x - w for x in xs], ms, w, label="search on morris (cold mount)")
    ax.bar(xs, [s["local"][str(n)]["search_s"] for n in ns], w, label="search on local copy (cold cache)")
    ax.bar([x + w for x in xs], cs, w, label="copy morris -> local disk (counted apart)")
    ax.set_ylim(0, max(ms + cs) * 1.4)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlabel("client hosts searching at once")
    ax.set_ylabel("seconds (median over runs of the slowest host)")
    ax.legend(fontsize=8)
    ax.set_title(_title(r, f"BLAST blastn, {r['db_bases'] / 1e6:.0f} Mbp synthetic db, links "
                           f"{r['rate_bps'] / 1e6:g} Mbit/s"), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot(json_path, out):
    r = json.load(open(json_path))
    kind = r["experiment"].split("-")[0]  # "fig5-ra8M" -> fig5
    {"fig4": plot_fig4, "fig5": plot_fig5, "single": plot_single, "blast": plot_blast}[kind](r, out)


if __name__ == "__main__":
    import sys
    plot(sys.argv[1], sys.argv[2])
