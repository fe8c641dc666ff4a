"""Fuzz every input opscope reads: mutated real profiles through the real CLI.

Seeds are real artefacts: a torch.profiler Chrome trace (plain and .json.gz) and its
``key_averages().table()`` log made here, a window of the shared Ascend NPU profile
(``../shared/data/ascend_profiles``: trace_view.json, step_trace_time.csv,
profiler_info_N.json) and the scan.json of ``opscope scan examples/train_cnn.py``.
Each case applies 1-3 mutations (truncation, byte flips, inserted or deleted bytes,
a JSON value swapped for a hostile one: wrong type, 1e400, a 400-digit integer, 3,000
levels of nesting, ANSI escapes and formulas in text, absurd call counts) and runs
``opscope diff`` or ``opscope report`` in this process, with the reports written.

An outcome is ``ok`` (exit 0), ``clean`` (exit 2 with one ``opscope: error:`` line),
``crash`` (exit 70, a traceback, or anything else) or ``hang`` (past --case-timeout).

    python bench/fuzz.py [--cases 10000] [--seed 0] [--case-timeout 20] [--show 5]

The test suite (tests/test_fuzz.py) drives the same mutators with hypothesis.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_RANK = (ROOT.parent / "shared" / "data" / "ascend_profiles" / "alexnet_ddp_2rank" / "text" / "level1"
               / "rank0_ascend_pt")

OPS = ("truncate", "flip", "insert", "delete", "json-swap", "json-swap", "json-grow", "token-swap")
JUNK = (b"\x00", b"\xff\xfe", b"{", b"]", b'"', b"\x1b[31m", b"\n", b",,,", b"1e400", b"[[[[[[[[", b"\x1f\x8b",
        b"NaN", b"-", b"\\u0000")
TOKENS = ("100000000", "1" * 400, "-5", "1.2.3ms", "{1: 2}", "[" * 60, "8873.7x", "nan", "inf", "1e400",
          "0", "", "\x1b[31m=1+1", "999999999999999999999")
_RAW = "@@RAW{}@@"
HOSTILE = (None, True, 0, -1, 1.5, -1e308, "", "x", "\x1b[31mred\x1b[0m\n=HYPERLINK(\"http://e.x\")", "@SUM(1)",
           [], {}, [1], {"a": 1}, [[1, [2, [3]]]], "8873.7x", 10 ** 20, 100000000, 1e9, -0.0,
           _RAW.format("1e400"), _RAW.format("-1e400"), _RAW.format("1" * 400), _RAW.format("NaN"),
           _RAW.format("[" * 3000 + "]" * 3000), _RAW.format('{"a":' * 1500 + "1" + "}" * 1500))
RAW_TEXT = {_RAW.format(t): t for t in ("1e400", "-1e400", "1" * 400, "NaN", "[" * 3000 + "]" * 3000,
                                        '{"a":' * 1500 + "1" + "}" * 1500)}


# ----------------------------------------------------------------------------- mutations
def _nodes(value, limit: int = 5000) -> list[tuple]:
    """Paths (tuples of keys/indices) to the values inside a JSON document, breadth first."""
    paths, todo = [], [((), value)]
    while todo and len(paths) < limit:
        path, item = todo.pop(0)
        paths.append(path)
        if isinstance(item, dict):
            todo.extend((path + (k,), v) for k, v in item.items())
        elif isinstance(item, list):
            todo.extend((path + (i,), v) for i, v in enumerate(item))
    return paths


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _dumps(doc) -> bytes:
    text = json.dumps(doc)
    for marker, raw in RAW_TEXT.items():
        text = text.replace(json.dumps(marker), raw)
    return text.encode()


def mutate(data: bytes, op: str, u: float, k: int) -> bytes:
    """One mutation of ``data``; ``u`` in [0, 1) picks the place, ``k`` the variant."""
    pos = int(u * len(data)) if data else 0
    if op == "truncate":
        return data[:pos]
    if op == "flip":
        return data[:pos] + bytes([data[pos] ^ (k % 255 + 1)]) + data[pos + 1:] if data else data
    if op == "insert":
        return data[:pos] + JUNK[k % len(JUNK)] + data[pos:]
    if op == "delete":
        return data[:pos] + data[pos + 1 + k % 64:]
    if op == "token-swap":
        import re
        tokens = list(re.finditer(rb"\d+(?:\.\d+)?(?:ms|us|ns|s)?|\[\[[^\n]*?\]\]", data))
        if not tokens:
            return data
        m = tokens[int(u * len(tokens))]
        return data[:m.start()] + TOKENS[k % len(TOKENS)].encode() + data[m.end():]
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return mutate(data, "flip", u, k)
    paths = _nodes(doc)
    path = paths[int(u * len(paths))]
    if op == "json-grow":   # a list or a number grown absurdly (counts, repeats)
        node = _get(doc, path)
        if isinstance(node, list) and node:
            return _dumps(_set(doc, path, node * (2 + k % 40)))
        return _dumps(_set(doc, path, [10 ** (6 + k % 12), 10 ** 9, 1e9][k % 3]))
    return _dumps(_set(doc, path, HOSTILE[k % len(HOSTILE)]))


def apply(data: bytes, ops) -> bytes:
    for op, u, k in ops:
        data = mutate(data, op, u, k)
    return data


# ----------------------------------------------------------------------------- seeds
def make_torch_seeds(folder: Path) -> dict:
    """A real torch.profiler trace (+ .json.gz) and text-table log of a small conv net."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for step in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{step + 1}"):
                loss = nn.functional.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 2]))
                opt.zero_grad()
                loss.backward()
                opt.step()
    trace = folder / "trace.json"
    prof.export_chrome_trace(str(trace))
    table = folder / "table.log"
    table.write_text("epoch 0\n" + prof.key_averages(group_by_input_shape=True).table(row_limit=-1) + "\n")
    gz = folder / "trace.json.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    return {"trace": trace, "trace-gz": gz, "table": table}


