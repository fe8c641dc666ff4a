"""Dynamic-shape root causes, the epoch-end note, a stable score and host-only work (issue 12).

Each test scans a script written like real training code (tests/data/scripts/) and
checks the exact root-cause lines and kinds it must produce.
"""
from __future__ import annotations

import pytest

from conftest import SCRIPTS, load_scan, run_opscope


def scan(tmp_path, script: str, steps: int, *args: str) -> dict:
    proc = run_opscope("scan", SCRIPTS / script, "--steps", steps, "--out", tmp_path, "--quiet", "--format", "",
                       "--", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_scan(tmp_path)


def line(script: str, text: str) -> str:
    lines = (SCRIPTS / script).read_text().splitlines()
    hits = [i for i, l in enumerate(lines, 1) if text in l]
    assert len(hits) == 1, (text, hits)
    return f"{script}:{hits[0]}"


def roots(result: dict) -> set:
    return {(rc["source"], rc["kind"]) for rc in result["root_causes"]}


def init_lines(script: str) -> set:
    lines = (SCRIPTS / script).read_text().splitlines()
    return {f"{script}:{i}" for i, l in enumerate(lines, 1) if "nn.init." in l}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_state_created_on_step_1_is_not_a_dynamic_shape(tmp_path, optimizer):
    # momentum buffers / Adam moments are made on the first step only (clone/zeros_like of every
    # parameter, rank 4 for the conv weight); later steps update them in place
    result = scan(tmp_path, "optim_state.py", 4, "--optimizer", optimizer)
    assert result["dynamic_shapes"] == [] and result["root_causes"] == []
    assert not any(op["dynamic"] for op in result["operators"])
    # drop_last=True and 64 samples in batches of 8: the epoch's end brings nothing new to see
    assert not any("end of the first epoch" in n for n in result["notes"])


@pytest.mark.parametrize("model", ["LSTM", "Transformer"])
def test_lm_bptt_names_the_slicing_line_and_no_weight_init(tmp_path, model):
    # 112 tokens in 4 columns = 28 rows: chunks of 8, 8, 8 and then 3 (step 4), then again
    result = scan(tmp_path, "lm_bptt.py", 6, "--model", model)
    script = "lm_bptt.py"
    data_slice = line(script, "data = source[i:i + seq_len]")
    assert roots(result) == {(data_slice, "slice")}
    rc = result["root_causes"][0]
    assert rc["cause"] == "input-varies" and "pad" in rc["suggestion"] and "drop_last" not in rc["suggestion"]
    assert {"values": [3, 8], "arg": 0, "dim": 0} in rc["varying_dims"]
    # the target slice passes on the same length; the model lines that only propagate it are
    # no root causes of their own (Transformer: positional-encoding slice, causal mask)
    related = set(rc["related"])
    assert line(script, "target = source[i + 1:") in related
    if model == "Transformer":
        assert {line(script, "self.pe[:x.size(0), :]"), line(script, "torch.tril(torch.ones(sz, sz))")} <= related
    blamed = {r["source"] for r in result["root_causes"]} | related | {d["root_cause"] for d in result["dynamic_shapes"]}
    assert not blamed & init_lines(script)
    assert all(d["root_cause"] == data_slice for d in result["dynamic_shapes"])
    assert {"aten::embedding", "aten::nll_loss_forward"} <= set(rc["ops"])


def test_partial_batch_not_reached_in_4_steps_is_said_and_not_advised(tmp_path):
    result = scan(tmp_path, "gru_tagger.py", 4)
    script = "gru_tagger.py"
    assert roots(result) == {(line(script, "criterion(logits[mask], labels[mask])"), "data-dependent-output")}
    assert not any("drop_last" in rc["suggestion"] for rc in result["root_causes"])
    assert not any("drop_last" in d["suggestion"] for d in result["dynamic_shapes"])
    note = next(n for n in result["notes"] if "end of the first epoch" in n)
    loader = line(script, "loader = DataLoader(")
    assert f"DataLoader at {loader}: 4 of its 5 batches were seen" in note
    assert "--steps 5 reaches the end of the epoch" in note and "last batch will hold 6" in note


def test_partial_batch_seen_in_10_steps_names_exactly_the_true_lines(tmp_path):
    result = scan(tmp_path, "gru_tagger.py", 10)
    script = "gru_tagger.py"
    loader = line(script, "loader = DataLoader(")
    mask_loss = line(script, "criterion(logits[mask], labels[mask])")
    assert roots(result) == {(loader, "partial-batch"), (mask_loss, "data-dependent-output")}
    by_source = {rc["source"]: rc for rc in result["root_causes"]}
    assert len(by_source) == len(result["root_causes"])  # each root cause once
    partial = by_source[loader]
    assert "drop_last=True" in partial["suggestion"]
    assert {"arg": 0, "dim": 0, "values": [6, 16]} in partial["varying_dims"]
    # the GRU's initial state (made inside nn.GRU from the batch size) only passes the size on
    assert partial["related"] == [line(script, "h, _ = self.gru(self.emb(tokens))")]
    assert {"aten::embedding", "aten::gru"} <= set(partial["ops"])
    # building the mask propagates the batch; the TensorDataset is not a cause of its own
    never = {line(script, "mask = tokens != PAD"), line(script, "return TensorDataset(tokens, labels)")}
    assert not never & {rc["source"] for rc in result["root_causes"]}
    assert not any("end of the first epoch" in n for n in result["notes"])
    assert result["summary"]["dynamic_root_causes"] == 2


def test_identical_scans_print_the_same_score(tmp_path):
    scores = []
    for i in range(3):
        out = tmp_path / str(i)
        proc = run_opscope("scan", "examples/train_huber.py", "--steps", "4", "--out", out, "--format", "")
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = load_scan(out)["summary"]
        assert summary["time_basis"].startswith("estimated NPU time per step")   # from shapes: never the clock
        score_lines = [l for l in proc.stdout.splitlines() if "readiness for torch_npu" in l]
        assert score_lines and f"{summary['readiness_score']}/100" in score_lines[0]
        scores.append(summary["readiness_score"])
    assert len(set(scores)) == 1, scores


@pytest.mark.parametrize("args, rule", [((), "host-tensors"), (("--no-cuda",), "setup-without-device")])
def test_host_side_sparse_setup_is_not_judged_as_npu_work(tmp_path, args, rule):
    result = scan(tmp_path, "gcn_sparse.py", 3, *args)
    script = "gcn_sparse.py"
    setup = {line(script, "return torch.sparse_coo_tensor(indices, values"),
             line(script, "indices = torch.from_numpy("), line(script, "values = torch.from_numpy(")}
    ops = [op for op in result["operators"] if op["source"] in setup]
    assert {"aten::sparse_coo_tensor", "aten::coalesce"} <= {op["name"] for op in ops}
    for op in ops:
        assert op["verdict"] == "not-applicable" and op["evidence"]["rule"] == rule, op
    assert not any(op["verdict"] == "unsupported" and op["phase"] == "other" for op in result["operators"])
    assert result["root_causes"] == []


def test_library_import_time_operators_are_not_applicable(tmp_path):
    result = scan(tmp_path, "import_probe.py", 3)
    imported = [op for op in result["operators"] if op["source"] == line("import_probe.py", "import probelib")]
    assert {"aten::arange", "aten::sum"} <= {op["name"] for op in imported}
    for op in imported:
        assert op["import_time"] and op["verdict"] == "not-applicable" and op["evidence"]["rule"] == "import-time"
    # the training step's own operators are still judged
    assert any(op["name"] == "aten::addmm" and op["verdict"] == "native" for op in result["operators"])


def test_size_read_back_with_item_is_the_root_cause(tmp_path):
    result = scan(tmp_path, "keep_confident.py", 6)
    script = "keep_confident.py"
    # full batches (drop_last=True); only the number of confident samples varies
    assert roots(result) == {(line(script, "n_keep = int((conf > args.threshold).sum().item())"), "host-sync")}
    rc = result["root_causes"][0]
    assert rc["cause"] == "host-sync" and "aten::cross_entropy_loss" in rc["ops"]


def test_collate_function_work_is_data_preparation_in_every_step(tmp_path):
    """What a DataLoader's collate function runs (pad_sequence, its copies and fills) is labelled
    data preparation ('other'), in step 1 as in the later ones, never forward work: the loader's
    fetch carries the ``opscope.dataloader`` range (a slip that dropped it went unnoticed)."""
    result = scan(tmp_path, "padded_tagger.py", 4)
    collate = [op for op in result["operators"] if op.get("source") == "padded_tagger.py:12"]
    assert collate and {op["phase"] for op in collate} == {"other"}
    assert any(1 in op["steps"] for op in collate)
