"""opscope fleet: manifests, the Ray and serial engines, resume, aggregation, zoo jobs (real small scans)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_scan, run_opscope

DATA = Path(__file__).resolve().parent / "data" / "fleet"
HAS_RAY = importlib.util.find_spec("ray") is not None
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install 'opscope[fleet]')")
needs_torchvision = pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision is not installed (opscope[fleet])")


def _manifest(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _fleet(out: Path) -> dict:
    return json.loads((out / "fleet.json").read_text(encoding="utf-8"))


def _record(out: Path, name: str) -> dict:
    return json.loads((out / "jobs" / name / "fleet-job.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("text, message", [
    ("jobs: []\n", "non-empty `jobs:` list"),
    ("jobs:\n  - script: missing.py\n", "script not found"),
    ("jobs:\n  - script: {tiny}\n    torchvision: resnet18\n", "exactly one of"),
    ("jobs:\n  - script: {tiny}\n    stepz: 3\n", "unknown key(s) stepz"),
    ("jobs:\n  - script: {tiny}\n    steps: 0\n", "`steps` must be a positive integer"),
    ("jobs: [\n", "not valid YAML"),
])
def test_bad_manifest_is_a_one_line_error(tmp_path, text, message):
    manifest = _manifest(tmp_path, text.format(tiny=DATA / "tiny.py"))
    proc = run_opscope("fleet", manifest, "--out", tmp_path / "out", "--engine", "serial", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "fleet.json").exists()


def test_command_line_errors(tmp_path):
    proc = run_opscope("fleet", "--out", tmp_path, timeout=60)
    assert proc.returncode == 2 and "MANIFEST file or --zoo" in proc.stderr
    proc = run_opscope("fleet", "--zoo", "transformers", "--out", tmp_path, "--targets", "9.9", timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_serial_fleet_kill_resume_and_upgrade_table(tmp_path):
    """A job killed mid-run is recorded failed and the fleet completes; a re-run redoes only it; the
    upgrade table names the operators that block a model on 2.1 and none on 2.14 (computed)."""
    kill = tmp_path / "kill-now"
    kill.write_text("")
    manifest = _manifest(tmp_path, f"""
defaults: {{steps: 2, timeout: 120}}
jobs:
  - script: {DATA / 'tiny.py'}
    name: tiny
    argv: ["--width", "6"]
  - script: {DATA / 'tiny.py'}
    name: killed
    env: {{KILL_FILE: "{kill}"}}
  - script: {DATA / 'tiny.py'}
    name: hung
    timeout: 6
    env: {{HANG_FILE: "{kill}"}}
  - script: {DATA / 'newops.py'}
