"""How the installed PyTorch implements each ATen overload (its ``native_functions.yaml``).

The dispatch keys say whether an operator without an NPU kernel still runs on the NPU:
``CompositeImplicitAutograd`` (or no dispatch section at all) and
``CompositeExplicitAutograd[NonFunctional]`` kernels are written in terms of other
operators; ``structured_delegate: X.out`` means the functional/inplace forms are generated
around ``X.out``; backend keys only (``CPU``, ``CUDA``) mean a backend must provide a kernel.
The file ships inside torch (``torchgen/packaged``), so this is no extra dependency.

Each torch_npu release is built for one torch release (its wheel pins ``torch==X``), and
what is composite or structured can change between torch releases, so verdicts use the
facts of *that* torch release, extracted by ``opscope matrix build`` from its wheel into
``support_matrix/versions/torch_schema.txt`` (newest torch in full, older ones as
differences).  Only when the matrix has no facts for it does a judgement fall back to the
installed torch's yaml, and the evidence says so.
"""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import cache, lru_cache
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
    """The installed torch's facts."""
    path = _yaml_path()
    if path is None:
        return TorchSchema(_torch_version(), {}, {}, "torch native_functions.yaml not found")
    overloads, families = _parse_yaml(path.read_text(encoding="utf-8"))
    return TorchSchema(_torch_version(), overloads, families, f"torch {_torch_version()} native_functions.yaml")


def _parse_yaml(text: str) -> tuple[dict, dict]:
    overloads: dict[str, OverloadInfo] = {}
    families: dict[str, list[str]] = {}
    for entry in yaml.load(text, Loader=_LOADER) or []:
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
    return overloads, families


# ---- committed facts per torch release ------------------------------------------------------

FACTS_FILE = "torch_schema.txt"
YAML_IN_WHEEL = "torchgen/packaged/ATen/native/native_functions.yaml"


# The dispatch keys a judgement reads (composite or not, a CPU kernel to fall back to), and CUDA
# to tell a GPU-only op; other backends' keys (MPS, XPU, MTIA, NestedTensor*...) change between
# torch releases without changing anything for the NPU, so the committed facts leave them out
# (an overload with none of these keeps all its keys).
KEPT_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
             "CPU", "CUDA", "SparseCPU", "SparseCsrCPU", "QuantizedCPU")


def fact_line(info: OverloadInfo) -> str:
    """'op gelu.out d=CPU,CUDA out' - what the judge needs of one overload."""
    fields = [f"op {info.key}"]
    keys = [k for k in info.dispatch if k in KEPT_KEYS] or list(info.dispatch)
    if keys:
        fields.append("d=" + ",".join(keys))
    if info.structured_delegate:
        fields.append(f"delegate={info.structured_delegate}")
    if info.is_out:
        fields.append("out")
    return " ".join(fields)


def _info_from_line(parts: list[str]) -> OverloadInfo:
    dispatch: tuple[str, ...] = ()
    key, delegate, is_out = parts[0], None, False
    for field in parts[1:]:
        if field.startswith("d="):
            dispatch = tuple(field[2:].split(","))
        elif field.startswith("delegate="):
            delegate = field.split("=", 1)[1]
        elif field == "out":
            is_out = True
    return OverloadInfo(key, dispatch, delegate, is_out)


def yaml_facts(text: str) -> list[str]:
    overloads, _ = _parse_yaml(text)
    return sorted(fact_line(info) for info in overloads.values())


def read_facts(path: Path) -> dict:
    """torch version -> sorted fact lines, from the committed file."""
    if not Path(path).is_file():
        return {}
    out: dict = {}
    base_version, base, current = None, {}, None
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        if not raw or raw.startswith("#"):
            continue
        parts = raw.split()
        if parts[0] == "torch":
            base_version = parts[1]
        elif parts[0] == "op":
            base[parts[1]] = raw
        elif parts[0] == "release":  # differences from the previous (next newer) section
            current = dict(current if current is not None else base)
            out[parts[1]] = current
        elif parts[0] == "+":
            assert current is not None   # a release line opens every section of changes
            current[parts[2]] = " ".join(parts[1:])
        elif parts[0] == "-":
            assert current is not None
            current.pop(parts[2], None)
    if base_version:
        out[base_version] = base
    return {v: sorted(m.values()) for v, m in out.items()}


