"""Framework training code (issue 20): where the user can act, phases by what runs, partial
batches under gradient accumulation and DistributedSampler, DDP's one-time bucket rebuild.

The scripts are written in the frameworks' idioms: `framework_trainer.py` runs a Trainer from a
stand-in framework installed under vendor/site-packages (its model, collator and loop are library
code, like transformers'); `hf_trainer_padding.py` runs the real Hugging Face Trainer when
transformers is installed.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import SCRIPTS, load_scan, run_opscope
from opscope.model import ScanResult, where_text

LIB = SCRIPTS / "vendor" / "site-packages"


def _hf_env() -> dict:
    """As tests/test_frameworks.py: this index's torchvision is a CUDA build that transformers imports,
    so the CPU shim goes first on PYTHONPATH (tests/data/scripts/frameworks/tv_shim)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    shim = str(SCRIPTS / "frameworks" / "tv_shim")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [shim, env.get("PYTHONPATH")]))
    return env


def scan(tmp_path, script: str, steps: int, *args: str, options=(), env: dict | None = None) -> dict:
    command = ["scan", SCRIPTS / script, "--steps", steps, "--out", tmp_path, "--quiet", "--format", "", *options,
               "--", *args]
    if env is None:
        proc = run_opscope(*command)
    else:
        proc = subprocess.run([sys.executable, "-m", "opscope", *map(str, command)], capture_output=True, text=True,
                              timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_scan(tmp_path)


def line(path: str, text: str, root=SCRIPTS) -> str:
    lines = (root / path).read_text().splitlines()
    hits = [i for i, l in enumerate(lines, 1) if text in l]
    assert len(hits) == 1, (text, hits)
    return f"{path}:{hits[0]}"


def ops_at(result: dict, library: str) -> list[dict]:
    return [op for op in result["operators"] if op["library"] == library]


def test_trainer_entry_leads_with_the_model_line_and_the_collator(tmp_path):
    # 92 samples in batches of 8: 12 batches, the last holding 4; 3 batches per optimizer step,
    # so step 4 holds two full batches and the partial one
    result = scan(tmp_path, "framework_trainer.py", 4, "--samples", "92", "--grad-accum", "3", "--fp16")
    entry = line("framework_trainer.py", "    trainer.train()")
    assert result["entry_lines"] == [entry]
    embed = line("minitrain/modeling.py", "self.embed(input_ids)", LIB)
    forward = [op for op in ops_at(result, embed) if op["phase"] == "forward"]
    assert {"aten::embedding", "aten::addmm"} <= {op["name"] for op in forward}
    assert all(op["source"] == entry for op in forward)
    assert where_text(entry, embed, result["entry_lines"]) == f"{embed} (under {entry})"
    # one root cause: the DataLoader the Trainer builds, padded by the collator
    assert len(result["root_causes"]) == 1, result["root_causes"]
    rc = result["root_causes"][0]
    assert rc["source"] == entry and rc["kind"] == "partial-batch"
    assert rc["library"] == line("minitrain/trainer.py", "return DataLoader(", LIB)
    assert rc["varied"] == "sequence length (dim 1), batch size (dim 0)"
    assert rc["set_by"].startswith("DataCollatorWithPadding(padding='longest'")
    assert line("minitrain/data_collator.py", "class DataCollatorWithPadding", LIB).split(":")[0] in rc["set_by"]
    assert 'padding="max_length"' in rc["suggestion"] and "pad_to_multiple_of" in rc["suggestion"]
    assert "drop_last=True" in rc["suggestion"]
    assert "rank" not in rc["varied"]
    # GradScaler's unscale_/step/update and gradient clipping are update work, not forward
    phase = {op["name"]: op["phase"] for op in result["operators"]}
    assert phase["aten::_amp_foreach_non_finite_check_and_unscale_"] == "optimizer"
    assert phase["aten::_amp_update_scale_"] == "optimizer"
    clip = line("minitrain/trainer.py", "clip_grad_norm_", LIB)
    assert ops_at(result, clip) and {op["phase"] for op in ops_at(result, clip)} == {"optimizer"}


@pytest.mark.parametrize("drop_last", [False, True])
def test_partial_batch_under_accumulation_is_found_on_every_operator(tmp_path, drop_last):
    # fixed padding: only the epoch's partial last batch (inside a step with two full ones) varies
    args = ["--samples", "92", "--grad-accum", "3", "--padding", "max_length"] + (["--drop-last"] if drop_last else [])
    result = scan(tmp_path, "framework_trainer.py", 4, *args)
    if drop_last:
        assert result["dynamic_shapes"] == [] and result["root_causes"] == []
        return
    (rc,) = result["root_causes"]
    assert rc["kind"] == "partial-batch" and rc["varied"] == "batch size (dim 0)"
    assert {"arg": 0, "dim": 0, "values": [4, 8]} in rc["varying_dims"]
    model_ops = {op["name"] for op in result["operators"] if (op["library"] or "").startswith("minitrain/modeling.py")
                 and op["phase"] in ("forward", "backward") and op["steps"] == [1, 2, 3, 4]}
    dynamic = {d["op"] for d in result["dynamic_shapes"]}
    assert {"aten::embedding", "aten::addmm", "aten::tanh", "aten::embedding_dense_backward"} <= dynamic
    shaped = {op["name"] for op in result["operators"] if op["dynamic"]}
    assert {"aten::embedding", "aten::tanh"} <= model_ops & shaped


def test_closure_step_forward_is_forward_and_epoch_hint_counts_optimizer_steps(tmp_path):
    # Lightning's automatic optimisation: optimizer.step(closure) runs forward and backward
    result = scan(tmp_path, "framework_trainer.py", 2, "--samples", "92", "--grad-accum", "3", "--closure-step")
    model = [op for op in result["operators"] if (op["library"] or "").startswith("minitrain/modeling.py")
             and op["phase"] != "other"]
    assert model and {op["phase"] for op in model} == {"forward", "backward"}
    # each step runs 3 micro-batches: 2 closures called directly, the last by the optimizer
    embedding = [op for op in result["operators"] if op["name"] == "aten::embedding"]
    assert sum(op["calls"] for op in embedding) == 6
    step_line = line("minitrain/trainer.py", "optimizer.step(closure)", LIB)
    own = {op["name"] for op in ops_at(result, step_line) if op["phase"] == "optimizer"}
    assert any(name.startswith("aten::_foreach_") or name in ("aten::lerp_", "aten::addcdiv_") for name in own), own
    for s in result["steps"]:
        assert s["phase_time_us"]["forward"] > 0 and s["phase_time_us"]["optimizer"] > 0, s
        assert s["phase_time_us"]["forward"] > s["phase_time_us"]["optimizer"], s
    # 2 steps x 3 batches seen of 12: 6 batches left = 2 more optimizer steps
    note = next(n for n in result["notes"] if "end of the first epoch" in n)
    assert "6 of its 12 batches were seen, 3 batches per optimizer step" in note
    assert "--steps 4 reaches the end of the epoch" in note and "the last batch will hold 4" in note


def test_ddp_bucket_rebuild_is_set_up_and_sampler_shares_are_per_rank(tmp_path):
    # a small bucket cap gives DDP several buckets, rebuilt in gradient-ready order after step 1
    result = scan(tmp_path / "a", "ddp_accumulate.py", 4, "--samples", "90", "--bucket-cap-mb", "0.1",
                  options=("--launcher", "torchrun", "--world-size", "2"))
    backward_line = line("ddp_accumulate.py", "scaler.scale(loss).backward()")
    assert not any(d["op"] == "aten::as_strided" and d["source"] == backward_line for d in result["dynamic_shapes"])
    assert any("changed shape once after step 1" in n and f"aten::as_strided at {backward_line}" in n
               for n in result["notes"])
    # the script's own GradScaler calls are update work
    scaler_ops = [op for op in result["operators"] if op["name"].startswith("aten::_amp_")]
    assert scaler_ops and {op["phase"] for op in scaler_ops} == {"optimizer"}
    # 90 samples over 2 ranks: 45 each, batches of 10, the 5th holds 5 (seen in step 3)
    assert {(rc["source"], rc["kind"]) for rc in result["root_causes"]} == {
        (line("ddp_accumulate.py", "loader = DataLoader("), "partial-batch")}
    short = scan(tmp_path / "b", "ddp_accumulate.py", 1, "--samples", "90",
                 options=("--launcher", "torchrun", "--world-size", "2"))
    note = next(n for n in short["notes"] if "end of the first epoch" in n)
    assert "2 of its 5 batches were seen, 2 batches per optimizer step" in note and "--steps 3 reaches" in note
    assert "DistributedSampler share is 45 samples of 2 ranks' in batches of 10: each rank's last batch will hold 5" in note


def test_collator_settings_left_unset_are_not_printed_as_none():
    from opscope.analysis.dynamic_shapes import _loader_advice
    from opscope.knowledge import load
    collate = {"name": "DataCollatorWithPadding", "where": "transformers/data/data_collator.py:225",
               "settings": {"padding": True, "max_length": None, "pad_to_multiple_of": None}}
    set_by = _loader_advice("loader-varies", {}, {"collate": collate}, [], "pad", load("dynamic_shapes.yaml"))[0]
    assert set_by == "DataCollatorWithPadding(padding=True) at transformers/data/data_collator.py:225"


def test_scan_json_without_the_new_fields_still_loads_and_renders():
    old = {"script": "train.py", "operators": [{"name": "aten::mm", "source": "train.py:3"}],
           "root_causes": [{"source": "train.py:9", "cause": "input-varies", "kind": "loader-varies"}],
           "findings": [{"rule": "r", "file": "train.py", "line": 4, "api": "torch.cuda", "message": "m"}]}
    result = ScanResult.from_dict(old)
    from opscope.report import view
    assert result.entry_lines == [] and result.operators[0].library is None
    assert view.where_of(result.operators[0], result) == "train.py:3"
    assert view.where_of(result.findings[0], result) == "train.py:4"
    assert view.root_cause_what(result.root_causes[0]) == "loader-varies"
    assert where_text("train.py:3", "pkg/model.py:7") == "train.py:3 (in pkg/model.py:7)"


def _hf_trainer_usable() -> bool:
    probe = "import transformers.models.bert.modeling_bert, transformers.trainer"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, env=_hf_env()).returncode == 0


