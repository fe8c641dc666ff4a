"""opscope diff: the issue's acceptance (CPU scan of the AlexNet example vs the real NPU
run), dtype/shape/call-count changes, fallbacks, ranks, reports and CLI errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opscope.analysis.diff.profiles import diff_profiles, fallbacks_from_log
from opscope.cli import main
from opscope.parsers import load_profile, load_profiles

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
NPU_RANKS = SHARED / "data" / "ascend_profiles" / "alexnet_ddp_2rank" / "text" / "level1"
needs_shared = pytest.mark.skipif(not NPU_RANKS.is_dir(), reason="../shared/data/ascend_profiles absent")


@pytest.fixture(scope="module")
def alexnet_cpu_run(tmp_path_factory) -> Path:
    """examples/train_alexnet.py scanned on the CPU for 2 steps (small batch to stay fast)."""
    out = tmp_path_factory.mktemp("alexnet_cpu")
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(ROOT / "examples" / "train_alexnet.py"),
                           "--steps", "2", "--out", str(out), "--quiet", "--", "-b", "4", "--samples", "16",
                           "--dummy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@needs_shared
def test_acceptance_cpu_scan_vs_real_npu_run(alexnet_cpu_run, tmp_path, capsys):
    out = tmp_path / "diff"
    code = main(["diff", str(alexnet_cpu_run), str(NPU_RANKS), "--batch-size", "4,32", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Inserted by the NPU stack" in printed and "Step time and throughput" in printed
    data = json.loads((out / "diff.json").read_text())
    assert (out / "diff.html").stat().st_size > 0 and (out / "diff.xlsx").stat().st_size > 0
    rows = data["operators"]
    # the ATen operators of AlexNet match up (same name+phase; batch size differs -> shape change)
    matched = {(r["name"], r["phase"]) for r in rows if r["status"] in ("same", "changed")}
    for op in [("aten::conv2d", "forward"), ("aten::_convolution", "forward"), ("aten::relu_", "forward"),
               ("aten::max_pool2d_with_indices", "forward"), ("aten::addmm", "forward"),
               ("aten::convolution_backward", "backward"), ("aten::threshold_backward", "backward"),
               ("aten::max_pool2d_with_indices_backward", "backward"), ("aten::mm", "backward")]:
        assert op in matched, op
    conv = next(r for r in rows if r["name"] == "aten::conv2d" and r["input_shapes_b"][1] == [64, 3, 11, 11])
    assert conv["input_shapes_a"][1] == [64, 3, 11, 11] and conv["input_shapes_a"][0][0] == 4
    assert conv["input_shapes_b"][0][0] == 32 and conv["calls_a"] == conv["calls_b"] == 1
    # NPU-only casts / format operators are listed as inserted, with time and trigger
    inserted = {i["name"]: i for i in data["inserted"]}
    assert inserted["npu::npu_dtype_cast"]["kind"] == "operator"
    assert inserted["TransData"]["device_us"] > 1000 and "aten::_convolution" in inserted["TransData"]["triggered_by"]
    # 7 npu_dtype_cast calls: 5 inserted under convolution_backward, 2 are the user's own casts
    # (aten::to called from main.py): folded into that aten::to, not counted as inserted
    casts = [r for r in rows if r["name"] == "npu::npu_dtype_cast"]
    assert sum(r["calls_b"] for r in casts) == 7
    assert sum(r["calls_b"] for r in casts if r["status"] == "inserted") == 5
    assert {r["parent"] for r in casts if r["status"] != "inserted"} == {"aten::to"}
    assert inserted["npu::npu_dtype_cast"]["triggered_by"] == ["aten::convolution_backward"]
    # Cast kernels of every naming family (aclnnTopk_CastAiCore_Cast, ...) = kernel_details.csv's Type
    import csv
    with open(NPU_RANKS / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="") as fh:
        types = [row["Type"] for row in csv.DictReader(fh)]
    assert inserted["Cast"]["calls"] == types.count("Cast") == 4
    assert inserted["TransData"]["calls"] == types.count("TransData") == 57
    assert "aten::topk" in inserted["Cast"]["triggered_by"]
    # CPU-private ops are folded, never reported as missing on the NPU
    missing = [o["name"] for o in data["only_a"]] + [r["name"] for r in rows if r["status"] == "only-a"]
    assert not [n for n in missing if "mkldnn" in n or "nnpack" in n or "slow_conv" in n]
    assert not [n for n in (o["name"] for o in data["only_b"]) if n.startswith("aclnn") or "::" not in n]
    # decompositions folded, set-up left out: "only in CPU" holds no child of a matched operator
    # and no set-up/data-loading operator; no fractional per-step counts
    only_a = {o["name"]: o for o in data["only_a"]}
    for child in ("aten::clamp_min_", "aten::fill_", "aten::bernoulli_", "aten::zero_", "aten::normal_",
                  "aten::uniform_", "aten::randn", "aten::random_", "aten::randint", "aten::stack", "aten::cat"):
        assert child not in only_a, child
    assert all(o["under"] is None for o in data["only_a"] + data["only_b"])
    assert all(float(o["calls"]).is_integer() for o in data["only_a"] + data["only_b"])
    folded = {(f["parent"], f["name"]) for f in data["folded"]}
    assert ("aten::relu_", "aten::clamp_min_") in folded and ("aten::dropout", "aten::bernoulli_") in folded
    assert ("aten::dropout", "npu::_npu_dropout") in folded
    # the stand-in runs the optimizer as the GPU and the NPU do (foreach, not the per-parameter loop of CPU
    # tensors): its kernels are matched, neither side holds them alone
    assert "aten::add" not in only_a
    assert not [o for o in data["only_b"] if o["name"].startswith("aten::_foreach_")]
    # the Ascend trace records a TensorList without shapes: paired, and not reported as a shape change
    assert any(r["name"] == "aten::_foreach_add_" and r["status"] == "same" for r in rows)
    # dtype changes: only the real one (max-pool indices int64 -> int8 mask), reported once
    assert len(data["dtype_changes"]) <= 2
    pool = [d for d in data["dtype_changes"] if d["name"] == "aten::max_pool2d_with_indices_backward"]
    assert len(pool) == 1 and (pool[0]["a"], pool[0]["b"]) == ("long int", "signed char")
    assert pool[0]["signatures"] == 3 and "int8" in pool[0]["cause"]
    # the batch copied to the NPU is a transfer, not a copy_ paired with an unrelated CPU op
    moved = data["transfers"][1]["items"]
    assert {(t["shape"][0] if t["shape"] else None, t["dtype"]) for t in moved} == {(32, "float"), (32, "long int")}
    assert not [r for r in rows if r["name"] == "aten::copy_" and r["status"] == "changed"
                and (r["input_shapes_b"] or [[]])[0] == [32, 3, 224, 224]]
    # step time / FPS per side with its own batch size: CPU 4 / its step, NPU 32 x 8 devices / its step (the
    # export holds ranks 0 and 1 of an all-reduce over 8: communication_matrix.json's HCCL group)
    assert data["a"]["step"]["warmup_steps"] == [1] and data["a"]["step"]["measured_steps"] == [2]
    scan = json.loads((alexnet_cpu_run / "scan.json").read_text())
    cpu_step2 = next(s["duration_us"] for s in scan["steps"] if s["index"] == 2)
    assert data["a"]["step"]["fps"] == pytest.approx(4 / (cpu_step2 / 1e6), rel=1e-3)
    assert data["a"]["step"]["batch_size"] == 4 and data["b"]["step"]["batch_size"] == 32
    npu_step = data["b"]["step"]
    assert npu_step["devices"] == 8 and npu_step["fps"] == pytest.approx(32 * 8 / (155985.8 / 1e6), rel=1e-3)
    # the two NPU ranks compared with each other: rank 0 has the longer host step because it
    # *waits* for rank 1 at the first allreduce; rank 0 is not the slow rank
    ranks = data["ranks"]["b"]
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1] and ranks["slow_rank"] != 0
    assert ranks["longest_host_step_rank"] == 0 and ranks["latest_arrival_rank"] == 1
    assert ranks["imbalance_pct"] == pytest.approx(100 * (155985.8 - 153888.39) / 153888.39, abs=0.01)


def _profile_run(tmp: Path, name: str, index_dtype: str, extra_relu: bool):
    """A small embedding+MLP job profiled per step; the variant changes a dtype and a call count."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    emb, lin = nn.Embedding(50, 16), nn.Linear(16, 4)
    opt = torch.optim.SGD(list(emb.parameters()) + list(lin.parameters()), lr=0.1)
    trace = tmp / f"{name}.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
        for _ in range(3):
            idx = torch.randint(0, 50, (8,), dtype=getattr(torch, index_dtype))
            h = emb(idx)
            if extra_relu:
                h = torch.relu(h)
            loss = lin(torch.relu(h)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return trace


def test_dtype_and_call_count_changes_between_two_traces(tmp_path):
    before = load_profile(_profile_run(tmp_path, "before", "int64", False))
    after = load_profile(_profile_run(tmp_path, "after", "int32", True))
    result = diff_profiles(before, after, label_a="before", label_b="after", batch_size=8)
    emb_changes = [d for d in result.dtype_changes if d["name"] == "aten::embedding"]
    assert emb_changes and emb_changes[0]["a"] == "long int" and emb_changes[0]["b"] == "int"
    relu = [c for c in result.call_count_changes if c["name"] == "aten::relu" and c["phase"] == "forward"]
    assert relu and relu[0]["calls_a"] == 1 and relu[0]["calls_b"] == 2
    assert not result.only_a and not result.inserted and not result.fallbacks
    assert result.a["step"]["fps"] == pytest.approx(8 / (result.a["step"]["avg_step_us"] / 1e6), rel=1e-3)
    same = diff_profiles(before, before)
    assert {r.status for r in same.operators} == {"same"} and not same.call_count_changes


def test_text_table_matches_trace_of_the_same_run(tmp_path):
    """A key_averages table (no phases, no dtypes, truncated names) diffed against a trace."""
    trace = _profile_run(tmp_path, "run", "int64", False)
    prof = load_profile(trace)
    rule = "-" * 34 + "  " + "-" * 12 + "  " + "-" * 12
    lines = [rule, f"{'Name':>34}  {'Self CPU':>12}  {'# of Calls':>12}", rule]
    from collections import Counter
    n_steps = len(prof.steps)
    for name, count in Counter(c.name for c in prof.calls).items():
        shown = name if len(name) <= 34 else name[:31] + "..."
        lines.append(f"{shown:>34}  {'10.000us':>12}  {count // n_steps:>12}")
    lines += [rule, "Self CPU time total: 1.000ms", ""]
    table = tmp_path / "table.log"
    table.write_text("\n".join(lines))
    result = diff_profiles(prof, load_profile(table))
    assert not result.only_a and not result.only_b, (result.only_a, result.only_b)
    assert any("phase" in n for n in result.notes)


def test_fallback_warnings_in_a_log():
    log = ("[W VariableFallbackKernel.cpp] Warning: CAUTION: The operator 'aten::_ctc_loss' is not currently "
           "supported on the NPU backend and will fall back to run on the CPU. This may have performance "
           "implications.\n" * 3 + "Warning: The operator 'aten::unique2' is not currently supported on the NPU "
           "backend and will fall back to run on the CPU.\n")
    found = {f["op"]: f["count"] for f in fallbacks_from_log(log)}
    assert found == {"aten::_ctc_loss": 3, "aten::unique2": 1}


@needs_shared
def test_rank_against_rank(tmp_path):
    """Before/after style: rank 1 vs rank 0 of the same NPU run matches almost everything exactly."""
    r0, r1 = load_profiles(NPU_RANKS)
    result = diff_profiles(r0, r1, label_a="rank0", label_b="rank1")
    statuses = [r.status for r in result.operators]
    assert statuses.count("same") > 0.8 * len(statuses)
    assert {i["name"] for i in result.inserted} == {"TransData", "Cast"}     # B's kernels; A's listed too
    assert any(i["side"] == "rank0" for i in result.inserted)
    assert result.identical        # the ranks run the same operators; only their timing differs


@needs_shared
def test_a_run_against_itself_has_no_differences(tmp_path, capsys):
    rank0 = str(NPU_RANKS / "rank0_ascend_pt")
    assert main(["diff", rank0, rank0, "--out", str(tmp_path), "--format", "json"]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "diff.json").read_text())
    assert data["identical"] and "no differences" in printed and "Where the time went" not in printed
    assert not (data["only_a"] or data["only_b"] or data["dtype_changes"] or data["call_count_changes"])


