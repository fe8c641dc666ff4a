"""How the installed PyTorch implements each ATen overload (its ``native_functions.yaml``).

The dispatch keys say whether an operator without an NPU kernel still runs on the NPU:
``CompositeImplicitAutograd`` (or no dispatch section at all) and
``CompositeExplicitAutograd[NonFunctional]`` kernels are written in terms of other
operators; ``structured_delegate: X.out`` means the functional/inplace forms are generated
around ``X.out``; backend keys only (``CPU``, ``CUDA``) mean a backend must provide a kernel.
The file ships inside torch (``torchgen/packaged``), so this is no extra dependency.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
COMPOSITE_IMPLICIT = "CompositeImplicitAutograd"
COMPOSITE_EXPLICIT = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


@dataclass(frozen=True)
class OverloadInfo:
    key: str                        # "gelu.out" / "gelu"
    dispatch: tuple                 # dispatch keys, e.g. ("CPU", "CUDA", "MPS")
    structured_delegate: str | None
    is_out: bool                    # writes into an out= argument
    autogen: tuple = ()

    @property
    def composite_implicit(self) -> bool:
        return not self.dispatch or COMPOSITE_IMPLICIT in self.dispatch

    @property
    def composite_explicit(self) -> bool:
        return any(k in self.dispatch for k in COMPOSITE_EXPLICIT)

    @property
    def has_cpu_kernel(self) -> bool:
        return "CPU" in self.dispatch


@dataclass
class TorchSchema:
    torch_version: str
    overloads: dict                 # "gelu.out" -> OverloadInfo
    families: dict                  # "gelu" -> ["", "out"]
    source: str

    def get(self, base: str, overload: str) -> OverloadInfo | None:
        return self.overloads.get(f"{base}.{overload}" if overload else base)


def _yaml_path() -> Path | None:
    try:
        import torchgen
    except ImportError:
        return None
    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    return path if path.is_file() else None


def _torch_version() -> str:
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:
        return "unknown"


@lru_cache(maxsize=1)
def load_torch_schema() -> TorchSchema:
    path = _yaml_path()
    if path is None:
        return TorchSchema(_torch_version(), {}, {}, "torch native_functions.yaml not found")
    overloads, families = {}, {}
    for entry in yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER) or []:
        func = entry.get("func", "")
        key = func.split("(", 1)[0].strip()
        args = func.split("(", 1)[1].rsplit("->", 1)[0] if "(" in func else ""
        base, _, overload = key.partition(".")
        keys: list[str] = []
        for spec in (entry.get("dispatch") or {}):
            keys.extend(k.strip() for k in str(spec).split(","))
        autogen = tuple(a.strip() for a in str(entry.get("autogen") or "").split(",") if a.strip())
        kwargs = args.split("*", 1)[1] if "*" in args else ""
        is_out = "!)" in kwargs and not base.endswith("_")
        overloads[key] = OverloadInfo(key, tuple(keys), entry.get("structured_delegate"), is_out, autogen)
        families.setdefault(base, []).append(overload)
    return TorchSchema(_torch_version(), overloads, families, f"torch {_torch_version()} native_functions.yaml")
