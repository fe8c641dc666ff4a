"""Distributed launches, parent side: which launcher a script wants, and torchrun-style ranks.

A training script is launched one of three ways:

* ``spawn``: the script itself calls ``torch.multiprocessing.spawn``/``start_processes``
  (or starts one ``multiprocessing.Process(target=fn, args=(rank, ...))`` per rank).
  One capture child runs it; ``ranks.py`` (inside that child) wraps the spawn so every
  rank process is remapped, stops after ``--steps`` and, for captured ranks, profiled.
* ``torchrun``: the script expects a launcher (``init_process_group()`` reading
  ``RANK``/``WORLD_SIZE``/``MASTER_*`` from the environment, ``LOCAL_RANK``, or the legacy
  ``--local_rank`` argument of ``torch.distributed.launch``).  opscope is the launcher:
  ``run_ranks`` starts ``world_size`` capture children with that environment.
* ``none``: a single process.

Rank 0 is always captured into the run folder itself; ``--ranks all`` adds
``rank1/`` ... ``rank{N-1}/``, each a complete run folder.  Ranks that are not
captured keep their bookkeeping under ``capture/ranks/``.  Every rank gets a free
local rendezvous port (``OPSCOPE_MASTER_PORT``), which replaces the script's own
``MASTER_PORT`` / ``tcp://host:port`` so parallel scans never collide.

This module is imported by the parent and must not import torch.
"""
from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from opscope.capture.outcomes import ChildOutcome, culprit, failed, rank_failure, read_rank_outcome
from opscope.capture.processes import LineCounter, relay_stderr, signal_group
from opscope.capture.protocol import (
    ENV_MASTER_PORT,
    ENV_WORLD_SIZE,
    LOCAL_RANK_FLAGS,
    PEER_EXIT_SECONDS,
    DistributedPlan,
    ScanPlan,
    rank_dir,
)
from opscope.capture.run_folder import RunFolder
from opscope.errors import UserError

LAUNCHERS = ("auto", "spawn", "torchrun", "none")
DEFAULT_WORLD_SIZE = 2
GRACE_SECONDS = 10.0
PEER_GRACE_SECONDS = 5.0   # after a rank failed, how long the others may take to notice and end

_SPAWN_CALLS = {"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.spawn.start_processes"}
_PROCESS_CALLS = {"multiprocessing.Process", "torch.multiprocessing.Process", "multiprocessing.context.Process"}
_RANK_ENV_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"}


# -- which launcher -----------------------------------------------------------------------
# above complexity 15: one branch per launcher idiom found in the script's source
def detect_launcher(script) -> tuple[str, str | None]:  # noqa: C901
    """('spawn'|'torchrun'|'none', the script's --local_rank flag spelling or None), from its source.

    A script that only *reads* the launcher's environment with a fallback
    (``int(os.environ.get('RANK', -1)) != -1``, ``if 'WORLD_SIZE' in os.environ``) runs as one
    process, as its user runs it; it is torchrun-style only when it cannot run without a
    launcher: it reads RANK/LOCAL_RANK/... without a default, initialises an env:// process
    group, or requires ``--local_rank``, outside any ``if``.
    """
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return "none", None
    aliases: dict[str, str] = {}
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    spawn = process = init = needs = False
    flag = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in LOCAL_RANK_FLAGS and flag is None:
                flag = node.value
        elif isinstance(node, ast.Subscript) and _is_rank_env_read(node, aliases):
            needs = needs or not _conditional(node, parents)
        elif isinstance(node, ast.Call):
            name = _qualname(node.func, aliases)
            if name in _SPAWN_CALLS:
                spawn = True
            elif name in _PROCESS_CALLS or _is_context_process(node.func, aliases):
                process = True
            elif name and name.split(".")[-1] == "init_process_group":
                init = True
                needs = needs or (_env_rendezvous(node) and not _conditional(node, parents))
            elif _required_rank_flag(node) or _int_of_env_without_default(node, aliases):
                needs = needs or not _conditional(node, parents)
    if spawn or (process and init):   # ranks started by the script itself (spawn, or one Process per rank)
        return "spawn", flag
    if needs:
        return "torchrun", flag
    return "none", None