def test_cli_errors_are_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur"')
    good = tmp_path / "missing_dir"
    assert main(["diff", str(broken), str(good), "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert main(["diff", str(broken), str(broken), "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("opscope: error:") for line in err)
    assert "accepted inputs" in err[-1] and "broken.json" in err[-1]
    proc = subprocess.run([sys.executable, "-m", "opscope", "diff", str(broken), str(broken)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_reports_escape_operator_names_and_keep_text_as_text(tmp_path):
    from openpyxl import load_workbook

    from opscope.model import OpCall, Profile, Step
    from opscope.report.diff_html import write_diff_html
    from opscope.report.diff_xlsx import write_diff_xlsx

    evil = "evil::<script>alert(1)</script>"
    a = Profile(calls=[OpCall(name="aten::mm", input_shapes=[[2, 3], [3, 4]], dtypes=["float", "float"], step=1,
                              self_time_us=5.0, total_time_us=5.0)], steps=[Step(index=1, duration_us=10.0)])
    b = Profile(calls=[OpCall(name="aten::mm", input_shapes=[[2, 3], [3, 4]], dtypes=["c10::Half", "c10::Half"],
                              step=1, self_time_us=1.0, device_time_us=2.0, device="npu"),
                       OpCall(name=evil, step=1), OpCall(name="=HYPERLINK(\"x\")::op", step=1)],
                steps=[Step(index=1, duration_us=4.0)], device="npu")
    result = diff_profiles(a, b, label_a="<b>gpu</b>", label_b="npu", batch_size=2)
    assert result.dtype_changes[0]["a"] == "float" and result.dtype_changes[0]["b"] == "c10::Half"
    html = write_diff_html(result, tmp_path / "diff.html").read_text()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html and "<b>gpu</b>" not in html
    wb = load_workbook(write_diff_xlsx(result, tmp_path / "diff.xlsx"))
    assert {"Summary", "Operators", "Only in B", "Inserted", "CPU fallbacks", "Steps", "Ranks"} <= set(wb.sheetnames)
    cells = [c.value for row in wb["Only in B"].iter_rows(min_row=2) for c in row]
    assert '=HYPERLINK("x")::op' in cells and wb["Only in B"]["A2"].data_type == "s"


def _raw_rank(rank: int) -> dict:
    """Hand sums over one rank's raw msprof files (kernel_details, step_trace_time, communication.json)."""
    import csv

    out = NPU_RANKS / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    with open(out / "kernel_details.csv", newline="") as fh:
        kernels = list(csv.DictReader(fh))
    with open(out / "step_trace_time.csv", newline="") as fh:
        stage = next(csv.DictReader(fh))
    comm = json.loads((out / "communication.json").read_text())
    sync = sum(info["Communication Time Info"]["Synchronization Time(ms)"] * 1000
               for step in comm.values() for op, info in step["collective"].items() if op != "Total Op Info")
    return {"hcom": sum(float(k["Duration(us)"]) for k in kernels if k["Type"].startswith("hcom")),
            "compute": sum(float(k["Duration(us)"]) for k in kernels if not k["Type"].startswith("hcom")),
            "stage": {k: float(v) for k, v in stage.items()}, "sync": sync}


@needs_shared
def test_npu_ranks_communication_step_split_and_slow_rank(tmp_path):
    """Issue 14: communication attributed to c10d::allreduce_, device split as msprof-analyze,
    host vs device step, and the slow rank is the one that arrives late, not the one that waits."""
    raw = [_raw_rank(0), _raw_rank(1)]
    out = tmp_path / "diff"
    assert main(["diff", str(NPU_RANKS / "rank0_ascend_pt"), str(NPU_RANKS / "rank1_ascend_pt"),
                 "--batch-size", "32", "--out", str(out), "--quiet", "--format", "json"]) == 0
    data = json.loads((out / "diff.json").read_text())
    for side, hand in zip((data["a"], data["b"]), raw):
        allreduce = sum(r["device_b_us" if side is data["b"] else "device_a_us"] for r in data["operators"]
                        if r["name"] == "c10d::allreduce_")
        assert allreduce == pytest.approx(hand["hcom"], rel=0.05)
        assert side["device_time_unattributed_us"] < 0.05 * hand["stage"]["Stage"]
        split = side["step"]["device_split_us"]
        assert split["computing_us"] == pytest.approx(hand["compute"], abs=1)
        assert split["computing_us"] == pytest.approx(hand["stage"]["Computing"], abs=1)
        assert split["communication_us"] == pytest.approx(hand["stage"]["Communication"], abs=1)
        assert split["free_us"] == pytest.approx(hand["stage"]["Free"], abs=1)
        # both step times, labelled: host ProfilerStep span and device span (msprof E2E = Stage)
        assert side["step"]["avg_device_step_us"] == pytest.approx(hand["stage"]["Stage"], abs=1)
        assert side["step"]["avg_host_step_us"] - side["step"]["avg_device_step_us"] == pytest.approx(
            hand["stage"]["Preparing"], abs=2500)         # Preparing + the host tail after the last kernel
        assert "host span" in side["step"]["host_step_label"] and "Stage" in side["step"]["device_step_label"]
        coll = side["collectives"][0]
        assert coll["op"] == "c10d::allreduce_" and coll["calls"] == 4
    # identical operator names -> no zero-delta noise between the ranks' operator list shapes
    # a folder of ranks: wait = msprof-analyze's synchronisation time; rank 0 waits, rank 1 arrives late
    assert main(["diff", str(NPU_RANKS / "rank0_ascend_pt"), str(NPU_RANKS), "--out", str(out),
                 "--quiet", "--format", "json"]) == 0
    ranks = json.loads((out / "diff.json").read_text())["ranks"]["b"]
    by_rank = {r["rank"]: r for r in ranks["ranks"]}
    for rank in (0, 1):
        assert by_rank[rank]["wait_us"] == pytest.approx(raw[rank]["sync"], abs=100)
    mean_stage = (raw[0]["stage"]["Stage"] + raw[1]["stage"]["Stage"]) / 2
    expected_slow = 1 if (raw[0]["sync"] - raw[1]["sync"]) / mean_stage > 0.05 else None
    assert ranks["slow_rank"] == expected_slow and ranks["slow_rank"] != 0
    assert ranks["latest_arrival_rank"] == 1 and "threshold" in ranks["slow_rank_reason"]


@needs_shared
def test_operator_counts_and_device_time_match_operator_details():
    """Per operator: call counts equal operator_details.csv (msprof-analyze's per-operator
    source) exactly; device time equals its 'Device Total Duration' for operators with no
    nested operator launching kernels, and never exceeds it (c10d::allreduce_ included)."""
    from collections import Counter, defaultdict

    from opscope.parsers.rules import rules

    folder = NPU_RANKS / "rank0_ascend_pt"
    kind = rules().kind
    counts, total = Counter(), defaultdict(float)
    with open(folder / "ASCEND_PROFILER_OUTPUT" / "operator_details.csv", newline="") as fh:
        import csv
        for row in csv.DictReader(fh):
            if kind(row["Name"]) == "op":
                counts[row["Name"]] += 1
                total[row["Name"]] += float(row["Device Total Duration(us)"])
    prof = load_profile(folder)
    assert Counter(c.name for c in prof.calls) == counts
    ours = defaultdict(float)
    for c in prof.calls:
        ours[c.name] += c.device_time_us
    parents = defaultdict(set)
    for c in prof.calls:
        if c.parent:
            parents[c.name].add(c.parent)
    nests_device_work = {c.parent for c in prof.calls if c.device_time_us > 0 and c.parent}
    todo = list(nests_device_work)
    while todo:                      # every ancestor of an operator that launched device work
        for parent in parents[todo.pop()] - nests_device_work:
            nests_device_work.add(parent)
            todo.append(parent)
    checked = 0
    for name in counts:
        assert ours[name] <= total[name] + 0.01, name
        if name not in nests_device_work:
            assert ours[name] == pytest.approx(total[name], abs=0.01), name
            checked += 1
    assert checked > 20 and ours["c10d::allreduce_"] == pytest.approx(total["c10d::allreduce_"], abs=0.01)


def test_batch_size_per_side_and_its_errors(capsys):
    from opscope.commands.diff import _batch_sizes
    from opscope.errors import UserError

    assert _batch_sizes("32") == (32, 32) and _batch_sizes("8,32") == (8, 32)
    assert _batch_sizes(",32") == (None, 32) and _batch_sizes(None) == (None, None)
    for bad in ("0", "8,x", "1,2,3", ",", "-4"):
        with pytest.raises(UserError):
            _batch_sizes(bad)


def test_batch_size_guess_skips_tensor_list_inputs():
    """A TensorList input (a list of four shapes) is not a 4-D batch: the guess takes the real one
    (``opscope diff RUN TRACE`` of a GRU tagger crashed comparing a list with 0)."""
    from opscope.analysis.diff.steps import batch_size_of
    from opscope.model import OpCall, Profile
    calls = [OpCall(name="aten::gru", input_shapes=[[8, 18, 16], [[48, 16], [48, 16], [48], [48]]], phase="forward"),
             OpCall(name="aten::conv2d", input_shapes=[[6, 3, 32, 32], [16, 3, 3, 3]], phase="forward")]
    size, how = batch_size_of(Profile(calls=calls, device="cpu"))
    assert size == 6 and "conv2d" in how
