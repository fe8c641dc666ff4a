"""Run fleet jobs: each one the normal ``opscope scan`` child, as a Ray task (or one by one).

A job runs ``python -m opscope scan SCRIPT --steps N --out RUN --timeout T -- ARGV`` in its
own session, with the job's environment; that process stops the script's whole process
group whatever happens, and is itself sent SIGTERM if the process running it (a Ray worker)
dies, so no job outlives the fleet.  Whatever the job does, the task returns a record
(``status`` ok / failed / timeout / error, with the one-line reason) and never raises for
the job's own problems; a Ray-level failure (the worker killed, out of memory) is turned
into a failed record by the driver.  Records stream into ``DIR/jobs/NAME/fleet-job.json``
as jobs finish; a re-run skips jobs whose record is ``ok`` with the same fingerprint.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opscope.atomic import write_atomic
from opscope.errors import UserError
from opscope.model import ScanSummary

RECORD = "fleet-job.json"
HARD_GRACE_S = 180.0      # analysis and reports after the script's --timeout
KEEP_FROM_REMOTE = ("scan.json", "operators.csv", "report.html", "report.xlsx", "scan.log")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


LOCK_WAIT_S = 120.0   # how long a retried job waits for its previous attempt to let go of the folder


def _pdeathsig():
    """In the child: get SIGTERM when the parent (a Ray worker, the serial driver) dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - not Linux
        pass


def scan_command(spec: dict, script: str, out_dir: Path, job_formats: str) -> list[str]:
    cmd = [sys.executable, "-m", "opscope", "scan", script, "--steps", str(spec["steps"]), "--out", str(out_dir),
           "--timeout", f"{float(spec['timeout']):g}", "--no-traces", "--quiet", "--format", job_formats]
    if spec.get("target"):
        cmd += ["--target", str(spec["target"])]
    if spec.get("argv"):
        cmd += ["--", *spec["argv"]]
    return cmd


def _reason(log: str, code: int) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("opscope: error:") or ln.startswith("opscope: internal error:"):
            return ln.split(":", 2)[2].strip()
    tail = lines[-1] if lines else ""
    return f"opscope scan exited with status {code}" + (f": {tail[:300]}" if tail else "")


def _status(code: int) -> str:
    return {0: "ok", 4: "timeout", 2: "error"}.get(code, "failed")