def _is_rank_env_read(node: ast.Subscript, aliases) -> bool:
    """``os.environ["RANK"]`` read (not assigned)."""
    key = node.slice
    return (isinstance(node.ctx, ast.Load) and isinstance(key, ast.Constant) and key.value in _RANK_ENV_NAMES
            and (_qualname(node.value, aliases) or "").endswith("environ"))


def _int_of_env_without_default(call: ast.Call, aliases) -> bool:
    """``int(os.environ.get("RANK"))`` / ``int(os.getenv("LOCAL_RANK"))``: fails without a launcher."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "int" and call.args):
        return False
    inner = call.args[0]
    if not isinstance(inner, ast.Call) or len(inner.args) != 1 or inner.keywords:
        return False
    name = _qualname(inner.func, aliases) or ""
    key = inner.args[0]
    return (name.endswith(("environ.get", "getenv")) and isinstance(key, ast.Constant)
            and key.value in _RANK_ENV_NAMES)


def _required_rank_flag(call: ast.Call) -> bool:
    """``parser.add_argument("--local_rank", ..., required=True)`` (torch.distributed.launch passes it)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
        return False
    names = {a.value for a in call.args if isinstance(a, ast.Constant)}
    required = next((k.value for k in call.keywords if k.arg == "required"), None)
    return bool(names & set(LOCAL_RANK_FLAGS)) and isinstance(required, ast.Constant) and required.value is True


def _conditional(node: ast.AST, parents: dict) -> bool:
    """Under an ``if``/``try``/conditional expression/``or`` (other than ``if __name__ == "__main__"``)."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and child is not parent.test and not _is_main_guard(parent.test):
            return True
        if isinstance(parent, (ast.IfExp, ast.Try, ast.BoolOp)) and child is not getattr(parent, "test", None):
            return True
        child, parent = parent, parents.get(parent)
    return False


def _is_main_guard(test: ast.AST) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__")


def _is_context_process(func, aliases) -> bool:
    """``multiprocessing.get_context("spawn").Process(...)``."""
    return (isinstance(func, ast.Attribute) and func.attr == "Process" and isinstance(func.value, ast.Call)
            and (_qualname(func.value.func, aliases) or "").endswith("multiprocessing.get_context"))


def _qualname(node, aliases) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _qualname(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def _env_rendezvous(call: ast.Call) -> bool:
    """init_process_group(...) that takes rank and world size from the environment."""
    kwargs = {k.arg: k.value for k in call.keywords if k.arg}
    if "rank" in kwargs or "store" in kwargs or len(call.args) >= 5 or any(k.arg is None for k in call.keywords):
        return False
    method = kwargs.get("init_method", call.args[1] if len(call.args) > 1 else None)
    return method is None or (isinstance(method, ast.Constant) and str(method.value).startswith("env://"))


def resolve(requested: str, script, world_size: int | None, ranks: str) -> DistributedPlan | None:
    """The launch plan for ``opscope scan``, or None for a single process."""
    requested = (requested or "auto").lower()
    if requested not in LAUNCHERS:
        raise UserError(f"unknown --launcher {requested!r}: use auto, spawn, torchrun or none")
    if world_size is not None and world_size < 1:
        raise UserError("--world-size must be at least 1")
    detected, flag = detect_launcher(script)
    launcher = detected if requested == "auto" else requested
    if launcher == "none":
        if world_size not in (None, 1) or (ranks or "0") != "0":
            raise UserError(f"--world-size/--ranks need a distributed launch; {Path(script).name} runs as one "
                            "process (it does not call torch.multiprocessing.spawn, and reads RANK/LOCAL_RANK only "
                            "with a fallback, if at all): use --launcher torchrun|spawn")
        return None
    world = world_size or DEFAULT_WORLD_SIZE
    return DistributedPlan(launcher=launcher, world_size=world, ranks=tuple(parse_ranks(ranks, world)),
                           local_rank_flag=flag, detected=detected)


def parse_ranks(spec: str, world: int) -> list[int]:
    spec = (spec or "0").strip().lower()
    if spec == "all":
        return list(range(world))
    try:
        wanted = {int(part) for part in spec.split(",") if part.strip()}
    except ValueError:
        raise UserError(f"--ranks {spec!r}: use 0 (default), all, or a list such as 0,3") from None
    bad = sorted(r for r in wanted if not 0 <= r < world)
    if bad:
        raise UserError(f"--ranks {spec}: rank {bad[0]} is outside the world size {world} (--world-size)")
    return sorted(wanted | {0})


def describe(plan: DistributedPlan) -> str:
    """The one line printed before the run: launcher, world size, what is captured."""
    world = plan.world_size
    captured = plan.ranks
    what = ("rank 0" if captured == (0,) else
            "every rank" if len(captured) == world else "ranks " + ",".join(map(str, captured)))
    if plan.launcher == "spawn":
        how = f"torch.multiprocessing.spawn script; torch.cuda.device_count() = {world} (--world-size)"
    else:
        how = f"torchrun-style script; opscope starts {world} ranks (--world-size) with RANK/WORLD_SIZE/MASTER_PORT"
    return f"distributed: {how}; capturing {what}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(plan: DistributedPlan, port: int) -> dict:
    """Environment of every process of a distributed scan."""
    return {ENV_WORLD_SIZE: str(plan.world_size), ENV_MASTER_PORT: str(port),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def rank_env(rank: int, world: int) -> dict:
    """What torchrun sets for a worker on a single node."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": "1",
            "TORCHELASTIC_RUN_ID": "opscope", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}


