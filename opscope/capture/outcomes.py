"""How a capture ended: the ``ChildOutcome`` the parent reports, and the run's end read from its ranks.

Both sides read rank outcomes: the parent's torchrun-style launcher (``distributed.run_ranks``)
and the capture child of a script that spawns its own ranks (``ranks.after_script``).  Each rank
writes ``capture/outcome.json`` into its folder (``protocol.rank_dir``); this module turns those
into the run's one outcome.  Torch-free.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from opscope.capture.protocol import rank_dir
from opscope.capture.run_folder import CAPTURE, OUTCOME, RunFolder, write_error_of_status


@dataclass
class ChildOutcome:
    kind: str                 # finished | steps-reached | exception | exit | killed | timeout | write-error
    code: int | None = None
    message: str = ""
    where: str | None = None
    steps: int = 0
    returncode: int | None = None
    extra: dict = field(default_factory=dict)


def failed(outcome: dict | None) -> bool:
    if outcome is None:
        return True
    kind = outcome.get("kind")
    return kind in ("exception", "usage", "write-error") or (kind == "exit" and outcome.get("code") not in (0, None))


def culprit(outcomes: dict) -> tuple[int, dict] | None:
    """The rank whose failure ended the run: the first to raise/exit non-zero, else the first killed.

    ``outcomes``: rank -> outcome dict (``None`` when the rank wrote none; then
    ``{"kind": "killed", ...}`` should already be filled in by the caller).
    """
    def when(item):
        return (item[1] or {}).get("ended", float("inf")), item[0]
    raised = sorted(((r, o) for r, o in outcomes.items() if failed(o)), key=when)
    if raised:
        return raised[0]
    killed = sorted(((r, o) for r, o in outcomes.items() if o and o.get("kind") == "killed"), key=when)
    return killed[0] if killed else None


def rank_failure(rank: int, outcome: dict) -> dict:
    """A rank's outcome, restated as the outcome of the whole run (its rank named)."""
    out = dict(outcome)
    if out.get("kind") in ("exception", "exit") and out.get("where"):
        out["where"] = f"{out['where']} (rank {rank})"
    elif out.get("kind") in ("exception", "exit"):
        out["where"] = f"rank {rank}"
    else:
        out["message"] = f"rank {rank}: {out.get('message') or 'ended abruptly'}"
    return out


def read_rank_outcome(out_dir: Path, rank: int, captured: bool, returncode: int | None) -> dict:
    folder = RunFolder(rank_dir(out_dir, rank, captured))
    data = folder.read_outcome()
    failure = write_error_of_status(returncode)
    if data is None and failure:   # the rank could not even write its outcome (disk full)
        return {"kind": "write-error", "code": None, "message": f"{failure} writing {CAPTURE}/{OUTCOME}",
                "where": None, "steps": 0, "ended": time.time(), "error_path": str(folder.outcome_path)}
    if data is None:
        if returncode is not None and returncode < 0:
            message = f"killed by {signal.Signals(-returncode).name}"
        else:
            message = f"the rank process ended abruptly (exit status {returncode})"
        return {"kind": "killed", "code": returncode, "message": message, "where": None, "steps": 0,
                "ended": time.time()}
    return data
