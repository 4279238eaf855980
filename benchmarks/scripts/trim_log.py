#!/usr/bin/env python3
"""Shrinks a tuning log for the repository: every record keeps its median, state,
result kind, compile info, device and timestamp; only the per-run samples
(`result.ok.samples_us`) are dropped, except for the best record of each task.
`tilesched best`, `export`, `bench`, `features` and the tuning curves read the result
exactly as they read the full log.

usage: trim_log.py IN.jsonl[.gz] OUT.jsonl.gz
"""
import gzip
import json
import sys


def main(src, dst):
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    best = {}
    for i, r in enumerate(records):
        ok = r.get("result", {}).get("ok")
        if ok and (r["task"] not in best or ok["median_us"] < records[best[r["task"]]]["result"]["ok"]["median_us"]):
            best[r["task"]] = i
    keep = set(best.values())
    with gzip.open(dst, "wt", compresslevel=9) as f:
        for i, r in enumerate(records):
            ok = r.get("result", {}).get("ok")
            if ok and i not in keep:
                ok["samples_us"] = []
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{dst}: {len(records)} records, samples kept for {len(keep)} best")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