# -- torchrun-style: opscope starts the ranks -----------------------------------------------
def run_ranks(plan: ScanPlan, child_env: dict, progress=None) -> ChildOutcome:
    """Start one capture child per rank (rank 0 captured into the run folder); return a ChildOutcome.

    Any rank that raises, exits non-zero or is killed stops the others (SIGINT, then
    SIGKILL); ``plan.timeout`` stops all (SIGTERM).  Every rank runs in its own process
    group, and every group is killed before returning, whatever happened.
    """
    assert plan.distributed is not None
    world, captured = plan.distributed.world_size, set(plan.distributed.ranks)
    out_dir = Path(plan.out_dir)
    timeout = plan.timeout
    procs: dict[int, subprocess.Popen] = {}
    relays = []
    started = time.monotonic()
    timed_out = False
    outcomes: dict[int, dict] = {}
    steps = LineCounter(RunFolder(out_dir).steps_log)
    previous = _on_sigterm()
    try:
        for rank in range(world):
            rank_plan = plan.for_rank(rank)
            folder = RunFolder(rank_plan.out_dir)
            folder.clear_capture()
            path = folder.write_config(rank_plan.to_dict())
            env = dict(child_env, **rank_env(rank, world))
            proc = subprocess.Popen([sys.executable, "-m", "opscope.scan_child", str(path)], cwd=os.getcwd(),
                                    env=env, start_new_session=True, stderr=subprocess.PIPE)
            procs[rank] = proc
            relay = threading.Thread(target=relay_stderr, args=(proc.stderr, RunFolder(out_dir).capture_dir), daemon=True)
            relay.start()
            relays.append(relay)
        stopping = False
        while len(outcomes) < world:
            time.sleep(0.25)
            for rank, proc in procs.items():
                if rank not in outcomes and proc.poll() is not None:
                    outcomes[rank] = read_rank_outcome(out_dir, rank, rank in captured, proc.returncode)
                    stopping = stopping or failed(outcomes[rank]) or outcomes[rank].get("kind") == "killed"
            if progress is not None:
                progress(steps.count())
            if timeout and not timed_out and time.monotonic() - started > timeout:
                timed_out = True
                _stop_all(procs, signal.SIGTERM)
                break
            if stopping:  # a rank failed: the others may wait for it forever in a collective
                _stop_peers(procs, out_dir, captured)
                break
            if 0 in outcomes and time.time() - outcomes[0].get("ended", time.time()) > PEER_EXIT_SECONDS:
                _stop_peers(procs, out_dir, captured)  # rank 0 is done; a peer stuck past it is not worth waiting for
                break
    except _Terminated:
        _stop_all(procs, signal.SIGTERM)
        _redeliver_sigterm(previous)
        raise KeyboardInterrupt from None   # only reached when the previous handler returned
    except BaseException:
        _stop_all(procs, signal.SIGTERM)
        raise
    finally:
        for proc in procs.values():  # DataLoader workers and anything else the ranks started
            signal_group(proc, signal.SIGKILL)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for relay in relays:
        relay.join(timeout=5)
    if progress is not None:
        progress(steps.count())
    return _run_outcome(plan, outcomes, {rank: proc.returncode for rank, proc in procs.items()}, timed_out)