def execute_job(spec: dict, out_dir: str | None, job_formats: str = "html,xlsx") -> dict:
    """Run one job to the end; return its record.  ``out_dir`` None: run in a temporary folder
    (a remote worker) and return the run folder's files in ``record["files"]``."""
    started = time.monotonic()
    record = {"name": spec["name"], "kind": spec["kind"], "model": spec.get("model"), "task": spec.get("task"),
              "fingerprint": spec.get("fingerprint"), "started_at": _now(), "host": socket.gethostname(),
              "attempts": 0}
    tmp = None
    try:
        if out_dir is None:
            tmp = Path(tempfile.mkdtemp(prefix=f"opscope-fleet-{spec['name']}-"))
            run_dir = tmp / "run"
        else:
            run_dir = Path(out_dir)
        script = spec.get("script")
        if spec.get("script_text") and (tmp is not None or not script):
            script_path = (tmp or run_dir) / f"{spec['name']}.py"
            script_path.write_text(spec["script_text"], encoding="utf-8")
            script = str(script_path)
        assert script is not None   # a manifest job has a script or the text of one
        attempts = int(spec.get("retries") or 0) + 1
        code, log = 1, ""
        for attempt in range(1, attempts + 1):
            record["attempts"] = attempt
            code, log = _run_scan(spec, script, run_dir, job_formats)
            if _status(code) in ("ok", "error"):
                break
        (run_dir / "scan.log").write_text(log, encoding="utf-8") if run_dir.is_dir() else None
        record.update(status=_status(code), exit_code=code, reason=None if code == 0 else _reason(log, code))
        scan = run_dir / "scan.json"
        if scan.is_file():
            try:
                data = json.loads(scan.read_text(encoding="utf-8"))
                summary = ScanSummary.from_dict(data.get("summary") or {}, "$.summary")
                record["readiness_score"] = summary.readiness_score
            except (ValueError, AttributeError):   # not JSON, not an object, or a malformed summary (SchemaError)
                pass
        if tmp is not None:
            record["files"] = {name: (run_dir / name).read_bytes() for name in KEEP_FROM_REMOTE
                               if (run_dir / name).is_file()}
    except Exception as exc:  # a problem of this machine (disk, permissions): the job failed, the fleet goes on
        record.update(status="failed", exit_code=None, reason=f"could not run the job: {exc!r}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    record["finished_at"] = _now()
    record["duration_s"] = round(time.monotonic() - started, 3)
    return record


def _run_scan(spec: dict, script: str, run_dir: Path, job_formats: str) -> tuple[int, str]:
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    # As Ray does for its tasks: a job gets as many math-library threads as CPUs it reserved (unless
    # its environment says otherwise), so the serial engine and Ray measure the same thing.
    threads = str(max(1, int(float(spec.get("num_cpus") or 1))))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, threads)
    cmd = scan_command(spec, script, run_dir, job_formats)
    run_dir.mkdir(parents=True, exist_ok=True)
    # a retry: the earlier attempt's scan, stopped with its killed worker, may still be writing its
    # partial results into this folder (it holds the folder's lock until it exits)
    from opscope.capture.run_folder import wait_for_release
    wait_for_release(run_dir, LOCK_WAIT_S)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=spec.get("cwd") or str(run_dir), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_pdeathsig)
        try:
            code = proc.wait(timeout=float(spec["timeout"]) + HARD_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
            code = 4
        except BaseException:
            _kill_group(proc, signal.SIGTERM)   # the task was cancelled: the scan stops its script group
            try:
                proc.wait(timeout=30)
            finally:
                _kill_group(proc, signal.SIGKILL)
            raise
        finally:
            _kill_group(proc, signal.SIGKILL) if proc.poll() is None else None
        log.seek(0)
        text = log.read().decode("utf-8", errors="replace")
    if code < 0:
        code = 3
    return code, text[-20000:]


def _kill_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- driver side

def read_record(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_record(run_dir: Path, record: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    files = record.pop("files", None) or {}
    for name, data in files.items():
        (run_dir / name).write_bytes(data)
    write_atomic(run_dir / RECORD, json.dumps(record, indent=1))


def plan(jobs: list[dict], out: Path, force: bool = False) -> tuple[list[dict], list[dict]]:
    """(jobs to run, records of finished jobs reused).  Writes generated scripts to OUT/scripts."""
    scripts = out / "scripts"
    todo, reused = [], []
    for spec in jobs:
        if spec.get("script_text"):
            scripts.mkdir(parents=True, exist_ok=True)
            path = scripts / f"{spec['name']}.py"
            if not path.is_file() or path.read_text(encoding="utf-8") != spec["script_text"]:
                path.write_text(spec["script_text"], encoding="utf-8")
            spec["script"] = str(path.resolve())
        old = read_record(out / "jobs" / spec["name"])
        if not force and old and old.get("status") == "ok" and old.get("fingerprint") == spec.get("fingerprint") \
                and (out / "jobs" / spec["name"] / "scan.json").is_file():
            reused.append(old)
        else:
            todo.append(spec)
    return todo, reused


def run_jobs(jobs: list[dict], out: Path, *, engine: str = "ray", address: str | None = None,
             workers: int | None = None, job_formats: str = "html,xlsx", on_record=None) -> list[dict]:
    """Run ``jobs`` (already planned); call ``on_record(record)`` as each finishes; return the records."""
    if not jobs:
        return []
    if engine == "serial":
        return _run_serial(jobs, out, job_formats, on_record)
    return _run_ray(jobs, out, address, workers, job_formats, on_record)


def _finish(out: Path, record: dict, on_record) -> dict:
    write_record(out / "jobs" / record["name"], record)
    if on_record is not None:
        on_record(record)
    return record


def _run_serial(jobs, out, job_formats, on_record) -> list[dict]:
    records = []
    for spec in jobs:
        run_dir = out / "jobs" / spec["name"]
        run_dir.mkdir(parents=True, exist_ok=True)
        records.append(_finish(out, execute_job(spec, str(run_dir.resolve()), job_formats), on_record))
    return records


def ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def init_ray(address: str | None, workers: int | None):
    if not ray_available():
        raise UserError("the Ray engine needs Ray: pip install 'opscope[fleet]' (or run the jobs one by one "
                        "here with --engine serial)")
    import ray

    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=True,
                  logging_level="ERROR")
    try:
        if address and address.startswith("ray://"):
            ray.init(address=address, log_to_driver=False)    # Ray Client: a remote driver
        elif address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers or os.cpu_count() or 1, object_store_memory=128 * 1024 * 1024,
                     **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise UserError(f"could not start or join the Ray cluster"
                        f"{' at ' + address if address else ''}: {str(exc).splitlines()[0]}") from None
    return ray


def _run_ray(jobs, out, address, workers, job_formats, on_record) -> list[dict]:
    ray = init_ray(address, workers)
    from ray.exceptions import RayError

    shared = address is None        # the local cluster shares this file system: scans write into OUT
    task = ray.remote(execute_job)
    pending = {}
    for spec in jobs:
        run_dir = out / "jobs" / spec["name"]
        run_dir.mkdir(parents=True, exist_ok=True)
        options = {"num_cpus": float(spec["num_cpus"]), "max_retries": int(spec.get("retries") or 0),
                   "retry_exceptions": False, "name": f"opscope-fleet:{spec['name']}"}
        if spec.get("memory_mb"):
            options["memory"] = int(spec["memory_mb"]) * 1024 * 1024
        ref = task.options(**options).remote(spec, str(run_dir.resolve()) if shared else None, job_formats)
        pending[ref] = (spec, time.monotonic(), _now())
    records = []
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                spec, t0, started_at = pending.pop(ref)
                try:
                    record = ray.get(ref)
                except RayError as exc:   # the worker died, ran out of memory, the task was cancelled
                    record = {"name": spec["name"], "kind": spec["kind"], "model": spec.get("model"),
                              "task": spec.get("task"), "fingerprint": spec.get("fingerprint"),
                              "status": "failed", "exit_code": None, "started_at": started_at,
                              "finished_at": _now(), "duration_s": round(time.monotonic() - t0, 3),
                              "attempts": int(spec.get("retries") or 0) + 1,
                              "reason": f"the Ray task failed: {type(exc).__name__}: "
                                        f"{_first_line(str(exc))}"}
                records.append(_finish(out, record, on_record))
    finally:
        for ref in pending:   # interrupted: cancel what is left (the scans stop their scripts)
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        ray.shutdown()
    return records


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
