"""Markdown tables (for docs/benchmarks.md) from the latest results in bench/cluster/results/.

    python3 bench/cluster/report.py [fig4 fig4-morris-0535 single fig5 blast]
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    p = os.path.join(HERE, "results", f"{name}.json")
    return json.load(open(p)) if os.path.exists(p) else None


def head(r, what):
    return (f"**{what}** — {r['date']}, `{r['command']}`, median of {r['args']['runs']} runs, "
            f"links {r['rate_bps'] / 1e6:g} Mbit/s (TCP goodput {r['rate_bps'] * 1448 / 1514 / 8 / 2**20:.1f} MiB/s), "
            f"plot `docs/cluster-{r['experiment']}.png`"
            + (f", morris build {r['morris_binary']['mtime']} ({r['morris_binary']['sha256']})" if "morris_binary" in r else "")
            + "\n")


def fig4(r):
    s = r["summary"]
    systems = list(s)
    out = [head(r, f"MORRIS Fig. 4: 4 servers, 1-4 client hosts read the same {r['size'] >> 20} MiB file"),
           "| readers | " + " | ".join(f"{x} per-client | {x} aggregate" for x in systems) + " |",
           "|---|" + "---|---|" * len(systems)]
    for n in ("1", "2", "3", "4"):
        out.append(f"| {n} | " + " | ".join(f"{s[x][n]['per_client']:.1f} | {s[x][n]['aggregate']:.1f}" for x in systems) + " |")
    out.append("| 4 vs 1 | " + " | ".join(f"{s[x]['per_client_ratio']:.0%} | x{s[x]['aggregate_ratio']:.2f}" for x in systems) + " |")
    out.append("\nMiB/s. Goals (morris): per-client at 4 readers >= 95 % of 1 reader, aggregate >= 3.8x: "
               + ", ".join(f"{k.split(' ')[0]} {'met' if v else 'MISSED'}" for k, v in r["goals"].items()))
    return "\n".join(out)


def fig5(r):
    s = r["summary"]
    out = [head(r, f"MORRIS Fig. 5: 6 client hosts read the same {r['size'] >> 20} MiB file, 1/2/4 server hosts"),
           "| system | servers | total MiB/s | per-client MiB/s | of the servers' links | of the 6 client links |",
           "|---|---|---|---|---|---|"]
    for name, x in s.items():
        out.append(f"| {name} | {x['servers']} | {x['total']:.1f} | {x['per_client']:.1f} | {x['of_server_links']:.0%} "
                   f"| {x['of_client_links']:.0%} |")
    if r.get("goals"):
        out.append("\nGoal (total grows with servers until the clients' links are full): "
                   + ("met" if all(r["goals"].values()) else "MISSED"))
    return "\n".join(out)


def single(r):
    s = r["summary"]
    return "\n".join([
        head(r, f"Single client: one client host at {r['client_rate_bps'] / 1e6:g} Mbit/s reads {r['size'] >> 20} MiB "
                f"from 4 servers at {r['rate_bps'] / 1e6:g} Mbit/s"),
        "| morris MiB/s | client link goodput | of the link | runs |", "|---|---|---|---|",
        f"| {s['throughput']:.1f} | {s['client_link_goodput']:.1f} | {s['of_client_link']:.1%} | "
        + ", ".join(f"{x['aggregate']:.1f}" for x in r["raw"]) + " |",
        "\nGoal >= 90 % of the client link: " + ("met" if all(r["goals"].values()) else "MISSED")])


def blast(r):
    s = r["summary"]
    out = [head(r, f"BLAST: blastn -task {r['args']['task']}, 568-bp query, {r['db_bases'] / 1e6:.0f} Mbp synthetic "
                   f"database ({r['db_bytes'] >> 20} MiB of BLAST files) on 4 morris servers"),
           "| client hosts | search on morris (s) | blastn CPU (s) | copy to local (s) | search on local copy (s) | copy + local (s) |",
           "|---|---|---|---|---|---|"]
    for n in s["morris"]:
        m, l_ = s["morris"][n], s["local"][n]
        out.append(f"| {n} | {m['search_s']:.1f} | {m['cpu_s']:.1f} | {l_['copy_s']:.1f} | {l_['search_s']:.1f} | "
                   f"{l_['copy_s'] + l_['search_s']:.1f} |")
    out.append("\nSeconds, slowest host; every host's blastn output is checked equal to a reference search.")
    return "\n".join(out)


def main():
    names = sys.argv[1:] or ["fig4", "fig4-morris-0535", "single", "fig5", "blast"]
    for n in names:
        r = load(n)
        if r is None:
            print(f"({n}: no results yet)\n")
            continue
        print({"fig4": fig4, "fig5": fig5, "single": single, "blast": blast}[n.split("-")[0]](r) + "\n")


if __name__ == "__main__":
    main()
