"""Parsers: every input format, from real artefacts (torch traces/tables made here, the
shared Ascend NPU output), plus truncated/corrupt input."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from opscope.errors import UserError
from opscope.parsers import detect_format, load_profile, load_profiles
from opscope.parsers.stream import TraceReader

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
ASCEND = SHARED / "data" / "ascend_profiles" / "alexnet_ddp_2rank" / "text" / "level1"
needs_shared = pytest.mark.skipif(not ASCEND.is_dir(), reason="../shared/data/ascend_profiles absent")

TINY_SCRIPT_STEPS = 3


def _train_and_profile(tmp: Path, target_dtype="long"):
    """A small conv net trained for a few steps under torch.profiler; returns (trace, table log)."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 7 * 7, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tables = []
    trace = tmp / "trace.json"

    def on_ready(prof):
        prof.export_chrome_trace(str(trace))
        tables.append(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total",
                                                                          row_limit=-1))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=TINY_SCRIPT_STEPS, repeat=1),
                 on_trace_ready=on_ready) as prof:
        for _ in range(TINY_SCRIPT_STEPS + 1):
            x = torch.randn(4, 3, 16, 16)
            y = torch.randint(0, 10, (4,), dtype=getattr(torch, target_dtype))
            loss = nn.functional.cross_entropy(model(x), y.long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    log = tmp / "train.log"
    log.write_text("epoch 0\n" + "\n".join(tables) + "\ndone\n", encoding="utf-8")
    return trace, log


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    return _train_and_profile(tmp_path_factory.mktemp("torch_prof"))


def test_chrome_trace_operators_phases_steps_and_folding(artefacts):
    trace, _ = artefacts
    assert detect_format(trace) == "chrome-trace"
    prof = load_profile(trace)
    names = {c.name for c in prof.calls}
    assert {"aten::conv2d", "aten::_convolution", "aten::addmm", "aten::convolution_backward"} <= names
    assert not [n for n in names if "mkldnn" in n or "::" not in n], "private/annotation events leaked"
    conv = next(c for c in prof.calls if c.name == "aten::_convolution")
    assert conv.input_shapes[0] == [4, 3, 16, 16] and conv.dtypes[0] == "float"
    assert conv.parent == "aten::convolution" and conv.phase == "forward"
    assert 0 < conv.self_time_us <= conv.total_time_us
    phases = {c.name: c.phase for c in prof.calls}
    assert phases["aten::convolution_backward"] == "backward"
    assert any(c.phase == "optimizer" for c in prof.calls)
    assert len(prof.steps) == TINY_SCRIPT_STEPS and all(s.duration_us > 0 for s in prof.steps)
    assert {c.step for c in prof.calls if c.name == "aten::addmm"} == {s.index for s in prof.steps}


def test_gzip_trace_parses_like_plain(artefacts, tmp_path):
    trace, _ = artefacts
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    plain, packed = load_profile(trace), load_profile(gz)
    assert [c.signature() for c in plain.calls] == [c.signature() for c in packed.calls]


def test_stream_reader_matches_json_load(artefacts):
    trace, _ = artefacts
    reader = TraceReader(trace)
    events = list(reader)
    assert events == json.loads(trace.read_text())["traceEvents"]
    assert "traceEvents" not in reader.header


def test_text_table_log_one_step_per_table(artefacts, tmp_path):
    trace, log = artefacts
    # the seeds print one table per step: three copies = three steps
    text = log.read_text()
    multi = tmp_path / "steps.log"
    multi.write_text(text + text + text)
    assert detect_format(multi) == "text-table"
    prof = load_profile(multi)
    assert [s.index for s in prof.steps] == [1, 2, 3]
    convs = [c for c in prof.calls if c.name == "aten::_convolution" and c.step == 1]
    assert sum(c.count for c in convs) == TINY_SCRIPT_STEPS and convs[0].input_shapes[0] == [4, 3, 16, 16]
    assert all("mkldnn" not in c.name for c in prof.calls)
    assert prof.metadata["has_phases"] is False
    # same operators and call counts as the trace of the same profiler run
    from collections import Counter
    from_trace = Counter(c.name for c in load_profile(trace).calls)
    from_table = Counter()
    for c in prof.calls:
        if c.step == 1:
            from_table[c.name] += c.count   # one record per table row, standing for its '# of Calls'
    assert from_table["aten::addmm"] == from_trace["aten::addmm"]


def test_text_table_truncated_names_kept(tmp_path):
    rule = "-" * 30 + "  " + "-" * 12 + "  " + "-" * 12
    text = "\n".join([rule, f"{'Name':>30}  {'Self CPU':>12}  {'# of Calls':>12}", rule,
                      f"{'aten::max_pool2d_with_indi...':>30}  {'1.500ms':>12}  {'3':>12}",
                      f"{'aten::relu':>30}  {'20.000us':>12}  {'2':>12}", rule, "Self CPU time total: 2.000ms", ""])
    path = tmp_path / "table.txt"
    path.write_text(text)
    prof = load_profile(path)
    pool = [c for c in prof.calls if c.name == "aten::max_pool2d_with_indi..."]
    assert len(pool) == 1 and pool[0].count == 3 and pool[0].self_time_us == pytest.approx(1500.0)
    assert prof.steps[0].duration_us == pytest.approx(2000.0)


def test_text_table_with_npu_columns_and_log_noise(tmp_path):
    """torch_npu's layout adds Self NPU / NPU total columns; other log lines sit between tables."""
    cols = [("Name", 36), ("Self CPU %", 12), ("Self CPU", 12), ("CPU total %", 12), ("CPU total", 12),
            ("CPU time avg", 12), ("Self NPU", 12), ("Self NPU %", 12), ("NPU total", 12), ("NPU time avg", 12),
            ("# of Calls", 12), ("Input Shapes", 40)]
    rule = "  ".join("-" * w for _, w in cols)

    def row(values):
        return "  ".join(f"{v:>{w}}" for v, (_, w) in zip(values, cols))

    table = [rule, row([c for c, _ in cols]), rule,
             row(["aten::convolution_backward", "10.00%", "2.000ms", "20.00%", "4.000ms", "1.000ms", "3.000ms",
                  "30.00%", "3.000ms", "750.000us", "4", "[[32, 64, 55, 55], [32, 3, 224, 224], [64, 3, 11, 11]]"]),
             row(["npu::npu_dtype_cast", "1.00%", "100.000us", "1.00%", "100.000us", "50.000us", "20.000us",
                  "1.00%", "20.000us", "10.000us", "2", "[[32], []]"]),
             row(["ProfilerStep*", "1.00%", "100.000us", "1.00%", "9.000ms", "9.000ms", "0.000us",
                  "0.00%", "0.000us", "0.000us", "1", "[]"]),
             rule, "Self CPU time total: 9.000ms", "Self NPU time total: 3.020ms", ""]
    log = tmp_path / "npu.log"
    log.write_text("\n".join(["Epoch: [0][ 1/10] loss 6.9"] + table + ["Epoch: [0][ 2/10] loss 6.8"] + table))
    prof = load_profile(log)
    assert prof.device == "npu" and [s.index for s in prof.steps] == [1, 2]
    assert prof.steps[0].duration_us == pytest.approx(9000.0)
    conv = [c for c in prof.calls if c.name == "aten::convolution_backward" and c.step == 2]
    assert len(conv) == 1 and conv[0].count == 4 and conv[0].device_time_us == pytest.approx(3000.0)
    assert conv[0].input_shapes[2] == [64, 3, 11, 11]
    assert {c.name for c in prof.calls} == {"aten::convolution_backward", "npu::npu_dtype_cast"}


@needs_shared
def test_ascend_rank_folder():
    rank0 = ASCEND / "rank0_ascend_pt"
    assert detect_format(rank0) == "ascend"
    prof = load_profile(rank0)
    assert prof.device == "npu" and prof.rank == 0 and prof.source_format == "ascend"
    assert [s.index for s in prof.steps] == [50]
    names = {c.name for c in prof.calls}
    assert {"aten::conv2d", "aten::convolution_backward", "npu::npu_dtype_cast", "c10d::allreduce_"} <= names
    assert not [n for n in names if n.startswith("aclnn") or "::" not in n]
    conv = next(c for c in prof.calls if c.name == "aten::_convolution")
    assert conv.input_shapes[:3] == [[32, 3, 224, 224], [64, 3, 11, 11], [64]]
    assert len(conv.input_shapes) == len(conv.dtypes)
    assert conv.device_time_us > 0 and conv.source == "main.py:354"
    # backward runs on the autograd thread outside ProfilerStep#50: step comes from its time window
    bwd = [c for c in prof.calls if c.name == "aten::convolution_backward"]
    assert {c.phase for c in bwd} == {"backward"} and {c.step for c in bwd} == {50}
    kernels = {k["kernel"]: k for k in prof.metadata["inserted_kernels"]}
    assert kernels["TransData"]["calls"] == 57       # op_statistic.csv says 57 TransData
    assert prof.metadata["device_step_breakdown_us"][0]["Stage"] == pytest.approx(136581.0)


@needs_shared
def test_ascend_parent_folder_gives_every_rank():
    assert detect_format(ASCEND) == "ascend-ranks"
    profiles = load_profiles(ASCEND)
    assert [p.rank for p in profiles] == [0, 1]
    assert load_profile(ASCEND).rank == 0


@needs_shared
def test_ascend_device_time_matches_kernel_details():
    """Kernel time charged to operators = compute kernels of kernel_details.csv + async memcpys
    (which kernel_details leaves out) + the HCCL collectives, which go to c10d::allreduce_
    (async_npu flow to HcclAllreduce); what stays unattributed is a small remainder."""
    import pandas as pd

    out = ASCEND / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    prof = load_profile(ASCEND / "rank0_ascend_pt")
    details = pd.read_csv(out / "kernel_details.csv")
    is_hcom = details["Type"].str.startswith("hcom")
    compute = details.loc[~is_hcom, "Duration(us)"].sum()
    hcom = details.loc[is_hcom, "Duration(us)"].sum()
    memcpy = sum(float(e.get("dur", 0)) for e in TraceReader(out / "trace_view.json")
                 if e.get("ph") == "X" and e.get("name") == "MEMCPY_ASYNC")
    charged = sum(c.device_time_us for c in prof.calls)
    unattributed = prof.metadata["device_time_unattributed_us"]
    assert charged + unattributed == pytest.approx(compute + memcpy + hcom, rel=0.001)
    allreduce = sum(c.device_time_us for c in prof.calls if c.name == "c10d::allreduce_")
    assert allreduce == pytest.approx(hcom, rel=1e-6) and hcom == pytest.approx(105991.876, rel=1e-6)
    stage = pd.read_csv(out / "step_trace_time.csv").iloc[0]
    assert unattributed < 0.05 * stage["Stage"]
    # the device split equals msprof-analyze's step_trace_time.csv
    split = prof.metadata["device_steps"][0]
    assert split["step"] == 50
    for ours, theirs in [("computing_us", "Computing"), ("communication_us", "Communication"),
                         ("overlapped_us", "Overlapped"), ("communication_not_overlapped_us",
                                                           "Communication(Not Overlapped)"),
                         ("free_us", "Free"), ("device_span_us", "Stage"), ("preparing_us", "Preparing")]:
        assert split[ours] == pytest.approx(stage[theirs], abs=0.1), ours
    assert split["computing_us"] == pytest.approx(compute, abs=0.1)


def _expect_user_error(path):
    with pytest.raises(UserError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and "accepted inputs" in message and "\n" not in message
    assert info.value.exit_code == 2
    return message


def test_truncated_trace_is_a_one_line_error(artefacts, tmp_path):
    trace, _ = artefacts
    cut = tmp_path / "cut.json"
    data = trace.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert "truncated" in _expect_user_error(cut)
    bad_gz = tmp_path / "bad.json.gz"
    bad_gz.write_bytes(gzip.compress(data)[:200])
    _expect_user_error(bad_gz)


def test_unknown_and_missing_inputs(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("loss 1.2\nloss 1.1\n")
    _expect_user_error(junk)
    _expect_user_error(tmp_path / "missing.json")
    _expect_user_error(tmp_path)                  # a folder with nothing opscope knows
    (tmp_path / "scan.json").write_text('{"schema": "something/else"}')
    _expect_user_error(tmp_path)
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": []}')
    _expect_user_error(empty)
