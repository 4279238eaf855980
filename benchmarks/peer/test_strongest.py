"""Tests of strongest.py: the per-task choice of the stronger baseline and its report.

    python3 -m unittest benchmarks/peer/test_strongest.py      (from the repository root)
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "strongest.py")
spec = importlib.util.spec_from_file_location("strongest", SCRIPT)
st = importlib.util.module_from_spec(spec)
spec.loader.exec_module(st)


def side(us):
    return {"median_us": us, "p10_us": us, "p90_us": us, "samples": 100}


def bench_row(task, ours, vendor, flags=None, count=1):
    row = {"task": task, "count": count, "ours": side(ours),
           "vendor": None if vendor is None else side(vendor)}
    if flags:
        row["flags"] = flags
    return row


def peer_row(task, ours, eager, exact=True):
    return {"task": task, "exact": exact,
            "cold": {"ours": side(ours), "eager": None if eager is None else side(eager),
                     "compile": None}}


BENCH = {"device": {"name": "NVIDIA H200"}, "vendor": "cuDNN 9.19.0",
         "rows": [bench_row("a", 10.0, 20.0),            # vendor 2x, eager 4x: vendor
                  bench_row("b", 10.0, 20.0),            # eager 1.5x is the stronger
                  bench_row("c", 10.0, 30.0, ["vendor not on tensor cores"]),
                  bench_row("d", 10.0, 5.0),             # no peer row
                  bench_row("e", 10.0, 12.0),            # the peer's output was wrong
                  bench_row("f", 10.0, None)]}           # the vendor failed
PEER = {"torch": "2.11.0", "rows": [peer_row("a", 11.0, 44.0), peer_row("b", 10.0, 15.0),
                                    peer_row("c", 10.0, 12.0),
                                    peer_row("e", 10.0, 5.0, exact=False),
                                    peer_row("f", 10.0, 8.0)]}


class MergeTest(unittest.TestCase):
    def test_the_smaller_speedup_counts_per_task(self):
        merged = st.merge(BENCH, PEER)
        rows = {r["task"]: r for r in merged["rows"]}
        self.assertEqual((rows["a"]["vs_strongest"], rows["a"]["strongest"]), (2.0, "vendor"))
        self.assertEqual((rows["b"]["vs_strongest"], rows["b"]["strongest"]),
                         (1.5, "PyTorch eager"))
        self.assertAlmostEqual(rows["c"]["vs_strongest"], 1.2)
        self.assertEqual((rows["d"]["vs_strongest"], rows["d"]["peer"]),
                         (0.5, "not in the peer's report"))
        self.assertIsNone(rows["e"]["vs_eager"])
        self.assertIn("not exact", rows["e"]["peer"])
        self.assertEqual((rows["f"]["vs_strongest"], rows["f"]["strongest"]),
                         (0.8, "PyTorch eager"))

    def test_the_headline_covers_bench_headline_rows(self):
        merged = st.merge(BENCH, PEER)
        h = merged["headline"]
        # a, b, d, e: compared by bench and not flagged (c is flagged, f has no vendor).
        self.assertEqual((h["rows"], h["eager_stronger"], h["slower"]), (4, 1, 1))
        self.assertAlmostEqual(h["geomean_vs_strongest"], (2.0 * 1.5 * 0.5 * 1.2) ** 0.25)
        self.assertAlmostEqual(h["geomean_vs_eager"], (4.0 * 1.5) ** 0.5)
        self.assertEqual(h["eager_rows"], 2)
        self.assertEqual(merged["all"]["rows"], 6)

    def test_malformed_reports_are_refused(self):
        with self.assertRaises(st.InputError):
            st.merge({"rows": None}, PEER)
        with self.assertRaises(st.InputError):
            st.merge(BENCH, [])
        with self.assertRaises(st.InputError):
            st.merge({"rows": [{"count": 1}]}, PEER)


class CommandTest(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)

    def test_writes_both_reports(self):
        with tempfile.TemporaryDirectory() as d:
            bench, peer = os.path.join(d, "bench.json"), os.path.join(d, "peer.json")
            for path, data in ((bench, BENCH), (peer, PEER)):
                with open(path, "w") as f:
                    json.dump(data, f)
            done = self.run_script(bench, peer, "--out", os.path.join(d, "out"))
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("| headline (compared, not flagged): 4 | ", done.stdout)
            self.assertIn("| `b` | 1 | 10.00 | 20.00 | 2.00x | 10.00 | 15.00 | 1.50x | 1.50x "
                          "| PyTorch eager |  |", done.stdout)
            with open(os.path.join(d, "out", "strongest.json")) as f:
                self.assertEqual(json.load(f)["headline"]["rows"], 4)

    def test_an_unreadable_input_is_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            done = self.run_script(os.path.join(d, "none.json"), os.path.join(d, "p.json"),
                                   "--out", d)
            self.assertEqual(done.returncode, 2)
            self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
            self.assertIn("cannot read bench report", done.stderr)


if __name__ == "__main__":
    unittest.main()
