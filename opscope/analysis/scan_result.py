"""Assemble a ``ScanResult`` from a capture directory: the analysis half of ``opscope scan``.

Pure with respect to its inputs: the same capture always gives the same scan.json
(apart from timing fields), so a run can be re-analysed without re-running the script.
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from opscope.analysis.aggregate import aggregate
from opscope.analysis.dynamic_shapes import epoch_notes, find_dynamic_shapes
from opscope.analysis.npu.weights import weigh_by_npu
from opscope.analysis.verdicts.advice import eval_only_partial_batches
from opscope.model import Capture, ScanExit, ScanResult, ScanSettings, ScanSummary, ScanTarget
from opscope.version import __version__


def describe_outcome(outcome, steps_done: int, steps_wanted: int) -> tuple[bool, str | None]:
    """(complete, incomplete_reason) from how the child ended."""
    where = f" at {outcome.where}" if getattr(outcome, "where", None) else ""
    during = f" during step {steps_done + 1}" if steps_done < steps_wanted else ""
    if outcome.kind in ("steps-reached", "finished"):
        return True, None
    if outcome.kind == "exit" and outcome.code in (0, None):
        return True, None
    if outcome.kind == "exit":
        return False, f"the script exited with status {outcome.code}{where}{during}"
    if outcome.kind == "exception":
        return False, f"the script raised {outcome.message}{where}{during}"
    if outcome.kind == "timeout":
        return False, f"{outcome.message}; stopped{during}{where}"
    return False, f"{outcome.message}{during}"


def _torch_version() -> str:
    """The torch of this interpreter: the imported module's, or the installed distribution's (no import)."""
    module = sys.modules.get("torch")
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    from importlib import metadata
    try:
        return metadata.version("torch")
    except Exception:   # no torch, or broken metadata: the report says it does not know
        return ""


def build_scan_result(*, script: str, argv: list, device: str, settings: ScanSettings | dict,
                      outcome, started_at: str, duration_s: float, static_paths: list | None = None,
                      target: str | None = None, capture: Capture, torch_version: str | None = None) -> ScanResult:
    """``capture`` is what ``opscope.capture.store.load_capture`` read (or a session's snapshot);
    ``settings`` may come as the JSON the scan's child received.

    ``target`` is the torch_npu version to judge against: ``opscope scan`` passes the one its
    command resolved (``verdicts.resolve_target``); ``assign_verdicts`` looks its release up.
    ``torch_version``: the torch the script ran with (a recovered scan's outcome.json says it); by default the
    torch this process has imported or, without importing it, the one installed.
    """
    calls, steps, side, runtime_findings, meta = capture
    settings = ScanSettings.of(settings)
    warmup = int(settings.warmup or 0)
    indices = [s.index for s in steps]
    baseline = next((i for i in indices if i > warmup), indices[0] if indices else 1)
    complete, reason = describe_outcome(outcome, sum(1 for s in steps if s.complete), settings.steps or 0)
    # steady state: complete steps after the baseline step (set-up and step 1 excluded)
    steady = [s.index for s in steps if s.complete and s.index > baseline]
    operators = aggregate(calls, steady_steps=steady, resolve_overloads=not meta.overloads_resolved)
    setup_notes: list[str] = []
    dynamic, roots, dyn_keys = find_dynamic_shapes(calls, baseline, side, meta.dataloaders, setup_notes)
    eval_only_partial_batches(roots, dynamic, calls)   # a validation loader is not told drop_last
    for op in operators:
        op.dynamic = any((op.name, src) in dyn_keys for src in (op.sources if op.sources else [op.source]))
    uses_device = any(op.on_device for op in operators)
    host_note = _classify_host_ops(operators)
    result = ScanResult(
        script=str(Path(script).resolve()), argv=list(argv), device=device,
        torch_version=torch_version or _torch_version(), complete=complete, incomplete_reason=reason,
        tool_version=__version__, python_version=sys.version.split()[0],
        platform=f"{platform.system()} {platform.machine()}", cwd=os.getcwd(),
        started_at=started_at, duration_s=round(duration_s, 3), settings=settings,
        exit=ScanExit(kind=outcome.kind, code=outcome.code, message=outcome.message, where=outcome.where),
        steps=steps, operators=operators, dynamic_shapes=dynamic, root_causes=roots,
        findings=runtime_findings, traces=meta.traces,
    )
    done = len([s for s in steps if s.complete])
    if steps and done < (settings.steps or 0) and complete:
        result.notes.append(f"the script finished after {done} complete step(s), fewer than --steps "
                            f"{settings.steps}")
    result.notes.extend(meta.notes)   # what reading the capture back had to drop
    result.entry_lines = framework_entry_lines(calls)
    result.notes.extend(setup_notes)
    result.notes.extend(epoch_notes(meta.dataloaders, done))
    if host_note:
        result.notes.append(host_note)
    result.notes.extend(unrecorded_notes(steps))
    if warmup:
        result.notes.append(f"steps 1-{warmup} are warm-up: shape changes are judged against step {baseline}")
    if any((loader or {}).get("workers", 1) for loader in meta.dataloaders.values()):
        # (a capture of an older opscope does not say how many workers: the note stays)
        result.notes.append("DataLoader worker processes are not profiled (data loading runs outside the "
                            "training step)")
    dist = settings.distributed
    if dist:
        dirs = dist.get("rank_dirs") or {}
        gloo = ", gloo on the CPU in place of NCCL" if device == "cpu" else ""
        result.notes.append(f"distributed run ({dist.get('launcher')} launch, world size {dist.get('world_size')}"
                            f"{gloo}): this is rank {settings.rank or 0}; "
                            + ("captured ranks in the --out folder: " + ", ".join(
                                f"rank {r} in {'./' if d == '.' else d + '/'}" for r, d in dirs.items())
                               if len(dirs) > 1 else "the other ranks ran remapped but were not captured "
                                                     "(--ranks all captures each into its own folder)"))
    _add_static_findings(result, static_paths)
    _add_verdicts(result, target, uses_device, settings.chip)
    _add_npu_estimate(result, calls, settings.chip, settings.calibration)
    weigh_by_npu(result)   # the score and every share weigh the estimated NPU time, not this machine's CPU
    _add_third_party(result)
    _add_precision(result, meta.precision, device, (settings.wrapper or {}).get("dtype"))
    _refuse_empty_measurement(result, outcome, settings)
    _add_plan(result, settings.target)
    return result


def _add_plan(result: ScanResult, target: str | None) -> None:
    """The port plan: which torch_npu releases run every captured operator, the one to install with its torch,
    Python and CANN, and what in this environment must change.  A scan that measured nothing has no plan."""
    if result.summary.readiness_score is None or not result.operators:
        return
    from opscope.analysis.plan.releases import plan_for
    try:
        result.plan = plan_for(result, target=target)
    except Exception as exc:  # the plan is advice on top of the scan: its failure must not lose the scan
        result.notes.append(f"the port plan could not be made ({type(exc).__name__}: {exc}); "
                            "`opscope matrix plan RUN_DIR` retries it")


def _add_chip_dtypes(result: ScanResult, chip: str | None) -> None:
    """Findings for what the chip does with the operators' dtypes (bf16 on a 910A, float64, ...), among the
    operators that run on the NPU (judged: not-applicable ones left out); the score counts them."""
    from opscope.analysis.findings import merge_findings
    from opscope.analysis.verdicts.chip_dtypes import chip_dtype_findings
    result.findings = merge_findings(result.findings, chip_dtype_findings(result.operators, chip))


def _add_third_party(result: ScanResult) -> None:
    """The third-party libraries section: each library's version here, what to install, its ops (or None)."""
    from opscope.analysis.verdicts.support import op_time_basis
    from opscope.analysis.verdicts.third_party import library_rows
    if not result.operators or not any(op.verdict for op in result.operators):
        return
    rows = library_rows(result.operators, result.findings, op_time_basis(result.operators)[1])
    result.third_party = rows or None


def _add_npu_estimate(result: ScanResult, calls, chip: str | None, calibration: str | None = None) -> None:
    """What will be slow on the NPU (an estimate); a failure is a note, never a failed scan."""
    from opscope.analysis.npu.cost import calibration_factors
    from opscope.analysis.npu.estimate import estimate
    if not any(s.complete for s in result.steps):   # a partial step would be priced as a whole one
        result.notes.append("NPU time estimate not computed: no training iteration completed")
        return
    try:
        factors, source = calibration_factors(calibration, chip)
        result.npu_estimate = estimate(result.operators, result.steps, calls, chip, factors, source)
    except Exception as exc:   # noqa: BLE001  # an estimate must not cost the user the scan
        result.notes.append(f"NPU time estimate not computed: {type(exc).__name__}: {exc}")


def _add_precision(result: ScanResult, requested: dict | None, device: str, launch_dtype: str | None) -> None:
    """summary.precision: requested vs recorded dtypes; a mismatch is also a note (the headline may show it)."""
    from opscope.analysis.precision import precision_summary
    precision = precision_summary(requested, result.operators, device, launch_dtype)
    result.summary.precision = precision
    if precision["note"]:
        result.notes.insert(0, f"precision: {precision['note']}")


def framework_entry_lines(calls) -> list[str]:
    """User lines that run a whole training iteration in library code (``trainer.train()``,
    ``trainer.fit()``): model/library code below them made both forward or backward work and
    the optimizer's.  The user cannot act on such a line; reports lead with the library line."""
    phases: dict[str, set] = {}
    for c in calls:
        if c.source and c.library:
            phases.setdefault(c.source, set()).add(c.phase)
    return sorted(line for line, seen in phases.items() if "optimizer" in seen and seen & {"forward", "backward"})


def unrecorded_notes(steps) -> list[str]:
    """Say which parts of which steps ran unprofiled (capture memory is bounded per step)."""
    notes = []
    capped = [s for s in steps if (s.unrecorded or {}).get("after_calls")]
    if capped:
        first = capped[0].unrecorded
        where = f" (at {first['where']})" if first.get("where") else ""
        why = first.get("reason") or "--max-step-calls"
        notes.append(f"step(s) {', '.join(str(s.index) for s in capped)}: recording stopped after "
                     f"{first['after_calls']:,} torch calls{where} ({why}); the rest of each such step "
                     "ran unprofiled, so its operators are missing from this report")
    repeated = {  # Step.unrecorded key -> what ran unprofiled, and why that loses nothing
        "closure_forwards": "repeated closure evaluation(s) inside optimizer.step(closure) ran unprofiled "
                            "after the first evaluation of each step (they repeat the recorded operators)",
        "eval_forwards": "evaluation/sampling forward call(s) under no_grad/eval() ran unprofiled after the "
                         "first few of each step (they repeat the recorded ones; labelled phase 'eval')",
    }
    for key, text in repeated.items():
        hit = [s for s in steps if (s.unrecorded or {}).get(key)]
        if hit:
            total = sum(int(s.unrecorded[key]) for s in hit)
            notes.append(f"step(s) {', '.join(str(s.index) for s in hit)}: {total:,} {text}")
    return notes


def nothing_measured_reason(steps, operators, outcome, settings: ScanSettings) -> str | None:
    """Why this run measured nothing worth a score, or None when it measured something.

    A score computed from no training iteration would read "ready" for a script that
    never ran on the (simulated) device; opscope says it cannot know instead.
    """
    complete = [s for s in steps if s.complete]
    judged = [op for op in operators if op.on_device and op.phase != "other"]
    if complete and judged:
        return None
    where = f" at {outcome.where}" if getattr(outcome, "where", None) else ""
    if outcome.kind == "timeout":
        return (f"--timeout {settings.timeout or 0:g}s ended the script inside step 1{where} before any "
                "training iteration completed; raise --timeout or lower the script's per-step work")
    stopped = outcome.kind in ("exception", "killed", "interrupted", "write-error") or (
        outcome.kind == "exit" and outcome.code not in (0, None))
    if not complete and steps and stopped:
        # the step marker is not the suspect: the script stopped (the error says where and why)
        return "no training iteration completed before the script stopped: nothing to judge; fix that and scan again"
    if not complete and steps:
        marker = settings.step_marker or "auto"
        return ("no training iteration completed: the script ended before its first optimizer step / "
                f"backward pass (step marker {marker}); check the script's arguments, or use "
                "--step-marker module for an inference loop")
    if not steps:
        return ("no operator was recorded: the script ended before running any torch operation under the "
                "profiler (ranks not reached, or the work ran in processes opscope does not capture)")
    return ("no operator of the training iterations was recorded: nothing to judge; check that the script "
            "trains in this process")


def partial_steps_text(steps) -> str:
    """Which steps were recorded only in part and how much of each: '' when none was.

    ``step 1: the first 1,341 of 4,210 torch calls (32 %)``; a step recorded before the total was kept
    says only how many calls were recorded."""
    parts = []
    for s in steps or []:
        u = s.unrecorded or {}
        if not u.get("after_calls"):
            continue
        recorded, total = int(u["after_calls"]), int(u.get("calls") or 0)
        share = f" of {total:,} torch calls ({recorded / total:.0%})" if total >= recorded > 0 else " torch calls"
        parts.append(f"step {s.index}: the first {recorded:,}{share}")
    if not parts:
        return ""
    why = next(((s.unrecorded or {}).get("reason") for s in steps if (s.unrecorded or {}).get("after_calls")), None)
    return "recorded in part, " + "; ".join(parts) + f" ({why or '--max-step-calls'})"


def no_whole_step_reason(steps) -> str | None:
    """Why a score would mislead when every step stopped recording part-way (``--max-capture-mb``,
    ``--max-step-calls``): it would judge a fragment of the iteration as the whole; None otherwise."""
    complete = [s for s in steps if s.complete]
    if not complete or any(not (s.unrecorded or {}).get("after_calls") for s in complete):
        return None
    return (f"no step was recorded whole ({partial_steps_text(steps)}): a score would judge part of each "
            "iteration as the whole; raise the limit named and scan again")


def _refuse_empty_measurement(result: ScanResult, outcome, settings: ScanSettings) -> None:
    partial = no_whole_step_reason(result.steps)
    if partial is not None and nothing_measured_reason(result.steps, result.operators, outcome, settings) is None:
        result.summary.readiness_score = None   # the run itself ended as it should: no score, and why
        result.summary.score_unavailable = partial
        return
    reason = nothing_measured_reason(result.steps, result.operators, outcome, settings)
    if reason is None:
        return
    result.summary.readiness_score = None
    result.summary.score_unavailable = reason
    if result.complete:
        result.complete = False
        result.incomplete_reason = reason
    elif reason not in (result.incomplete_reason or ""):
        result.notes.insert(0, reason)


def _classify_host_ops(operators) -> str | None:
    """Which operators would stay on the host after porting.

    Set-up and data-loading work (phase ``other``: before the first forward, inside a
    DataLoader's ``next()``) on host tensors keeps running on the CPU after the port (data
    preparation, a sparse matrix built with scipy, model initialisation before ``.cuda()``):
    it needs no NPU kernel.  In a script that puts tensors on its accelerator, operators
    that touched its tensors stay candidates; in a script that uses no accelerator, set-up
    is assumed to stay on the host as well (the evidence says so).  Operators that only ran
    while a library was being imported (version probes) are not training work at all.
    """
    uses_device = any(op.on_device for op in operators)
    imported = [op for op in operators if op.import_time]
    notes = [f"{len(imported)} operator signature(s) only ran while a library was being imported "
             "(module-level code such as version probes): not training work, no NPU kernel needed"] if imported else []
    # Conservative: only set-up and data-loading work (phase "other") on host tensors is
    # judged host-only.  Inside the training step a host tensor here may be a device tensor
    # there (e.g. made with device=x.device after the remap), so those stay candidates.
    for op in operators:
        op.on_device = not op.import_time and (
            op.on_device or any(phase != "other" for phase in (op.phases or [op.phase])))
    host = [op for op in operators if not op.on_device and not op.import_time]
    if host:
        where = "" if uses_device else " (the script uses no accelerator: its set-up is assumed to stay on the host)"
        notes.append(f"{len(host)} operator signature(s) only ran on host tensors during set-up or data loading"
                     f"{where}: they stay on the CPU after porting and need no NPU kernel")
    return "; ".join(notes) or None


def _add_static_findings(result: ScanResult, static_paths: list | None) -> None:
    if static_paths is None:
        return
    assert result.script is not None   # build_scan_result's result names its script
    from opscope.analysis.findings import merge_findings
    from opscope.analysis.static.scan import scan_paths
    files = {Path(result.script)}
    root = Path(result.script).parent
    for op in result.operators:
        for src in op.sources or []:
            path = (root / src.rsplit(":", 1)[0])
            if path.suffix == ".py" and path.exists():
                files.add(path)
    files.update(Path(p) for p in static_paths)
    from opscope.knowledge import load
    judged_by_run = set(load("cuda_api_rules.yaml").get("judged_by_the_run") or [])
    static = [f for f in scan_paths(sorted(files)) if f.rule not in judged_by_run]
    for f in static:  # same path convention as run-time findings: relative to the script's folder
        if f.file:
            full = Path(f.file).resolve()
            if full.is_relative_to(root.resolve()):
                f.file = str(full.relative_to(root.resolve()))
    result.findings = merge_findings(result.findings, static)


def _add_verdicts(result: ScanResult, target: str | None, uses_device: bool = True, chip: str | None = None) -> None:
    from opscope.analysis.verdicts.support import assign_verdicts, mark_host_only, readiness_summary
    result.target = ScanTarget.from_dict(assign_verdicts(result.operators, target), "$.target")
    mark_host_only(result.operators, uses_device)
    _add_chip_dtypes(result, chip)   # after the verdicts (not-applicable ops never run on the NPU), before the score
    result.summary = ScanSummary.from_dict(readiness_summary(result), "$.summary")


def retarget(result: ScanResult, target: str) -> None:
    """Judge a stored scan again for another torch_npu release (``opscope report RUN --target V``), without
    re-running the script: verdicts, host-only marks, the third-party rows, the NPU estimate's basis (which
    signatures are priced, which as CPU fallbacks, and why) and the port plan for that release.  What the
    summary holds besides the score (precision, why there is no score) is kept: a scan that measured nothing
    still has no score and no plan.  The caller re-prices the estimate and re-weighs the score."""
    from opscope.analysis.verdicts.support import resolve_target
    version = resolve_target(target)   # an unknown release is a one-line error naming the known ones
    old = result.summary.to_dict()
    uses_device = any(op.on_device for op in result.operators)
    from opscope.analysis.verdicts.chip_dtypes import is_chip_dtype_finding
    result.findings = [f for f in result.findings if not is_chip_dtype_finding(f)]
    _add_verdicts(result, version, uses_device, result.settings.chip)
    from opscope.analysis.verdicts.support import refreshed_summary
    result.summary = refreshed_summary(result, old)
    result.settings.target = version
    if result.npu_estimate is not None and result.npu_estimate.basis is not None:
        _rebuild_basis(result)
    _add_third_party(result)
    if result.plan is not None:
        _add_plan(result, version)


def _rebuild_basis(result: ScanResult) -> None:
    """The estimate's basis made again from the stored operators with their new verdicts (a signature that
    falls back on one release and runs natively on another is priced differently, or not at all below its
    parent); what the scan read from its op stream is carried over (``rebuild_basis``)."""
    from opscope.analysis.npu.estimate import rebuild_basis
    assert result.npu_estimate is not None and result.npu_estimate.basis is not None
    result.npu_estimate.basis = rebuild_basis(result.operators, result.steps, result.npu_estimate.basis)