@pytest.mark.skipif(not _hf_trainer_usable(), reason="transformers (with accelerate) is not installed/importable")
@pytest.mark.parametrize("padding", ["longest", "max_length"])
def test_hf_trainer_padding_collator_is_the_root_cause(tmp_path, padding):
    result = scan(tmp_path, "hf_trainer_padding.py", 4, "--max-steps", "4", "--padding", padding, env=_hf_env())
    entry = line("hf_trainer_padding.py", "trainer.train()")
    assert result["entry_lines"] == [entry]
    assert any((op["library"] or "").startswith("transformers/models/bert/modeling_bert.py:")
               for op in result["operators"] if op["phase"] == "forward")
    if padding == "max_length":   # fixed padding: the dynamic shapes vanish
        assert result["dynamic_shapes"] == [] and result["root_causes"] == []
        return
    (rc,) = result["root_causes"]
    assert rc["kind"] == "loader-varies" and rc["varied"] == "sequence length (dim 1)"
    assert rc["set_by"].startswith("DataCollatorWithPadding(padding='longest'")
    assert "transformers/data/data_collator.py" in rc["set_by"]
    assert 'padding="max_length"' in rc["suggestion"] and "pad_to_multiple_of" in rc["suggestion"]
    assert "built by Hugging Face Trainer at transformers/trainer.py:" in rc["evidence"]
    # the line to change is the collator's, which the user built and handed to the Trainer; the library line is
    # the Trainer's, which builds the loader from it (not accelerate's wrapper in it)
    collator = line("hf_trainer_padding.py", "collator = DataCollatorWithPadding(")
    assert rc["source"] == collator, rc
    assert f"the collator was built at {collator}, the DataLoader under {entry}" in rc["evidence"]
    assert rc["library"].startswith("transformers/trainer.py:")