def make_ascend_seed(folder: Path, window: int = 120) -> Path | None:
    """A real rank folder cut to a window of ~``window`` trace events (metadata kept)."""
    if not SHARED_RANK.is_dir():
        return None
    out = folder / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True, exist_ok=True)
    events = json.loads((SHARED_RANK / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    meta = [e for e in events if e.get("ph") == "M"]
    timed = sorted((e for e in events if e.get("ph") in ("X", "s", "f")), key=lambda e: float(e.get("ts", 0)))
    host = [i for i, e in enumerate(timed) if e.get("cat") == "cpu_op"]
    start = host[min(400, len(host) - 1)]    # past the data-loading start, inside the training loop
    kept = timed[start:start + window]
    for e in kept:
        stack = (e.get("args") or {}).get("Call stack")
        if isinstance(stack, str):
            e["args"]["Call stack"] = ";\r\n".join(stack.split(";\r\n")[-3:])
    (out / "trace_view.json").write_text(json.dumps(meta + kept))
    shutil.copy(SHARED_RANK / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv", out)
    shutil.copy(SHARED_RANK / "profiler_info_0.json", out.parent)
    return out.parent


def make_scan_seed(folder: Path) -> Path:
    """scan.json of `opscope scan examples/train_cnn.py` (2 steps), without its traces."""
    run = folder / "cnn_run"
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(ROOT / "examples" / "train_cnn.py"),
                           "--steps", "2", "--out", str(run), "--quiet", "--format", "json", "--",
                           "--epochs", "1", "--samples", "64"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"seed scan failed: {proc.stderr[-2000:]}")
    return run / "scan.json"


def scan_seed_bytes(scan_json: Path) -> bytes:
    """The scan without trace references, so the run folder loads from its operators."""
    data = json.loads(scan_json.read_text())
    data["traces"] = []
    return json.dumps(data).encode()


# ----------------------------------------------------------------------------- cases
class Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    def _raise(*_):
        raise Hang()
    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], timeout: float) -> tuple[str, int | None, str]:
    """(outcome, exit code, stderr) of ``opscope ARGV`` run in this process."""
    from opscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _deadline(timeout):
            code = main([str(a) for a in argv])
    except Hang:
        return "hang", None, err.getvalue()
    except SystemExit as exc:     # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001 - anything escaping main() is a crash
        return "crash", None, err.getvalue() + f"\nescaped main(): {exc!r}"
    text = err.getvalue()
    if code == 0 and "Traceback" not in text:
        return "ok", code, text
    lines = text.strip().splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("opscope: error:"):
        return "clean", code, text
    return "crash", code, text


