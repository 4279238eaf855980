#!/usr/bin/env python3
"""Our kernels against the strongest baseline per task: `bench`'s vendor routine or
PyTorch eager, whichever is faster.

`tilesched bench` times our kernels beside cuDNN and cuBLAS called directly (the fastest
of many candidates by our protocol); the PyTorch peer (`torch_peer.py`) times the same
kernels beside what PyTorch eager runs. Neither baseline dominates the other: `bench`'s
is stronger where PyTorch's own choice is slower (a float32 1x1 convolution that
PyTorch hands to cuDNN, which `bench` also runs as one cuBLAS GEMM), PyTorch's where it
has a kernel of its own that no vendor library offers (depthwise convolutions). What a
user asks is whether our kernel beats the best they can have, so per task this takes
the smaller of the two speedups. Each is a ratio from one side-by-side run: `bench`'s,
and the peer's under the same protocol (`cold`: L2 cold, one pair of events per call),
so no time is divided by a time from another run.

    python3 strongest.py BENCH.json PEER.json --out DIR

writes DIR/strongest.json and DIR/strongest.md and prints the markdown. Exit status 0,
or 2 with one line on stderr for unreadable or malformed inputs.
"""

import argparse
import json
import math
import os
import sys

PROG = "strongest"


class InputError(Exception):
    """An input file that cannot be read or is not what it claims (exit status 2)."""


def _read(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{what} {path} is not JSON: {e}") from None


def _median(side):
    """A side's median µs, or None when it did not run."""
    if isinstance(side, dict) and isinstance(side.get("median_us"), (int, float)):
        value = float(side["median_us"])
        return value if value > 0 and math.isfinite(value) else None
    return None


def geomean(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def merge(bench, peer):
    """Per bench row: our time and the vendor's (bench), ours and eager's (peer, cold),
    each ratio, the smaller one and which baseline gave it; then the geometric means
    over the rows that bench's headline covers (compared, not flagged) and over all."""
    if not isinstance(bench, dict) or not isinstance(bench.get("rows"), list):
        raise InputError("the bench report has no rows")
    if not isinstance(peer, dict) or not isinstance(peer.get("rows"), list):
        raise InputError("the peer report has no rows")
    peer_rows = {r.get("task"): r for r in peer["rows"] if isinstance(r, dict)}
    rows = []
    for b in bench["rows"]:
        if not isinstance(b, dict) or not isinstance(b.get("task"), str):
            raise InputError("a bench row has no task")
        task = b["task"]
        ours, vendor = _median(b.get("ours")), _median(b.get("vendor"))
        row = {"task": task, "count": b.get("count", 1), "flags": list(b.get("flags") or []),
               "ours_us": ours, "vendor_us": vendor,
               "vs_vendor": vendor / ours if ours and vendor else None,
               "peer_ours_us": None, "eager_us": None, "vs_eager": None}
        p = peer_rows.get(task)
        if p is None:
            row["peer"] = "not in the peer's report"
        elif p.get("exact") is not True:
            row["peer"] = "our output was not exact in the peer's run"
        else:
            cold = p.get("cold") or {}
            row["peer_ours_us"], row["eager_us"] = _median(cold.get("ours")), _median(cold.get("eager"))
            if row["peer_ours_us"] and row["eager_us"]:
                row["vs_eager"] = row["eager_us"] / row["peer_ours_us"]
                row["peer"] = None
            else:
                row["peer"] = "PyTorch eager did not run"
        candidates = [(s, name) for s, name in ((row["vs_vendor"], "vendor"),
                                               (row["vs_eager"], "PyTorch eager"))
                      if s is not None]
        row["vs_strongest"], row["strongest"] = min(candidates) if candidates else (None, None)
        rows.append(row)
    headline = [r for r in rows if not r["flags"] and r["vs_vendor"] is not None]

    def means(subset):
        return {"rows": len(subset),
                "geomean_vs_vendor": geomean(r["vs_vendor"] for r in subset),
                "geomean_vs_eager": geomean(r["vs_eager"] for r in subset),
                "eager_rows": sum(1 for r in subset if r["vs_eager"] is not None),
                "geomean_vs_strongest": geomean(r["vs_strongest"] for r in subset),
                "eager_stronger": sum(1 for r in subset if r["strongest"] == "PyTorch eager"),
                "slower": sum(1 for r in subset
                              if r["vs_strongest"] is not None and r["vs_strongest"] < 1)}

    return {"device": (bench.get("device") or {}).get("name"), "vendor": bench.get("vendor"),
            "torch": peer.get("torch"), "headline": means(headline), "all": means(rows),
            "rows": rows}


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def _us(v):
    return "-" if v is None else f"{v:.2f}"


def markdown(merged, bench_path, peer_path):
    h, a = merged["headline"], merged["all"]
    lines = [
        "# Our kernels against the strongest baseline per task",
        "",
        f"- device: {merged['device']}; vendor: {merged['vendor']}; PyTorch {merged['torch']}",
        f"- from `{bench_path}` (ours vs the vendor, one run) and `{peer_path}` (ours vs "
        "PyTorch eager, cold-L2 protocol, one run); per task the smaller speedup counts",
        "",
        "| rows | ×vendor | ×eager | ×strongest | eager the stronger | slower than the strongest |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in (("headline (compared, not flagged)", h), ("all", a)):
        lines.append(f"| {name}: {m['rows']} | {_x(m['geomean_vs_vendor'])} | "
                     f"{_x(m['geomean_vs_eager'])} ({m['eager_rows']}) | "
                     f"**{_x(m['geomean_vs_strongest'])}** | {m['eager_stronger']} | "
                     f"{m['slower']} |")
    lines += ["", "Times in µs (median); ×: the baseline's time over ours (above 1: ours "
              "is faster).", "",
              "| task | count | ours | vendor | ×vendor | ours (peer) | eager | ×eager | "
              "×strongest | strongest | flags |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in merged["rows"]:
        note = "; ".join(r["flags"] + ([r["peer"]] if r.get("peer") else []))
        lines.append(f"| `{r['task']}` | {r['count']} | {_us(r['ours_us'])} | "
                     f"{_us(r['vendor_us'])} | {_x(r['vs_vendor'])} | "
                     f"{_us(r['peer_ours_us'])} | {_us(r['eager_us'])} | "
                     f"{_x(r['vs_eager'])} | {_x(r['vs_strongest'])} | "
                     f"{r['strongest'] or '-'} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", metavar="BENCH.json")
    parser.add_argument("peer", metavar="PEER.json")
    parser.add_argument("--out", required=True, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        merged = merge(_read(args.bench, "bench report"), _read(args.peer, "peer report"))
        os.makedirs(args.out, exist_ok=True)
        text = markdown(merged, args.bench, args.peer)
        with open(os.path.join(args.out, "strongest.json"), "w", encoding="utf-8") as f:
            json.dump(merged, f, indent=1)
        with open(os.path.join(args.out, "strongest.md"), "w", encoding="utf-8") as f:
            f.write(text)
    except (InputError, OSError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
