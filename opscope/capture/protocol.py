"""The contract between ``opscope scan``'s parent and its capture child: one typed ``ScanPlan``.

The parent (``runner``, the ``distributed`` launcher) builds the plan and writes it to
``capture/config.json`` (``to_json``); the child (``child``, ``ranks``) reads it back
(``from_json``), which refuses an unknown, missing or ill-typed key, so both sides agree on
every field or the run stops at once.  A torchrun-style rank gets ``plan.for_rank(r)``.
Also here, because both sides need them: where a rank writes (``rank_dir``) and the
environment names of a distributed launch.

Torch-free; it imports only ``run_folder`` (file names), so neither side imports the other.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from opscope.capture.run_folder import CAPTURE

ENV_WORLD_SIZE = "OPSCOPE_WORLD_SIZE"      # torch.cuda.device_count() in the script's processes
ENV_MASTER_PORT = "OPSCOPE_MASTER_PORT"    # the rendezvous port every init_process_group uses
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
PEER_EXIT_SECONDS = 30.0   # after rank 0 is done, how long the other ranks may take to stop


class ProtocolError(ValueError):
    """A plan that does not match this version's fields: written by another opscope, or a bug."""


@dataclass(frozen=True)
class DistributedPlan:
    """How ``distributed.resolve`` launches a distributed script (None in a plan: one process)."""

    launcher: str                    # spawn | torchrun
    world_size: int
    ranks: tuple[int, ...]           # the captured ranks; 0 always
    local_rank_flag: str | None      # the script's --local_rank spelling (torch.distributed.launch)
    detected: str                    # what the script's source asks for (spawn | torchrun | none)

    def __post_init__(self) -> None:
        _typed(self)


@dataclass(frozen=True)
class ScanPlan:
    """Everything the capture child needs to run and capture one script (or one rank of it)."""

    script: str
    argv: tuple[str, ...]
    out_dir: str
    steps: int
    device: str = "auto"             # auto|cpu|cuda|npu; the child resolves auto (``with_device``)
    plugins: tuple[str, ...] = ()    # "module:function" installed in the child before the script runs
    step_marker: str = "auto"
    export_traces: bool = True
    analyse: bool = False            # the child writes scan.json itself
    settings: dict = field(default_factory=dict)   # scan.json's ``settings``, recorded as given
    target: str | None = None        # the torch_npu version judged against, resolved by the command
    static: bool = True              # scan.json includes the static scan of the script's source
    timeout: float | None = None     # --timeout, seconds (the parent enforces it; the child names it)
    # capture options: how the session records (``session_options``)
    keep_compile: bool = False
    max_step_calls: int | None = None
    max_capture_mb: int | None = None
    mode: str = "real"               # real | fake | probe (capture/fake_mode.py)
    distributed: DistributedPlan | None = None
    rank: int | None = None          # a torchrun-style rank's own plan (``for_rank``)
    capture: bool = True             # False: a rank that runs uncaptured
    started_epoch: float = 0.0       # set by ``started``
    started_at: str = ""

    def __post_init__(self) -> None:
        _typed(self)

    # -- derived plans -------------------------------------------------------------------
    def started(self) -> ScanPlan:
        """The plan as the parent writes it: absolute paths, stamped with the start time."""
        return dataclasses.replace(self, script=str(Path(self.script).resolve()),
                                   out_dir=str(Path(self.out_dir).resolve()), started_epoch=time.time(),
                                   started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()))

    def with_device(self, device: str) -> ScanPlan:
        """The plan once the child resolved ``auto`` (it imports torch anyway)."""
        return dataclasses.replace(self, device=device)

    def rank_settings(self, rank: int) -> dict:
        """scan.json ``settings`` of rank ``rank``'s folder."""
        return dict(self.settings, rank=rank)

    def for_rank(self, rank: int) -> ScanPlan:
        """The plan of one torchrun-style rank: its folder, whether it is captured, its ``--local_rank``."""
        if self.distributed is None:
            raise ProtocolError("for_rank needs a distributed plan")
        captured = rank in self.distributed.ranks
        return dataclasses.replace(
            self, out_dir=str(rank_dir(Path(self.out_dir), rank, captured).resolve()), rank=rank, capture=captured,
            analyse=self.analyse and captured, argv=rank_argv(self.argv, rank, self.distributed.local_rank_flag),
            settings=self.rank_settings(rank))

    # -- what the child reads --------------------------------------------------------------
    @property
    def user_root(self) -> str:
        """The script's folder: code under it is the user's."""
        return os.path.dirname(os.path.abspath(self.script))

    @property
    def captured_ranks(self) -> tuple[int, ...]:
        return self.distributed.ranks if self.distributed is not None else (0,)

    def session_options(self) -> dict:
        """``CaptureSession`` keywords (all but the folder, which differs per rank)."""
        options: dict = {"steps": self.steps, "step_marker": self.step_marker, "user_root": self.user_root,
                         "remap": self.device == "cpu", "export_traces": self.export_traces,
                         "keep_compile": self.keep_compile,
                         "track_memory": self.mode not in ("fake", "probe")}   # fake mode tracks its own
        options.update({k: v for k, v in (("max_step_calls", self.max_step_calls),
                                          ("max_capture_mb", self.max_capture_mb)) if v})
        return options

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data) -> ScanPlan:
        return _from_dict(cls, data, "scan plan")

    @classmethod
    def from_json(cls, text: str) -> ScanPlan:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProtocolError(f"scan plan: not JSON ({exc})") from None
        return cls.from_dict(data)


def rank_dir(out_dir: Path, rank: int, captured: bool) -> Path:
    """Where a rank writes: the run folder (rank 0), rank{r}/ (captured), capture/ranks/rank{r}/ (not captured)."""
    out_dir = Path(out_dir)
    if not captured:
        return out_dir / CAPTURE / "ranks" / f"rank{rank}"
    return out_dir if rank == 0 else out_dir / f"rank{rank}"


def rank_argv(argv, rank: int, flag: str | None) -> tuple[str, ...]:
    """torch.distributed.launch passes --local_rank=N to scripts that declare it."""
    argv = tuple(argv)
    if flag and not any(a.split("=")[0] in LOCAL_RANK_FLAGS for a in argv):
        argv += (f"{flag}={rank}",)
    return argv


# -- typed fields ---------------------------------------------------------------------------
def _from_dict(cls, data, where: str):
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}: expected an object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown or missing:
        raise ProtocolError(f"{where}: " + "; ".join(
            part for part in (unknown and f"unknown key(s) {', '.join(map(repr, unknown))}",
                              missing and f"missing key(s) {', '.join(map(repr, missing))}") if part))
    return cls(**data)


def _typed(obj) -> None:
    """Check (and normalise: lists to tuples, objects to nested plans) every field of ``obj``."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = _convert(getattr(obj, f.name), hints[f.name], f"{type(obj).__name__}.{f.name}")
        object.__setattr__(obj, f.name, value)


_HINTS: dict[type, dict] = {}


def _hints(cls: type) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _convert(value, hint, where: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return _convert(value, option, where)
            except ProtocolError:
                pass
        return _convert(value, options[-1], where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _wrong(value, "a list", where)
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else _from_dict(hint, value, where)
    wanted = origin or hint
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
        raise _wrong(value, wanted.__name__, where)
    return value


def _wrong(value, wanted: str, where: str) -> ProtocolError:
    return ProtocolError(f"{where}: expected {wanted}, got {type(value).__name__} {value!r:.60}")
