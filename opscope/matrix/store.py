"""Load the committed support matrix (``support_matrix/``) into lookup tables.

One ``Release`` per exact torch_npu release (2.8.0, 2.8.0.post2 ... 2.8.0.post5: ``exact``)
and, per release line, its newest release (``releases``).  Lines with a wheel on PyPI come from that
wheel's registration yaml; lines that only op-plugin's yaml knows (2.2, newer lines
before their release) are built from op-plugin's version ranges plus the hand-registered
core ops (view, copy_, empty...) of the nearest wheel, and say so in ``note``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from opscope.errors import UserError
from opscope.matrix.build import line_key, read_line_releases, release_line
from opscope.matrix.versions import version_key
from opscope.resources import support_matrix_dir

_ATEN_SECTIONS = ("official", "autograd", "symint", "quant")


@dataclass
class Release:
    """Registrations of one torch_npu release line."""
    line: str                      # "2.14"
    version: str                   # "2.14.0" (the wheel), or "2.15" for op-plugin-only lines
    source: str                    # which list: "torch_npu 2.14.0 wheel" / "op-plugin yaml"
    aten: dict = field(default_factory=dict)     # "gelu.out" -> "codegen:supported"
    custom: dict = field(default_factory=dict)   # "npu_gelu" -> origin
    contrib: set = field(default_factory=set)    # torch_npu.contrib public names
    note: str | None = None
    from_wheel: bool = True
    torch: str | None = None       # the torch release the wheel requires (its METADATA), if pinned

    def families(self) -> dict[str, list[str]]:
        """base name -> registered overloads ('' = default overload)."""
        return _families(tuple(sorted(self.aten)))


@lru_cache(maxsize=64)
def _families(keys: tuple) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in keys:
        base, _, overload = key.partition(".")
        out.setdefault(base, []).append(overload)
    return out


@dataclass
class PluginEntry:
    section: str
    name: str
    acl_op: str | None = None
    op_api: str | None = None
    inherit: str | None = None


@dataclass
class SupportMatrix:
    releases: dict                 # line -> Release, ordered oldest..newest
    plugin: dict                   # overload -> PluginEntry
    plugin_lines: list
    dtype_notes: dict              # opinfo -> {dtype: {test: scope}}
    plugin_commit: str | None = None
    exact: dict = field(default_factory=dict)   # "2.8.0.post2" -> Release, every release with a wheel

    @property
    def versions(self) -> list[str]:
        """Every exact torch_npu release in the matrix, oldest first."""
        return sorted(self.exact, key=version_key)

    def line_versions(self, line: str) -> list[str]:
        return [v for v in self.versions if release_line(v) == line]

    @property
    def lines(self) -> list[str]:
        return list(self.releases)

    @property
    def default_line(self) -> str:
        """Newest line built from a real wheel (op-plugin-only lines are previews)."""
        return [line for line, rel in self.releases.items() if rel.from_wheel][-1]

    def release(self, line: str) -> Release:
        return self.releases[line]


@lru_cache(maxsize=1024)
def _lines_in(spec: str | None, all_lines: tuple[str, ...]) -> frozenset[str]:
    """The release lines a version-range spec (``v2.1-v2.6,v2.8``) names; thousands of entries share a
    few dozen specs, so each is worked out once."""
    if not spec or spec == "-":
        return frozenset()
    chosen: set[str] = set()
    for part in spec.split(","):
        if "-" in part:
            first, last = (line_key(p) for p in part.split("-"))
            chosen.update(v for v in all_lines if first <= line_key(v) <= last)
        else:
            chosen.add(part)
    return frozenset(chosen)


def plugin_lines_of(entry: PluginEntry, all_lines: list[str]) -> frozenset[str]:
    lines = tuple(all_lines)
    return _lines_in(entry.acl_op, lines) | _lines_in(entry.op_api, lines)


def _read_line(path: Path) -> list[Release]:
    """Every release of one line: its newest (``torch_npu-<line>.txt``) and the others (``releases-<line>.txt``)."""
    line = path.stem.split("-", 1)[1]
    found = read_line_releases(path.parent, line)
    if None in found:
        raise UserError(f"{path} has no 'version' line; regenerate it with `opscope matrix build`")
    return [_release(version, torch, lines) for version, (torch, lines) in found.items()]


def _release(version: str, torch: str | None, lines: list[str]) -> Release:
    return _ListedRelease(version, torch, lines)


class _ListedRelease(Release):
    """A wheel's release whose operator tables are parsed when first read: the matrix lists ~50
    releases and a scan judges against one (parsing them all cost every scan ~30 ms, twice).
    Built only by ``_release``; not for ``dataclasses.replace``."""

    def __init__(self, version: str, torch: str | None, lines: list[str]):
        super().__init__(line=release_line(version), version=version, source=f"torch_npu {version} wheel",
                         torch=torch)
        del self.aten, self.custom, self.contrib
        self._lines = lines

    def __getattr__(self, name: str):
        if name in ("aten", "custom", "contrib") and "_lines" in self.__dict__:
            self.aten, self.custom, self.contrib = _tables(self.__dict__["_lines"])
            del self.__dict__["_lines"]   # only once parsed: a bad line fails every read alike
            return getattr(self, name)
        raise AttributeError(name)


def _tables(lines: list[str]) -> tuple[dict, dict, set]:
    """(aten, custom, contrib) of a release's ``aten NAME ORIGIN`` / ``custom ...`` / ``contrib NAME`` lines."""
    aten, custom, contrib = {}, {}, set()
    for raw in lines:
        parts = raw.split()
        if parts[0] == "aten":
            aten[parts[1]] = parts[2]
        elif parts[0] == "custom":
            custom[parts[1]] = parts[2]
        elif parts[0] == "contrib":
            contrib.add(parts[1])
    return aten, custom, contrib


