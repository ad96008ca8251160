"""Link utilisation of the runs in a results JSON (from the 0.5 s link-rate series).

    python3 bench/cluster/analyze.py bench/cluster/results/fig4.json [--system morris] [--n 4]

For every run prints, per host that moved data, the mean / p10 / p50 / p90 MiB/s on its link
(wire bytes incl. headers; raw link rate = rate/8) and the share of time it was >= 90 % busy,
plus the machine's CPU busy fraction. Used to find why a goal was missed: links idle while
others are full (imbalance), or everything below the rate while the CPU is saturated.
"""
import argparse
import json
import statistics as st


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def runs_of(r, system=None, n=None):
    raw = r["raw"]
    if isinstance(raw, list):  # single
        for i, x in enumerate(raw):
            yield f"run {i + 1}", x
        return
    for sname, d in raw.items():
        if system and sname != system:
            continue
        if isinstance(d, list):  # fig5
            for i, x in enumerate(d):
                yield f"{sname} run {i + 1}", x
            continue
        for k, lst in d.items():
            if n and str(n) != k:
                continue
            for i, x in enumerate(lst):
                if isinstance(x, dict) and "link_series" in x:
                    yield f"{sname} n={k} run {i + 1}", x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--system")
    ap.add_argument("--n", type=int)
    a = ap.parse_args()
    r = json.load(open(a.json))
    raw_rate = r.get("rate_bps", 0) / 8 / (1 << 20)
    crate = r.get("client_rate_bps", 0) / 8 / (1 << 20)
    for name, x in runs_of(r, a.system, a.n):
        s = x.get("link_series")
        if not s:
            continue
        print(f"{name}: wall {x['wall_s']:.1f} s, per-client " + " ".join(f"{v:.1f}" for v in x["per_client"])
              + f", machine CPU busy {x['cpu']['busy']:.0%}")
        for ns, v in s.items():
            for d in ("tx", "rx"):
                xs = v[f"{d}_MiBps"]
                if not xs or max(xs) < 1:
                    continue
                cap = crate if (crate and ns.endswith("h4") and r["experiment"] == "single") else raw_rate
                busy = sum(1 for q in xs if q >= 0.9 * cap) / len(xs)
                print(f"  {ns:<8}{d}  mean {st.mean(xs):6.1f}  p10 {pct(xs, .1):6.1f}  p50 {pct(xs, .5):6.1f}"
                      f"  p90 {pct(xs, .9):6.1f}  (raw rate {cap:.1f}; >=90% busy {busy:.0%} of the time)")


if __name__ == "__main__":
    main()