def render_facts(facts: dict) -> str:
    from opscope.matrix.versions import version_key
    order = sorted(facts, key=version_key, reverse=True)
    base_version = order[0]
    base = {l.split()[1]: l for l in facts[base_version]}
    head = ["# torch native_functions.yaml facts (torchgen/packaged) of each torch release a torch_npu release is",
            "# built for: the newest in full, each older one as its differences from the next newer one "
            "('+ op ...' differs or only there, '- op NAME' absent there)",
            "# dispatch keys kept: " + ",".join(KEPT_KEYS) + " (all keys of an overload with none of them)",
            "# regenerate: opscope matrix build --version V   (do not edit by hand)",
            "# op OVERLOAD [d=DISPATCH_KEYS] [delegate=STRUCTURED_DELEGATE] [out]   (no d=: CompositeImplicitAutograd)",
            f"torch {base_version}"]
    body = [base[k] for k in sorted(base)]
    newer = base
    for version in order[1:]:
        mine = {l.split()[1]: l for l in facts[version]}
        body.append(f"release {version}")
        changes = [f"+ {l}" for k, l in mine.items() if newer.get(k) != l]
        changes += [f"- op {k}" for k in newer if k not in mine]
        body += sorted(changes, key=lambda c: (c.split()[2], c[0]))
        newer = mine
    return "\n".join(head + body) + "\n"


def torch_wheel_version(path: Path) -> str:
    m = re.match(r"torch-([0-9][^-]*)-", Path(path).name)
    if not m:
        from opscope.errors import UserError
        raise UserError(f"{path} is not a torch wheel (expected torch-<version>-...whl)")
    return m.group(1).split("+", 1)[0]


def torch_wheel_facts(path: Path) -> list[str]:
    from opscope.errors import UserError
    try:
        with zipfile.ZipFile(path) as zf:
            if YAML_IN_WHEEL not in zf.namelist():
                raise UserError(f"{path} has no {YAML_IN_WHEEL}")
            return yaml_facts(zf.read(YAML_IN_WHEEL).decode("utf-8"))
    except zipfile.BadZipFile:
        raise UserError(f"{path} is not a readable wheel (zip) file; download it again") from None


def download_torch_wheel(version: str, dest: Path) -> Path:
    """Any one wheel of that torch release carries the yaml: the smallest (macOS arm64) is fetched."""
    from opscope.errors import UserError
    cached = [p for p in Path(dest).glob("torch-*.whl") if torch_wheel_version(p) == version]
    if cached:
        return cached[0]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:",
                           "--platform", "macosx_11_0_arm64", "--platform", "macosx_14_0_arm64", "--python-version", "3.11", f"torch=={version}",
                           "-d", str(dest)], capture_output=True, text=True)
    got = [p for p in Path(dest).glob("torch-*.whl") if torch_wheel_version(p) == version]
    if proc.returncode != 0 or not got:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise UserError(f"pip could not download torch=={version}: {tail[0]} (pass one with --torch-wheel)")
    return got[0]


def build_torch_schema(out_dir: Path, versions, download_dir: Path, torch_wheels=(), refresh: bool = False) -> list:
    """Add the facts of these torch releases (fetched unless already committed) to torch_schema.txt."""
    path = Path(out_dir) / "versions" / FACTS_FILE
    facts = read_facts(path)
    for wheel in torch_wheels:
        facts[torch_wheel_version(wheel)] = torch_wheel_facts(Path(wheel))
    for version in sorted(set(versions)):
        if version not in facts or refresh:
            facts[version] = torch_wheel_facts(download_torch_wheel(version, Path(download_dir)))
    if not facts:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_facts(facts), encoding="utf-8", newline="\n")
    return [path]


@cache
def _committed_facts(directory: str) -> dict:
    return read_facts(Path(directory) / "versions" / FACTS_FILE)


def schema_for(torch_version: str | None, directory: Path | None = None) -> TorchSchema | None:
    """The committed facts of one torch release, or None when the matrix has none."""
    if not torch_version:
        return None
    from opscope.resources import support_matrix_dir
    return _schema_from_facts(str(directory or support_matrix_dir()), torch_version)


@lru_cache(maxsize=32)
def _schema_from_facts(directory: str, torch_version: str) -> TorchSchema | None:
    lines = _committed_facts(directory).get(torch_version)
    if lines is None:
        return None
    overloads: dict[str, OverloadInfo] = {}
    families: dict[str, list[str]] = {}
    for raw in lines:
        info = _info_from_line(raw.split()[1:])
        overloads[info.key] = info
        base, _, overload = info.key.partition(".")
        families.setdefault(base, []).append(overload)
    return TorchSchema(torch_version, overloads, families, f"torch {torch_version} native_functions.yaml")