TARGETS = ("trace", "trace-gz", "table", "ascend", "run", "report")


def build_case(target: str, seeds: dict, ops, workdir: Path, formats: str) -> list[str]:
    """Write the mutated input under ``workdir``; return the opscope command line for it."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    out = workdir / "out"
    if target in ("trace", "trace-gz", "table"):
        seed = seeds[target]
        data = seed.read_bytes()
        if target == "trace-gz" and ops and ops[0][2] % 2:   # mutate the JSON inside, then recompress
            data = gzip.compress(apply(gzip.decompress(data), ops))
        else:
            data = apply(data, ops)
        path = workdir / seed.name
        path.write_bytes(data)
        return ["diff", seeds["trace"], path, "--out", out, "--format", formats, "--quiet"]
    if target == "ascend":
        rank = workdir / "rank0_ascend_pt"
        shutil.copytree(seeds["ascend"], rank)
        files = [rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json",
                 rank / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv", rank / "profiler_info_0.json"]
        victim = files[ops[0][2] % len(files)] if ops else files[0]
        victim.write_bytes(apply(victim.read_bytes(), ops))
        return ["diff", seeds["trace"], rank, "--out", out, "--format", formats, "--quiet"]
    run = workdir / "run"
    run.mkdir()
    (run / "scan.json").write_bytes(apply(seeds["scan"], ops))
    if target == "run":
        return ["diff", run, seeds["trace"], "--out", out, "--format", formats, "--quiet"]
    return ["report", run, "--format", formats.replace("json", "json,md"), "-o", out]


def seeds_in(folder: Path, scan_json: Path | None = None) -> dict:
    seeds = make_torch_seeds(folder / "torch")
    ascend = make_ascend_seed(folder / "ascend")
    if ascend is not None:
        seeds["ascend"] = ascend
    seeds["scan"] = scan_seed_bytes(scan_json or make_scan_seed(folder))
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case-timeout", type=float, default=20.0)
    parser.add_argument("--scan", type=Path, help="reuse this scan.json as the scan seed")
    parser.add_argument("--show", type=int, default=5, help="print the first N crashes/hangs in full")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts = {"ok": 0, "clean": 0, "crash": 0, "hang": 0}
    shown = 0
    slowest = (0.0, None)
    with tempfile.TemporaryDirectory(prefix="opscope-fuzz-") as tmp:
        tmp = Path(tmp)
        seeds = seeds_in(tmp, args.scan)
        targets = [t for t in TARGETS if t != "ascend" or "ascend" in seeds]
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        for i in range(args.cases):
            target = targets[i % len(targets)]
            ops = [(rng.choice(OPS), rng.random(), rng.randrange(1 << 16)) for _ in range(rng.randint(1, 3))]
            formats = "html,xlsx,json" if i % 5 == 0 else "json"
            argv = build_case(target, seeds, ops, tmp / "case", formats)
            t0 = time.perf_counter()
            outcome, code, err = run_cli(argv, args.case_timeout)
            took = time.perf_counter() - t0
            slowest = max(slowest, (took, (target, ops)), key=lambda s: s[0])
            counts[outcome] += 1
            if outcome in ("crash", "hang") and shown < args.show:
                shown += 1
                print(f"--- {outcome} (exit {code}) {target} {ops}\n{err[-3000:]}", file=sys.stderr)
            if (i + 1) % 1000 == 0:
                print(f"{i + 1} cases: {counts}", file=sys.stderr)
        elapsed = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"cases {args.cases}: ok {counts['ok']}, clean error {counts['clean']}, crash {counts['crash']}, "
          f"hang {counts['hang']}; {elapsed:.0f} s ({1000 * elapsed / max(args.cases, 1):.0f} ms/case), "
          f"slowest case {slowest[0]:.2f} s; peak RSS {peak / 1024:.0f} MB "
          f"(after seeds {rss_before / 1024:.0f} MB)")
    return 1 if counts["crash"] or counts["hang"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
