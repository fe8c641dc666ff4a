"""The parent<->child contract (``capture/protocol.py``): what the parent writes, the child reads back
exactly, and anything else stops the run with an error that names the key."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opscope.capture.protocol import DistributedPlan, ProtocolError, ScanPlan


def _plan(tmp_path, **fields) -> ScanPlan:
    return ScanPlan(script=str(tmp_path / "train.py"), argv=("--lr", "0.1"), out_dir=str(tmp_path / "out"),
                    steps=3, **fields)


def test_a_plan_survives_its_json_unchanged(tmp_path):
    dist = DistributedPlan(launcher="torchrun", world_size=4, ranks=(0, 2), local_rank_flag="--local_rank",
                           detected="torchrun")
    plan = _plan(tmp_path, device="cpu", plugins=("pkg.mod:install",), settings={"steps": 3, "timeout": 9.5},
                 target="2.8.0", timeout=9.5, max_step_calls=100, mode="fake", distributed=dist).started()
    again = ScanPlan.from_json(plan.to_json())
    assert again == plan and again.distributed == dist
    assert isinstance(again.argv, tuple) and isinstance(again.distributed.ranks, tuple)   # lists in the JSON
    assert json.loads(plan.to_json())["distributed"]["ranks"] == [0, 2]
    assert Path(again.script).is_absolute() and again.started_epoch > 0 and again.started_at.endswith("+00:00")


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(remap=True), "unknown key(s) 'remap'"),
    (lambda d: d.pop("target"), "missing key(s) 'target'"),
    (lambda d: d.update(steps="3"), "ScanPlan.steps: expected int, got str"),
    (lambda d: d.update(steps=True), "ScanPlan.steps: expected int, got bool"),
    (lambda d: d.update(argv=["a", 1]), "ScanPlan.argv[1]: expected str"),
    (lambda d: d.update(settings=[]), "ScanPlan.settings: expected dict"),
    (lambda d: d.update(distributed={"launcher": "spawn"}), "missing key(s) 'world_size'"),
    (lambda d: d.update(distributed={"launcher": "spawn", "world_size": 2, "ranks": [0, "1"],
                                     "local_rank_flag": None, "detected": "spawn"}),
     "DistributedPlan.ranks[1]: expected int"),
])
def test_a_plan_that_does_not_match_the_fields_is_refused_naming_the_key(tmp_path, change, words):
    data = _plan(tmp_path).to_dict()
    change(data)
    with pytest.raises(ProtocolError) as err:
        ScanPlan.from_dict(data)
    assert words in str(err.value)
    with pytest.raises(ProtocolError, match="not JSON"):
        ScanPlan.from_json("{")


def test_each_torchrun_rank_gets_its_folder_its_local_rank_and_its_settings(tmp_path):
    dist = DistributedPlan(launcher="torchrun", world_size=3, ranks=(0, 2), local_rank_flag="--local_rank",
                           detected="torchrun")
    plan = _plan(tmp_path, analyse=True, settings={"steps": 3}, distributed=dist).started()
    rank0, rank1, rank2 = (plan.for_rank(r) for r in range(3))
    assert rank0.out_dir == plan.out_dir and rank0.capture and rank0.analyse
    assert rank1.out_dir == str(Path(plan.out_dir) / "capture" / "ranks" / "rank1")
    assert not rank1.capture and not rank1.analyse
    assert rank2.out_dir == str(Path(plan.out_dir) / "rank2") and rank2.capture
    assert rank2.argv == ("--lr", "0.1", "--local_rank=2") and rank2.settings == {"steps": 3, "rank": 2}
    assert plan.settings == {"steps": 3} and plan.rank is None   # the run's own plan is untouched
    given = dataclasses.replace(plan, argv=("--local-rank=0",)).for_rank(1)
    assert given.argv == ("--local-rank=0",)                  # the script's own flag is not repeated
    with pytest.raises(ProtocolError):
        _plan(tmp_path).for_rank(1)


def test_session_options_follow_the_resolved_device_and_the_capture_options(tmp_path):
    plan = _plan(tmp_path, keep_compile=True, max_capture_mb=64)
    assert plan.session_options()["remap"] is False                    # auto: not resolved yet
    options = plan.with_device("cpu").session_options()
    assert options["remap"] is True and options["keep_compile"] is True and options["max_capture_mb"] == 64
    assert "max_step_calls" not in options and options["user_root"] == str(tmp_path)


def test_the_child_refuses_a_plan_from_another_version(tmp_path):
    """A config.json with a key this version does not know fails before the script runs."""
    data = _plan(tmp_path).to_dict()
    data["remap"] = True
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    (tmp_path / "train.py").write_text("open('ran', 'w').close()\n")
    proc = subprocess.run([sys.executable, "-c", "import sys; from opscope.capture import child; "
                           "child.main(sys.argv[1])", str(config)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "unknown key(s) 'remap'" in proc.stderr
    assert not (tmp_path / "ran").exists()


# -- the child started ahead of its plan (capture.runner.EarlyChild) ---------------------------
def _tiny_script(tmp_path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(4):\n    opt.zero_grad()\n    m(torch.randn(3, 4)).sum().backward()\n"
                      "    opt.step()\n")
    return script


def test_a_child_started_early_runs_the_plan_it_is_handed(tmp_path):
    from opscope.capture.processes import EarlyChild
    from opscope.capture.runner import run_script

    _tiny_script(tmp_path)
    early = EarlyChild.start()
    assert early is not None
    outcome = run_script(dataclasses.replace(_plan(tmp_path, device="cpu"), argv=(), steps=2), early=early)
    assert outcome.steps == 2, outcome
    assert early.proc.returncode == 0   # the early child itself ran the scan (a discarded one is killed)
    assert (tmp_path / "out" / "capture" / "steps.jsonl").read_text().count("\n") == 2


def test_an_early_child_is_discarded_when_the_plan_needs_another_environment(tmp_path):
    from opscope.capture.processes import EarlyChild
    from opscope.capture.runner import run_script

    _tiny_script(tmp_path)
    early = EarlyChild.start()
    outcome = run_script(dataclasses.replace(_plan(tmp_path, device="cpu"), argv=(), steps=2), early=early,
                         env={"OPSCOPE_TEST_LAUNCH": "1"})   # what a launcher wrapper adds
    assert early.proc.returncode == -9   # killed unused; a fresh child with that environment ran the plan
    assert outcome.steps == 2, outcome


def test_a_usage_error_after_the_early_start_leaves_no_process(tmp_path):
    marker = f"opscope-test-{tmp_path.name}"
    env = dict(__import__("os").environ, OPSCOPE_TEST_MARKER=marker)
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(_tiny_script(tmp_path)), "--target", "9.9.9",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "unknown torch_npu version '9.9.9'" in proc.stderr
    assert "Traceback" not in proc.stderr
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                left.append(entry.name)
        except OSError:
            continue
    assert not left, f"processes of the refused scan still running: {left}"


def test_an_early_child_that_died_starting_is_reported_not_raised(tmp_path):
    from opscope.capture.processes import EarlyChild
    from opscope.capture.runner import run_script

    _tiny_script(tmp_path)
    early = EarlyChild.start()
    early.proc.kill()   # as if torch failed to import: it is gone before it gets its plan
    early.proc.wait()
    outcome = run_script(dataclasses.replace(_plan(tmp_path, device="cpu"), argv=(), steps=2), early=early)
    assert outcome.kind != "finished" and outcome.steps == 0, outcome


def test_an_early_child_gets_a_run_folder_whatever_bytes_its_name_holds(tmp_path):
    from opscope.capture.processes import EarlyChild
    from opscope.capture.runner import run_script

    _tiny_script(tmp_path)
    out = tmp_path / "ü run \udcff"   # not valid UTF-8: the path crosses the pipe as the file system's bytes
    early = EarlyChild.start()
    outcome = run_script(dataclasses.replace(_plan(tmp_path, device="cpu"), argv=(), steps=2, out_dir=str(out)),
                         early=early)
    assert outcome.steps == 2 and early.proc.returncode == 0, outcome
    assert (out / "capture" / "steps.jsonl").is_file()


def test_the_step_counter_reads_only_what_was_added_and_notices_a_new_file(tmp_path):
    from opscope.capture.processes import LineCounter

    log = tmp_path / "steps.jsonl"
    counter = LineCounter(log)
    assert counter.count() == 0   # not there yet
    log.write_text('{"step": 1}\n{"step": 2')   # the second line is still being written
    assert counter.count() == 1
    with open(log, "a") as fh:
        fh.write('}\n{"step": 3}\n')
    assert counter.count() == 3
    replaced = tmp_path / "new.jsonl"
    replaced.write_text('{"step": 1}\n' * 2 + "x" * 100 + "\n")   # longer than what was read, another file
    replaced.replace(log)
    assert counter.count() == 3 and LineCounter(log).count() == 3
    replaced.write_text('{"step": 1}\n')
    replaced.replace(log)
    assert counter.count() == 1