def test_pad_sequence_in_a_collate_function_is_named(tmp_path):
    result = scan(tmp_path, "padded_tagger.py", 4)
    script = "padded_tagger.py"
    (rc,) = result["root_causes"]
    assert (rc["source"], rc["kind"]) == (line(script, "loader = DataLoader("), "loader-varies")
    assert rc["varied"] == "sequence length (dim 1)" and rc["library"] is None
    pad = line(script, "tokens = pad_sequence(")
    assert rc["set_by"] == f"pad_sequence at {pad} (in the collate function collate() at {line(script, 'def collate(')})"
    assert "pad_sequence result to N" in rc["suggestion"] and "drop_last" not in rc["suggestion"]


@pytest.mark.skipif(not _hf_trainer_usable(), reason="transformers (with accelerate) is not installed/importable")
def test_hf_trainer_partial_last_batch_is_fixed_with_training_arguments(tmp_path):
    # 100 samples in batches of 8: the 13th holds 4; 2 batches per step, so step 7 reaches it
    result = scan(tmp_path, "hf_trainer_padding.py", 7, "--max-steps", "7", "--samples", "100",
                  "--padding", "max_length", env=_hf_env())
    (rc,) = result["root_causes"]
    assert rc["kind"] == "partial-batch" and rc["varied"] == "batch size (dim 0)"
    assert "TrainingArguments(dataloader_drop_last=True)" in rc["suggestion"]
    assert "padding=" not in rc["suggestion"]


def test_ddp_spawn_rebuild_in_step_2_is_no_dynamic_shape(tmp_path):
    # drop_last=True and a fixed model: DDP's bucket rebuild in step 2's forward only adds calls
    result = scan(tmp_path, "ddp_spawn_train.py", 4, options=("--launcher", "spawn", "--world-size", "2"))
    assert result["complete"] and result["dynamic_shapes"] == [] and result["root_causes"] == []
