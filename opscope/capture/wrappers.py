"""Launch wrappers in front of the script: ``accelerate launch``, ``torchrun``, ``deepspeed``, ``lightning run model``.

``opscope scan -- accelerate launch --mixed_precision fp16 train.py ARGS`` (or
``opscope scan $(which accelerate) -- launch ...``) scans ``train.py`` as that wrapper would
run it: with the wrapper's process count (a torchrun-style launch by opscope when it is more
than one) and the settings it hands the script through the environment (accelerate's
``ACCELERATE_MIXED_PRECISION``, Lightning's ``LT_PRECISION``).  The wrappers, their flags and
those variables are data (``wrappers:`` in ``support_matrix/runtime_remaps.yaml``).

Imported by the parent: no torch here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from opscope.errors import UserError


@dataclass
class Wrapped:
    wrapper: str                 # accelerate | torchrun | lightning | deepspeed | python
    script: str
    args: list[str]
    world_size: int = 1
    env: dict = field(default_factory=dict)
    precision: str | None = None
    dtype: str | None = None     # the autocast dtype that precision asks for (float16, bfloat16)

    def describe(self) -> str:
        extra = f", mixed precision {self.precision}" if self.precision else ""
        procs = f"{self.world_size} process{'es' if self.world_size != 1 else ''}"
        return f"{self.wrapper} launch: scanning {os.path.basename(self.script)} ({procs}{extra})"


def _table() -> dict:
    from opscope.knowledge import load
    return load("runtime_remaps.yaml").get("wrappers") or {}


def _program(name: str) -> str:
    return os.path.basename(name)


def unwrap(script: str, args: list[str]) -> Wrapped | None:
    """The inner script of a wrapper command line, or None when ``script`` is the script itself."""
    if script.endswith(".py"):
        return None
    prog = _program(script)
    args = list(args)
    if prog.startswith("python") and not script.endswith(".py"):
        if args[:1] == ["-m"] and len(args) > 1:
            module, rest = args[1], args[2:]
            for name, spec in _table().items():
                if module in spec.get("program", []):
                    return _parse(name, spec, rest)
            raise UserError(f"python -m {module}: opscope scans a script file; give the script "
                            "(opscope scan train.py -- ARGS)")
        if args and args[0].endswith(".py"):
            return Wrapped("python", args[0], args[1:])
        raise UserError(f"{script} {' '.join(args[:2])}: give the training script after python")
    for name, spec in _table().items():
        if prog in spec.get("program", []):
            return _parse(name, spec, args)
    return None


def _parse(name: str, spec: dict, args: list[str]) -> Wrapped:
    sub = spec.get("subcommand") or []
    for word in [sub] if isinstance(sub, str) else sub:
        if args[:1] == [word]:
            args = args[1:]
        elif isinstance(sub, str):
            raise UserError(f"{name} {args[0] if args else ''}: only `{name} {sub} SCRIPT` is a launch "
                            "opscope can scan")
    processes = set(spec.get("processes") or [])
    precision = spec.get("precision") or {}
    env_flags = dict(spec.get("env_flags") or {})
    switches = set(spec.get("switches") or [])
    world, mixed, dtype = 1, None, None
    env = {str(k): str(v) for k, v in (spec.get("set_env") or {}).items()}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            break
        flag, eq, value = arg.partition("=")
        if flag in switches:
            i += 1
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        i += 1
        if flag in processes:
            try:
                world = max(1, int(value))
            except ValueError:
                world = 1   # "gpu"/"auto": every GPU of the machine; opscope scans one
        if flag in (precision.get("flags") or []):
            mixed = value
            dtype = (precision.get("dtypes") or {}).get(value)
            env[precision["env"]] = value
        if flag in env_flags:
            env[env_flags[flag]] = value
    if i >= len(args):
        raise UserError(f"{name}: no training script in the command line after the launcher's options")
    script, rest = args[i], args[i + 1:]
    if not os.path.exists(script):
        raise UserError(f"script not found: {script} (the script the {name} command runs)")
    return Wrapped(name, script, rest, world, env, mixed, dtype)
