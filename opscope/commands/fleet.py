"""``opscope fleet MANIFEST --out DIR`` / ``opscope fleet --zoo torchvision``: scan many jobs on Ray."""
from __future__ import annotations

import argparse
import datetime as _dt
import time
from pathlib import Path

from opscope.errors import EXIT_SCRIPT_FAILED, UserError


def register(sub) -> None:
    p = sub.add_parser("fleet", help="scan many training jobs / a model zoo on Ray and rank the blocking operators",
                       description="Run `opscope scan` for every job of a YAML manifest (scripts, or models "
                                   "generated from torchvision / timm / transformers with synthetic data) as Ray "
                                   "tasks, then report per model and per operator which torch_npu versions "
                                   "block what.  Re-running the same command skips the jobs that finished.")
    p.add_argument("manifest", nargs="?", help="YAML manifest of jobs (see README); or use --zoo")
    p.add_argument("--zoo", choices=["torchvision", "timm", "transformers"], help="generate one job per zoo model")
    p.add_argument("--models", help="with --zoo: comma-separated model names or fnmatch patterns "
                                    "(torchvision default: every classification/detection/segmentation builder)")
    p.add_argument("-o", "--out", default="opscope-fleet", help="output folder (default opscope-fleet/)")
    p.add_argument("--steps", type=int, default=None, help="steps per job (default 3, or the manifest's)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per job's script (default 900)")
    p.add_argument("--retries", type=int, default=None, help="re-runs of a job that failed or timed out (default 0)")
    p.add_argument("--num-cpus", type=float, default=None, help="Ray CPUs per job (default 1)")
    p.add_argument("--memory-mb", type=int, default=None, help="Ray memory per job in MB (default: not reserved)")
    p.add_argument("--image-size", type=int, default=None, help="with --zoo torchvision: synthetic image size")
    p.add_argument("--target", default=None, help="torch_npu version each scan is judged against (default newest)")
    p.add_argument("--targets", default=None,
                   help="torch_npu versions compared in the fleet report, e.g. 2.1,2.8,2.14 (default: every release "
                        "line with a wheel)")
    p.add_argument("--engine", default="ray", choices=["ray", "serial"],
                   help="ray (default; local cluster unless --address) or serial (one job after the other, no Ray)")
    p.add_argument("--address", default=None, help="join an existing Ray cluster (e.g. ray://head:10001 or auto)")
    p.add_argument("--workers", type=int, default=None,
                   help="CPUs of the local Ray cluster, i.e. jobs at once with --num-cpus 1 (default: all cores)")
    p.add_argument("--force", action="store_true", help="re-run every job, even those that finished")
    p.add_argument("--format", default="html,xlsx", help="fleet reports besides fleet.json (html,xlsx)")
    p.add_argument("--job-format", default="html,xlsx", help="reports of each job's scan (default html,xlsx)")
    p.add_argument("--dry-run", action="store_true", help="list the jobs (and which would be reused), run nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=run)


def _overrides(args) -> dict:
    out = {}
    for key in ("steps", "timeout", "retries", "num_cpus", "memory_mb", "target", "image_size"):
        value = getattr(args, key)
        if value is not None:
            out[key] = value
    return out


def _formats(spec: str, known: set) -> list[str]:
    formats = [f.strip().lower() for f in (spec or "").split(",") if f.strip()]
    bad = [f for f in formats if f not in known]
    if bad:
        raise UserError(f"unknown format {','.join(bad)}: choose from {','.join(sorted(known))}")
    return formats


# above complexity 15: CLI command: option checks (each a one-line exit-2 error), then the run
def run(args: argparse.Namespace) -> int:  # noqa: C901
    from rich.console import Console

    from opscope.fleet import engine
    from opscope.fleet.manifest import load_manifest, zoo_jobs

    console = Console(stderr=True)
    if bool(args.manifest) == bool(args.zoo):
        raise UserError("give a MANIFEST file or --zoo NAME (one of them)")
    if args.models and not args.zoo:
        raise UserError("--models goes with --zoo; list models in the manifest otherwise")
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be at least 1")
    if args.address and args.engine != "ray":
        raise UserError("--address needs --engine ray")
    from opscope.report import fleet_out, registry
    from opscope.report.render import SOURCE_FORMAT
    formats = _formats(args.format, set(fleet_out.FLEET_REPORTS))
    # each job's scan writes scan.json itself; its reports are the other registered scan formats
    job_formats = ",".join(_formats(args.job_format, set(registry.reporters("scan")) - {SOURCE_FORMAT})) or "html"
    from opscope.analysis.fleet import resolve_lines
    from opscope.analysis.verdicts.support import resolve_target

    lines = resolve_lines(args.targets)          # fail fast on an unknown version
    if args.target:
        resolve_target(args.target)
    overrides = _overrides(args)
    if args.zoo:
        models = [m.strip() for m in (args.models or "").split(",") if m.strip()] or None
        jobs = zoo_jobs(args.zoo, models, overrides)
    else:
        jobs = load_manifest(Path(args.manifest), overrides)
    if args.dry_run:
        return _dry_run(jobs, Path(args.out), args.force)
    if args.engine == "ray" and not engine.ray_available():
        raise UserError("the Ray engine needs Ray: pip install 'opscope[fleet]' (or run the jobs one by one here "
                        "with --engine serial)")
    out = Path(args.out)
    try:
        (out / "jobs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write to --out {out}: {exc.strerror or exc}") from None
    todo, reused = engine.plan(jobs, out, force=args.force)
    for r in reused:
        r["reused"] = True
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    if not args.quiet:
        where = f"Ray cluster at {args.address}" if args.address else (
            "a local Ray cluster" if args.engine == "ray" else "this machine, one after the other")
        console.print(f"opscope fleet: {len(jobs)} job(s), {len(reused)} already finished (reused), "
                      f"{len(todo)} to run on {where}; results stream into {out / 'jobs'}/")
    restore = _stop_on_sigterm()
    try:
        records = _run_with_progress(todo, out, args, job_formats, console)
    finally:
        restore()
    all_records = reused + records
    results = _load_results(out, all_records)
    from opscope.analysis.fleet import aggregate_fleet

    settings = {"engine": args.engine, "address": args.address, "workers": args.workers,
                "manifest": str(Path(args.manifest).resolve()) if args.manifest else None, "zoo": args.zoo,
                "models": args.models, "overrides": overrides, "started_at": started,
                "duration_s": round(time.perf_counter() - t0, 3)}
    doc = aggregate_fleet(all_records, results, lines, settings)
    doc["created_at"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    written = [fleet_out.write_fleet_json(doc, out / "fleet.json")]
    for name, (file_name, writer) in fleet_out.FLEET_REPORTS.items():
        if name in formats:
            written.append(writer(doc, out / file_name))
    if not args.quiet:
        _print_summary(doc, Console(), written)
    failed = doc["summary"]["failed"]
    if failed:
        raise UserError(f"{len(failed)} of {len(all_records)} job(s) did not finish: {', '.join(failed[:10])}"
                        f"{' ...' if len(failed) > 10 else ''} (reasons in {out / 'fleet.json'}; re-run the same "
                        "command to retry only those)", EXIT_SCRIPT_FAILED)
    return 0


def _dry_run(jobs: list[dict], out: Path, force: bool) -> int:
    from opscope.fleet import engine

    for spec in jobs:
        old = engine.read_record(out / "jobs" / spec["name"])
        reuse = (not force and old and old.get("status") == "ok" and old.get("fingerprint") == spec["fingerprint"])
        what = spec.get("script") if spec["kind"] == "script" else f"{spec['kind']} {spec['model']}"
        extra = f" ({spec['task']})" if spec.get("task") else ""
        print(f"{spec['name']}\t{what}{extra}\t{'reuse' if reuse else 'run'}")
    print(f"{len(jobs)} job(s)")
    return 0


def _stop_on_sigterm():
    """SIGTERM stops the fleet like Ctrl-C: running jobs are cancelled (their scans stop their scripts),
    finished ones stay recorded for a re-run; exit 143."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):
        raise UserError("stopped by SIGTERM; the finished jobs are kept in --out, re-run the same command to "
                        "resume", 143)

    previous = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _run_with_progress(todo, out, args, job_formats, console) -> list[dict]:
    from opscope.fleet import engine

    if not todo:
        return []
    if args.quiet:
        return engine.run_jobs(todo, out, engine=args.engine, address=args.address, workers=args.workers,
                               job_formats=job_formats)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        bar = progress.add_task("scanning", total=len(todo))

        def on_record(record):
            progress.advance(bar)
            mark = "ok" if record.get("status") == "ok" else record.get("status", "failed")
            progress.update(bar, description=f"scanning (last: {record['name']} {mark})")
            if record.get("status") != "ok":
                progress.console.print(f"[red]{record['name']}: {record.get('status')}[/red]: {record.get('reason')}")
        return engine.run_jobs(todo, out, engine=args.engine, address=args.address, workers=args.workers,
                               job_formats=job_formats, on_record=on_record)


def _load_results(out: Path, records: list[dict]) -> dict:
    from opscope.report.json_out import read_scan_json

    results = {}
    for record in records:
        if record.get("status") != "ok":
            continue
        try:
            results[record["name"]] = read_scan_json(out / "jobs" / record["name"])
        except UserError as exc:
            record["status"], record["reason"] = "failed", f"its scan.json could not be read: {exc}"
    return results


def _print_summary(doc: dict, console, written) -> None:
    s, lines, versions = doc["summary"], doc["lines"], doc["versions"]
    console.print(f"{s['assessed']} of {s['jobs']} job(s) assessed; ready (no blocking operator): "
                  + ", ".join(f"{versions[l]}: {s['ready_models'][l]}" for l in lines[-3:]))
    for op in doc["operators"][:10]:
        newest = op["per_line"][lines[-1]]
        console.print(f"  {op['op']}: blocks {newest['blocks']} model(s) on {versions[lines[-1]]} "
                      f"({newest['verdict']}, {100 * op['time_share']:.1f}% of the time)"
                      + (f"; substitute {op['substitute']}" if op["substitute"] else ""))
    for up in doc["upgrades"][:1]:
        console.print(f"upgrading {up['from_version']} -> {up['to_version']} unblocks "
                      f"{len(up['unblocked_models'])} model(s); operators fixed: "
                      + (", ".join(o["op"] for o in up["operators_fixed"]) or "none"))
    console.print("wrote " + ", ".join(str(p) for p in written))