""")
    out = tmp_path / "fleet"
    proc = run_opscope("fleet", manifest, "--out", out, "--engine", "serial", "--targets", "2.1,2.8,2.14")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "hung, killed" in proc.stderr.strip().splitlines()[-1]
    doc = _fleet(out)
    assert doc["schema"] == "opscope.fleet/1"
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert jobs["killed"]["status"] == "failed" and "SIGKILL" in jobs["killed"]["reason"]
    assert jobs["hung"]["status"] == "timeout" and "--timeout 6" in jobs["hung"]["reason"]
    assert jobs["tiny"]["status"] == "ok" and jobs["newops"]["status"] == "ok"
    assert doc["summary"]["failed"] == ["hung", "killed"] and doc["summary"]["assessed"] == 2
    assert _processes_mentioning(str(kill)) == []
    # each model keeps its normal run folder
    assert load_scan(out / "jobs" / "tiny")["argv"] == ["--width", "6"]
    assert (out / "jobs" / "tiny" / "report.html").is_file()

    # per-line verdicts agree with direct scans judged against those versions
    by_op = {o["op"]: o for o in doc["operators"]}
    assert doc["versions"]["2.1"].startswith("2.1.") and doc["versions"]["2.14"].startswith("2.14.")
    for line in ("2.1", "2.14"):
        version = doc["versions"][line]
        direct = tmp_path / f"direct-{line}"
        p = run_opscope("scan", DATA / "newops.py", "--steps", "2", "--out", direct, "--quiet", "--format", "",
                        "--no-traces", "--target", version)
        assert p.returncode == 0, p.stderr[-2000:]
        blocking = {b["op"] for b in load_scan(direct)["summary"]["blocking_ops"]}
        assert {op for op, o in by_op.items() if "newops" in o["per_line"][line]["models"]} == blocking
    upgrade = next(u for u in doc["upgrades"] if u["from"] == "2.1")
    fixed = {f["op"] for f in upgrade["operators_fixed"]}
    assert {"aten::scatter_reduce", "aten::bitwise_left_shift"} <= fixed
    for op in fixed:   # blocks at least one model on 2.1, none on 2.14
        assert by_op[op]["per_line"]["2.1"]["blocks"] >= 1 and by_op[op]["per_line"]["2.14"]["blocks"] == 0
    assert upgrade["unblocked_models"] == ["newops"]
    models = {m["model"]: m for m in doc["models"]}
    assert models["newops"]["per_line"]["2.1"]["ready"] is False and models["newops"]["per_line"]["2.14"]["ready"]
    html = (out / "fleet.html").read_text(encoding="utf-8")
    assert "aten::scatter_reduce" in html and "SIGKILL" in html and "<script src" not in html
    from openpyxl import load_workbook
    wb = load_workbook(out / "fleet.xlsx")
    assert {"operators", "models", "upgrades", "dynamic shapes", "jobs"} <= set(wb.sheetnames)
    assert "aten::scatter_reduce" in [c.value for c in wb["operators"]["A"]]

    # re-run: the finished jobs are reused untouched, the failed one runs again
    kill.unlink()
    before = {n: _record(out, n)["finished_at"] for n in ("tiny", "newops")}
    scan_mtime = (out / "jobs" / "tiny" / "scan.json").stat().st_mtime_ns
    proc = run_opscope("fleet", manifest, "--out", out, "--engine", "serial", "--targets", "2.1,2.8,2.14",
                       "--timeout", "120")   # the command line overrides every job's timeout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 already finished (reused), 2 to run" in " ".join(proc.stderr.split())
    doc = _fleet(out)
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert all(j["status"] == "ok" for j in jobs.values())
    assert jobs["tiny"]["reused"] and jobs["newops"]["reused"] and not jobs["killed"]["reused"]
    assert not jobs["hung"]["reused"]
    assert {n: _record(out, n)["finished_at"] for n in before} == before
    assert (out / "jobs" / "tiny" / "scan.json").stat().st_mtime_ns == scan_mtime


def _processes_mentioning(text: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if text in line and "ps -eo" not in line]


@needs_ray
def test_ray_fleet_survives_a_killed_worker_and_resumes(tmp_path):
    """The Ray worker running a job is killed: that job is failed with the Ray reason, no process of it
    is left, the other job completes; a re-run does not redo the finished job."""
    script = tmp_path / "kill_worker_job.py"
    script.write_text((DATA / "kill_worker.py").read_text(encoding="utf-8"), encoding="utf-8")
    manifest = _manifest(tmp_path, f"""
defaults: {{steps: 2, timeout: 120, num_cpus: 1}}
jobs:
  - script: {DATA / 'tiny.py'}
    name: tiny
  - script: {script}
    name: worker-killed
