"""Cross-check `opscope diff` against Huawei's msprof-analyze on the shared 2-rank NPU profile.

Optional, never part of the test suite, installs nothing: run it with a Python where
`msprof-analyze` (PyPI) is importable, e.g.

    python -m venv --system-site-packages /tmp/msp && /tmp/msp/bin/pip install msprof-analyze
    PYTHONPATH=. /tmp/msp/bin/python bench/compare_msprof.py [--level 1]

It runs `msprof-analyze compare` (rank 0 as base, rank 1 as comparison) and `opscope diff`
on the same folders and prints, side by side with the ratio opscope / msprof-analyze:
step time (E2E), computing, communication (and not overlapped), free, the top-20
operator call counts and host times (ApiCompare), the TransData kernel totals and the
communication time per collective.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "ascend_profiles" / "alexnet_ddp_2rank"


def _msprof(base: Path, comparison: Path, out: Path) -> Path:
    code = ("import sys; from msprof_analyze.cli.entrance import msprof_analyze_cli; "
            "sys.argv = ['msprof-analyze'] + sys.argv[1:]; sys.exit(msprof_analyze_cli())")
    proc = subprocess.run([sys.executable, "-c", code, "compare", "-d", str(comparison), "-bp", str(base),
                           "-o", str(out)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"msprof-analyze compare failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    found = sorted(out.glob("performance_comparison_result_*.xlsx"))
    if not found:
        raise SystemExit(f"msprof-analyze wrote no comparison workbook in {out}")
    return found[-1]


def _sheet(wb, name) -> list:
    return list(wb[name].iter_rows(values_only=True)) if name in wb.sheetnames else []


def _read_msprof(xlsx: Path) -> dict:
    from openpyxl import load_workbook

    wb = load_workbook(xlsx, read_only=True)
    overall = {}
    for row in _sheet(wb, "OverallMetrics")[3:]:
        if row and isinstance(row[0], str):
            overall[row[0].strip()] = (row[1], row[4])          # base, comparison (ms)
    api = {}
    for row in _sheet(wb, "ApiCompare")[3:]:
        if row and isinstance(row[1], str):
            api[row[1]] = {"base_calls": row[5], "base_ms": row[2], "comp_calls": row[9], "comp_ms": row[6]}
    transdata = [0.0, 0, 0.0, 0]
    for row in _sheet(wb, "KernelCompare")[3:]:
        if row and row[1] == "TransData":
            transdata[0] += row[3] or 0
            transdata[1] += row[7] or 0
            transdata[2] += row[8] or 0
            transdata[3] += row[12] or 0
    comm = {}
    for row in _sheet(wb, "CommunicationCompare")[3:]:
        if row and isinstance(row[1], str) and row[1] != "|":
            comm[row[1]] = (row[4], row[11])                      # µs base, comparison
    return {"overall": overall, "api": api, "transdata": transdata, "comm": comm}


def _opscope(base: Path, comparison: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from opscope.analysis.diff.profiles import diff_profiles
    from opscope.parsers import load_profile

    a, b = load_profile(base), load_profile(comparison)
    result = diff_profiles(a, b, label_a="rank0", label_b="rank1")
    calls = []
    for prof in (a, b):
        counts, host = Counter(), defaultdict(float)
        for c in prof.calls:
            if c.step:
                counts[c.name] += 1
                host[c.name] += c.total_time_us
        calls.append((counts, host))
    transdata = []
    for prof in (a, b):
        k = next((k for k in prof.metadata["inserted_kernels"] if k["kernel"] == "TransData"), None)
        transdata.append((k["device_time_us"], k["calls"]) if k else (0.0, 0))
    return {"split": [result.a["step"]["device_split_us"], result.b["step"]["device_split_us"]],
            "calls": calls, "transdata": transdata,
            "comm": [sum(c["time_us"] for c in side["collectives"]) for side in (result.a, result.b)]}


def _ratio(ours, theirs) -> str:
    try:
        return f"{float(ours) / float(theirs):.4f}" if theirs else "-"
    except (TypeError, ValueError):
        return "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=int, default=1, choices=(0, 1, 2))
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    if importlib.util.find_spec("msprof_analyze") is None:
        print("msprof-analyze is not importable in this Python; install it in a separate venv "
              "(see this file's docstring). Nothing was run.")
        return 0
    base = args.data / "text" / f"level{args.level}" / "rank0_ascend_pt"
    comparison = args.data / "text" / f"level{args.level}" / "rank1_ascend_pt"
    with tempfile.TemporaryDirectory() as tmp:
        theirs = _read_msprof(_msprof(base, comparison, Path(tmp)))
    ours = _opscope(base, comparison)

    print(f"opscope diff vs msprof-analyze compare, text/level{args.level}, rank 0 (base) / rank 1\n")
    print(f"{'metric (ms per step)':44} {'opscope r0':>11} {'msprof r0':>11} {'ratio':>7}   "
          f"{'opscope r1':>11} {'msprof r1':>11} {'ratio':>7}")
    rows = [("E2E (device step)", "device_span_us", "E2E Time"),
            ("computing", "computing_us", "Computing Time"),
            ("communication not overlapped", "communication_not_overlapped_us", "Uncovered Communication Time"),
            ("free", "free_us", "Free Time")]
    for label, ours_key, theirs_key in rows:
        m = theirs["overall"].get(theirs_key, (None, None))
        o = [s[ours_key] / 1000 for s in ours["split"]]
        print(f"{label:44} {o[0]:11.3f} {m[0] or 0:11.3f} {_ratio(o[0], m[0]):>7}   "
              f"{o[1]:11.3f} {m[1] or 0:11.3f} {_ratio(o[1], m[1]):>7}")
    m = theirs["comm"].get("allreduce", (None, None))
    print(f"{'communication (allreduce total)':44} {ours['comm'][0] / 1000:11.3f} {(m[0] or 0) / 1000:11.3f} "
          f"{_ratio(ours['comm'][0], (m[0] or 0)):>7}   {ours['comm'][1] / 1000:11.3f} {(m[1] or 0) / 1000:11.3f} "
          f"{_ratio(ours['comm'][1], (m[1] or 0)):>7}")
    td = theirs["transdata"]
    for i, (label, t_us, t_n) in enumerate((("rank 0", td[0], td[1]), ("rank 1", td[2], td[3]))):
        o_us, o_n = ours["transdata"][i]
        print(f"TransData {label}: opscope {o_n} kernels {o_us / 1000:.3f} ms, msprof {t_n} kernels "
              f"{t_us / 1000:.3f} ms (ratio {_ratio(o_us, t_us)})")

    print("\ntop-20 operators by msprof host time (ApiCompare, rank 0): calls and total host ms")
    print(f"{'operator':44} {'opscope calls':>13} {'msprof calls':>12} {'opscope ms':>10} {'msprof ms':>10} {'ratio':>7}")
    from opscope.parsers.rules import rules

    kind = rules().kind         # opscope's operators (annotations such as autograd::engine::* are not)
    top = sorted(((n, v) for n, v in theirs["api"].items() if kind(n) == "op"),
                 key=lambda kv: -(kv[1]["base_ms"] or 0))[:20]
    same = 0
    for name, v in top:
        calls, host = ours["calls"][0][0][name], ours["calls"][0][1][name] / 1000
        same += calls == v["base_calls"]
        print(f"{name:44} {calls:13d} {v['base_calls']:>12} {host:10.2f} {v['base_ms'] or 0:10.2f} "
              f"{_ratio(host, v['base_ms']):>7}")
    print(f"\n{same} of {len(top)} operator call counts identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
