"""Read a fleet manifest (YAML) into job specs.

::

    defaults:                 # optional; any job key below, applied to every job
      steps: 3
      timeout: 900            # seconds for the script (opscope scan --timeout)
      retries: 0              # re-runs of a job that failed or timed out
      num_cpus: 1             # Ray resources of each job
      memory_mb: 4096
      env: {OMP_NUM_THREADS: "1"}
    jobs:
      - name: cnn             # a script job, exactly like `opscope scan SCRIPT -- ARGV`
        script: examples/train_cnn.py     # relative to the manifest's folder
        argv: ["--epochs", "1"]
        env: {MY_VAR: "1"}
        cwd: .                # where the script runs (default: the manifest's folder)
      - torchvision: resnet18             # a generated job (a builder name or an fnmatch pattern)
        image_size: 64
      - timm: "resnet1*"                  # every timm model matching the pattern
      - transformers: gpt2                # AutoConfig.for_model(...) with random weights
        config: {n_layer: 2, n_embd: 64, n_head: 2}
        head: causal-lm                   # causal-lm | masked-lm | sequence-classification
        seq: 32

Every job becomes a plain dict (JSON-serialisable, shipped to Ray workers).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path
from typing import Any

from opscope.errors import UserError
from opscope.fleet import zoo

JOB_DEFAULTS: dict[str, Any] = {"steps": 3, "timeout": 900.0, "retries": 0, "num_cpus": 1.0, "memory_mb": None,
                "env": {}, "argv": [], "target": None, "batch_size": 2}
RUN_KEYS = set(JOB_DEFAULTS) | {"name", "cwd", "image_size", "config", "head", "seq", "task"}
KIND_KEYS = ("script", "torchvision", "timm", "transformers")


def fingerprint(spec: dict) -> str:
    """What makes a job's result reusable on a re-run: everything but the resources and the timeout
    (a script job's file content included, so editing the script runs it again)."""
    keep = {k: spec.get(k) for k in ("kind", "model", "script", "script_sha", "script_text", "argv", "env", "steps",
                                      "target", "cwd")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_manifest(path: Path, overrides: dict | None = None) -> list[dict]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"manifest not found: {path} (give a YAML file with a `jobs:` list, or use --zoo)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(data, list):
        data = {"jobs": data}
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise UserError(f"{path}: expected a mapping with a non-empty `jobs:` list")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"{path}: `defaults:` must be a mapping")
    base = path.resolve().parent
    jobs = []
    for i, entry in enumerate(data["jobs"], 1):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: job {i} must be a mapping (script: / torchvision: / timm: / transformers:)")
        jobs.extend(expand_job({**defaults, **entry}, base, where=f"{path.name} job {i}", overrides=overrides))
    return unique_names(jobs)


def expand_job(entry: dict, base: Path, where: str, overrides: dict | None = None) -> list[dict]:
    kinds = [k for k in KIND_KEYS if k in entry]
    if len(kinds) != 1:
        raise UserError(f"{where}: give exactly one of {', '.join(k + ':' for k in KIND_KEYS)}")
    kind = kinds[0]
    unknown = set(entry) - RUN_KEYS - {kind}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    spec = {**JOB_DEFAULTS, **{k: v for k, v in entry.items() if k != kind}, **(overrides or {})}
    _check_types(spec, where)
    value = entry[kind]
    if kind == "script":
        script = (base / str(value)).resolve()
        if not script.is_file():
            raise UserError(f"{where}: script not found: {script}")
        spec.update(kind="script", script=str(script), model=spec.get("name") or script.stem,
                    script_sha=hashlib.sha256(script.read_bytes()).hexdigest()[:16],
                    cwd=str((base / str(spec.get("cwd") or ".")).resolve()))
        spec.setdefault("name", script.stem)
        return [_finish(spec)]
    if not isinstance(value, str) or not value:
        raise UserError(f"{where}: `{kind}:` must be a model name or pattern")
    if kind == "torchvision":
        return [_finish({**spec, "name": spec.get("name") if not _is_pattern(value) else None})
                for spec in _torchvision_specs(spec, value, where)]
    if kind == "timm":
        names = zoo.timm_models(value) if _is_pattern(value) else [value]
        return [_finish({**spec, "kind": "timm", "model": n, "name": spec.get("name") if len(names) == 1 else None,
                         "script_text": zoo.timm_script(n, batch=spec["batch_size"])}) for n in names]
    zoo.require_zoo("transformers")
    config = spec.get("config") or {}
    if not isinstance(config, dict):
        raise UserError(f"{where}: `config:` must be a mapping of AutoConfig overrides")
    text = zoo.transformers_script(value, config, head=spec.get("head") or "causal-lm", seq=spec.get("seq") or 32,
                                   batch=spec["batch_size"])
    return [_finish({**spec, "kind": "transformers", "model": value, "script_text": text})]


def _torchvision_specs(spec: dict, value: str, where: str) -> list[dict]:
    known = zoo.torchvision_models()
    names = [n for n in known if fnmatch.fnmatchcase(n, value)] if _is_pattern(value) else [value]
    if not names:
        raise UserError(f"{where}: no torchvision model matches {value!r}")
    out = []
    for name in names:
        if name not in known:
            raise UserError(f"{where}: torchvision has no classification/detection/segmentation model {name!r}")
        task = known[name]
        text = zoo.torchvision_script(name, task, image_size=spec.get("image_size"), batch=spec["batch_size"])
        out.append({**spec, "kind": "torchvision", "model": name, "task": task, "script_text": text})
    return out


def zoo_jobs(zoo_name: str, models: list[str] | None, overrides: dict | None = None) -> list[dict]:
    """``--zoo torchvision [--models a,b]``: one generated job per model (all builders by default)."""
    zoo.require_zoo(zoo_name)
    if zoo_name == "transformers" and not models:
        raise UserError("--zoo transformers needs --models (AutoConfig model types, e.g. gpt2,bert)")
    if zoo_name == "timm" and not models:
        raise UserError("--zoo timm needs --models (names or fnmatch patterns, e.g. 'resnet1*')")
    patterns = models or ["*"]
    jobs = []
    for pattern in patterns:
        entry = {zoo_name: pattern, **(overrides or {})}
        jobs.extend(expand_job(entry, Path.cwd(), where=f"--zoo {zoo_name} {pattern}"))
    return unique_names(jobs)


def _is_pattern(value: str) -> bool:
    return any(c in value for c in "*?[")


def _check_types(spec: dict, where: str) -> None:
    for key in ("steps", "retries", "batch_size"):
        if not isinstance(spec.get(key), int) or spec[key] < (1 if key != "retries" else 0):
            raise UserError(f"{where}: `{key}` must be a {'positive' if key != 'retries' else 'non-negative'} integer")
    for key in ("timeout", "num_cpus"):
        if not isinstance(spec.get(key), (int, float)) or spec[key] <= 0:
            raise UserError(f"{where}: `{key}` must be a positive number")
    if spec.get("memory_mb") is not None and (not isinstance(spec["memory_mb"], int) or spec["memory_mb"] < 1):
        raise UserError(f"{where}: `memory_mb` must be a positive integer")
    if not isinstance(spec.get("argv"), list):
        raise UserError(f"{where}: `argv` must be a list of strings")
    spec["argv"] = [str(a) for a in spec["argv"]]
    if not isinstance(spec.get("env"), dict):
        raise UserError(f"{where}: `env` must be a mapping")
    spec["env"] = {str(k): str(v) for k, v in spec["env"].items()}
    if spec.get("target") is not None:
        spec["target"] = str(spec["target"])


def _finish(spec: dict) -> dict:
    spec = dict(spec)
    spec["name"] = zoo.safe_name(str(spec.get("name") or spec["model"]))
    spec.setdefault("script", None)
    spec.setdefault("script_text", None)
    spec.setdefault("cwd", None)
    spec.setdefault("task", None)
    return spec


def unique_names(jobs: list[dict]) -> list[dict]:
    seen: dict = {}
    for job in jobs:
        n = seen.get(job["name"], 0)
        seen[job["name"]] = n + 1
        if n:
            job["name"] = f"{job['name']}-{n + 1}"
    for job in jobs:
        job["fingerprint"] = fingerprint(job)
    return jobs