""")
    out = tmp_path / "fleet"
    proc = run_opscope("fleet", manifest, "--out", out, "--workers", "1", "--targets", "2.14", timeout=400)
    assert proc.returncode == 3, proc.stderr[-3000:]
    jobs = {j["name"]: j for j in _fleet(out)["jobs"]}
    assert jobs["tiny"]["status"] == "ok"
    assert jobs["worker-killed"]["status"] == "failed"
    assert "Ray task failed" in jobs["worker-killed"]["reason"]
    assert _processes_mentioning(str(script)) == []
    finished = _record(out, "tiny")["finished_at"]
    script.write_text((DATA / "tiny.py").read_text(encoding="utf-8"), encoding="utf-8")
    proc = run_opscope("fleet", manifest, "--out", out, "--workers", "1", "--targets", "2.14", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _record(out, "tiny")["finished_at"] == finished
    assert {j["name"]: j["status"] for j in _fleet(out)["jobs"]} == {"tiny": "ok", "worker-killed": "ok"}


def _verdicts(scan: dict) -> dict:
    """Verdicts by (operator, shapes, dtypes, phase).  One key can hold several rows (the same set-up call made
    on host tensors and on device tensors): their verdicts are kept as a sorted tuple, so the comparison does not
    depend on how rows that tie on time are ordered (a dict of single values kept the last one, which flaked)."""
    out: dict = {}
    for o in scan["operators"]:
        key = (o["name"], json.dumps(o["input_shapes"]), json.dumps(o["dtypes"]), o["phase"])
        out.setdefault(key, []).append(o["verdict"])
    return {k: tuple(sorted(v)) for k, v in out.items()}


@needs_ray
@needs_torchvision
def test_zoo_jobs_match_a_direct_scan_of_their_script(tmp_path):
    out = tmp_path / "zoo"
    proc = run_opscope("fleet", "--zoo", "torchvision", "--models", "resnet18,mobilenet_v3_small",
                       "--image-size", "32", "--steps", "2", "--workers", "1", "--targets", "2.1,2.14",
                       "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = _fleet(out)
    assert sorted(m["model"] for m in doc["models"]) == ["mobilenet_v3_small", "resnet18"]
    for name in ("resnet18", "mobilenet_v3_small"):
        script = out / "scripts" / f"{name}.py"
        assert f"get_model({name!r}" in script.read_text() or "NAME, SIZE" in script.read_text()
        direct = tmp_path / f"direct-{name}"
        # the job ran with one math thread (its num_cpus), as Ray runs it: the direct scan does the same
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        p = subprocess.run([sys.executable, "-m", "opscope", "scan", str(script), "--steps", "2", "--out",
                            str(direct), "--quiet", "--format", "", "--no-traces"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        fleet_scan = load_scan(out / "jobs" / name)
        assert fleet_scan["operators"], name
        assert _verdicts(fleet_scan) == _verdicts(load_scan(direct))


def test_remapped_cuda_event_and_stream_are_classes(tmp_path):
    """Libraries annotate with `torch.cuda.Stream | None` and isinstance-check events: the remap keeps classes."""
    out = tmp_path / "run"
    proc = run_opscope("scan", DATA / "cuda_timing.py", "--steps", "2", "--out", out, "--quiet", "--format", "",
                       "--no-traces")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = {f["rule"] for f in load_scan(out)["findings"]}
    assert {"cuda-event", "cuda-stream"} <= rules


@pytest.mark.skipif(not (importlib.util.find_spec("timm") and importlib.util.find_spec("transformers")),
                    reason="timm and transformers are optional zoos (not installed)")
def test_timm_and_transformers_generated_jobs(tmp_path):
    manifest = _manifest(tmp_path, """
defaults: {steps: 2, timeout: 300}
jobs:
  - timm: resnet10t
  - transformers: gpt2
    config: {n_layer: 1, n_embd: 32, n_head: 2, vocab_size: 128, n_positions: 32}
    seq: 16
""")
    out = tmp_path / "fleet"
    proc = run_opscope("fleet", manifest, "--out", out, "--engine", "serial", "--targets", "2.14", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = _fleet(out)
    assert sorted(m["model"] for m in doc["models"]) == ["gpt2", "resnet10t"]
    names = {o["name"] for o in load_scan(out / "jobs" / "gpt2")["operators"]}
    assert "aten::embedding" in names and "aten::embedding_dense_backward" in names
    assert any("conv" in o["name"] for o in load_scan(out / "jobs" / "resnet10t")["operators"])


def test_remote_style_job_returns_its_run_folder(tmp_path):
    """On a cluster without a shared file system a job runs in a temporary folder and ships its run back."""
    from opscope.fleet import engine
    from opscope.fleet.manifest import load_manifest

    manifest = _manifest(tmp_path, f"jobs:\n  - script: {DATA / 'tiny.py'}\n    steps: 2\n    timeout: 120\n")
    spec = load_manifest(manifest)[0]
    record = engine.execute_job(spec, None, "html")
    assert record["status"] == "ok", record
    assert {"scan.json", "report.html", "scan.log"} <= set(record["files"])
    run_dir = tmp_path / "out" / "jobs" / spec["name"]
    engine.write_record(run_dir, record)
    assert load_scan(run_dir)["complete"] is True
    assert engine.read_record(run_dir)["fingerprint"] == spec["fingerprint"]
    assert "files" not in engine.read_record(run_dir)


@needs_torchvision
def test_zoo_torchvision_lists_every_builder_without_a_manifest(tmp_path):
    proc = run_opscope("fleet", "--zoo", "torchvision", "--dry-run", "--out", tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
    from opscope.fleet.tv_compat import import_torchvision
    models = import_torchvision().models
    expected = set(models.list_models(module=models)) | set(models.list_models(module=models.detection)) \
        | set(models.list_models(module=models.segmentation))
    assert set(rows) == expected
    for name, task in (("resnet18", "classification"), ("vit_b_16", "classification"),
                       ("deeplabv3_mobilenet_v3_large", "segmentation"),
                       ("fasterrcnn_mobilenet_v3_large_320_fpn", "detection")):
        assert rows[name].startswith(f"torchvision {name} ({task})")
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