def _read_plugin(path: Path):
    entries, lines, commit = {}, [], None
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("# source commit:"):
            commit = raw.split(":", 1)[1].strip()
        if not raw or raw.startswith("#"):
            continue
        parts = raw.split()
        if parts[0] == "lines":
            lines = parts[1:]
            continue
        fields = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
        entries[parts[1]] = PluginEntry(parts[0], parts[1], fields.get("acl_op"), fields.get("op_api"),
                                        fields.get("inherit"))
    return entries, lines, commit


def _read_dtype_notes(path: Path) -> dict:
    notes: dict = {}
    if not path.is_file():
        return notes
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw or raw.startswith("#"):
            continue
        opinfo, dtype, test, scope = raw.split()
        notes.setdefault(opinfo, {}).setdefault(dtype, {})[test] = scope
    return notes


def _plugin_only_release(line: str, plugin: dict, all_lines: list[str], nearest: Release) -> Release:
    aten: dict = {}
    custom: dict = {}
    for name, entry in plugin.items():
        if line in plugin_lines_of(entry, all_lines):
            (custom if entry.section == "custom" else aten)[name] = f"op-plugin:{entry.section}"
    for name, origin in nearest.aten.items():  # torch_npu's own registrations are not op-plugin's
        if name not in plugin and name not in aten:
            aten[name] = f"{origin}@{nearest.version}"
    return Release(line=line, version=line, source="op-plugin yaml", aten=aten, custom=custom,
                   contrib=set(nearest.contrib), from_wheel=False,
                   note=f"no torch_npu {line} wheel: op-plugin's version ranges, plus the ops torch_npu registers "
                        f"itself (not op-plugin's) and the contrib names of torch_npu {nearest.version}")


def load_matrix(directory: Path | None = None) -> SupportMatrix:
    return _load(str(directory or support_matrix_dir()))


@lru_cache(maxsize=4)
def _load(directory: str) -> SupportMatrix:
    root = Path(directory)
    files = sorted((root / "versions").glob("torch_npu-*.txt"))
    if not files:
        raise UserError(f"no torch_npu support lists in {root / 'versions'}; run `opscope matrix build`")
    exact = {r.version: r for path in files for r in _read_line(path)}
    wheel_releases = {}
    for version in sorted(exact, key=version_key):  # a line's newest release stands for the line
        wheel_releases[exact[version].line] = exact[version]
    plugin_file = root / "versions" / "op_plugin.txt"
    plugin, plugin_lines, commit = _read_plugin(plugin_file) if plugin_file.is_file() else ({}, [], None)
    releases = dict(wheel_releases)
    for line in plugin_lines:
        if line not in releases:
            nearest = min(wheel_releases.values(),
                          key=lambda r: (abs(line_key(r.line)[1] - line_key(line)[1]), -line_key(r.line)[1]))
            releases[line] = _plugin_only_release(line, plugin, plugin_lines, nearest)
    ordered = dict(sorted(releases.items(), key=lambda kv: line_key(kv[0])))
    return SupportMatrix(releases=ordered, plugin=plugin, plugin_lines=plugin_lines,
                         dtype_notes=_read_dtype_notes(root / "versions" / "dtype_notes.txt"), plugin_commit=commit,
                         exact=exact)


def resolve_release(matrix: SupportMatrix, target: str | None) -> Release:
    """The exact torch_npu release a target names.

    '2.8.0' is torch_npu 2.8.0 (not 2.8.0.post5), 'torch_npu==2.8.0.post2' that post-release,
    a bare line '2.8' its newest release, None the newest line's newest release; a line with
    no wheel (2.2, 2.15) is op-plugin's view of that line.  Anything else is an error naming
    the releases the matrix knows.
    """
    if target is None or not str(target).strip():
        return matrix.release(matrix.default_line)
    text = str(target).strip()
    if "==" in text:
        package, _, text = text.partition("==")
        if package.strip().replace("-", "_") != "torch_npu":
            raise UserError(f"--target must name torch_npu (e.g. torch_npu==2.8.0), not {package.strip()}")
    text = text.strip().lstrip("v")
    if text in matrix.exact:
        return matrix.exact[text]
    known = ", ".join(matrix.lines)
    try:
        line = release_line(text)
        version_key(text)
    except UserError:
        raise UserError(f"unknown torch_npu version {target!r}: the support matrix knows {known} "
                        "(`opscope matrix versions` lists every release)") from None
    if line not in matrix.releases:
        raise UserError(f"unknown torch_npu version {target!r}: the support matrix knows {known} "
                        "(add one with `opscope matrix build --version X`)")
    release = matrix.release(line)
    if text == line or not release.from_wheel:
        return release
    raise UserError(f"unknown torch_npu release {target!r}: line {line} has "
                    f"{', '.join(matrix.line_versions(line))} (give one of them, or {line} for the newest; "
                    "add a release with `opscope matrix build --version X`)")


def resolve_line(matrix: SupportMatrix, target: str | None) -> str:
    """The release line of ``resolve_release``."""
    return resolve_release(matrix, target).line