def _run_outcome(plan: ScanPlan, outcomes: dict[int, dict], returncodes: dict[int, int | None],
                 timed_out: bool) -> ChildOutcome:
    """The run's end from every rank's: the timeout, else the first failing rank's (named), else rank 0's.

    ``outcomes``: what was read while the ranks ran; a rank missing there, or read as killed
    (it may have written its outcome since), is read again now that every rank has ended."""
    for rank, returncode in returncodes.items():
        if rank not in outcomes or outcomes[rank].get("kind") == "killed":
            outcomes[rank] = read_rank_outcome(Path(plan.out_dir), rank, rank in plan.captured_ranks, returncode)
    main = outcomes[0]
    if main.get("kind") == "usage":
        raise UserError(main.get("message", ""))
    extra = {k: main[k] for k in ("analysed", "device") if k in main}
    if timed_out:
        if main.get("kind") != "timeout":
            extra.pop("analysed", None)
        return ChildOutcome("timeout", None, f"the script did not finish {plan.steps} steps within "
                            f"--timeout {plan.timeout or 0:g}s", steps=main.get("steps", 0),
                            returncode=returncodes[0], extra=extra)
    if failed(main) or main.get("kind") == "killed" or any(failed(o) for o in outcomes.values()):
        rank, data = culprit(outcomes) or (0, main)
        data = rank_failure(rank, data)
        extra.pop("analysed", None)   # rank 0's scan.json tells its own end; the run's end is the culprit's
        if data.get("error_path"):   # a rank could not write its folder (disk full)
            extra["error_path"] = data["error_path"]
        return ChildOutcome(data.get("kind", "killed"), data.get("code"), data.get("message", ""),
                            where=data.get("where"), steps=main.get("steps", 0), returncode=returncodes[rank],
                            extra=extra)
    return ChildOutcome(main.get("kind", "finished"), main.get("code"), main.get("message", ""),
                        where=main.get("where"), steps=main.get("steps", 0), returncode=returncodes[0],
                        extra=extra)


class _Terminated(BaseException):
    pass


def _on_sigterm():
    """While the ranks run, SIGTERM to opscope first stops them (their groups are not ours).  A second SIGTERM
    arrives while they write their own reports of what they captured (each rank analyses its own steps): it is
    not raised inside that wait, which the grace period already bounds, so the ranks' reports are kept."""
    if threading.current_thread() is not threading.main_thread():
        return None
    stopping = False

    def handler(signum, frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise _Terminated()

    return signal.signal(signal.SIGTERM, handler)


def _redeliver_sigterm(previous) -> None:
    """Hand SIGTERM on to whatever handled it before (by default: end opscope with it)."""
    if callable(previous):
        previous(signal.SIGTERM, None)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)


def _stop_peers(procs: dict, out_dir: Path, captured: set) -> None:
    """Let ranks that are ending on their own (a peer's failure reaches them as a gloo error) finish
    writing; interrupt the ones still inside the script; kill what is left after the grace period."""
    deadline = time.monotonic() + PEER_GRACE_SECONDS
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(0.1)
    for rank, proc in procs.items():
        ending = RunFolder(rank_dir(out_dir, rank, rank in captured)).outcome_path.exists()
        if proc.poll() is None and not ending:
            signal_group(proc, signal.SIGINT)
    _stop_all(procs, None)


def _stop_all(procs: dict, sig) -> None:
    for proc in procs.values():
        if proc.poll() is None and sig is not None:
            signal_group(proc, sig)
    deadline = time.monotonic() + GRACE_SECONDS
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
