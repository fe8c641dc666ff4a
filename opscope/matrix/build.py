"""Regenerate ``support_matrix/`` from the real torch_npu sources.

Nothing in the matrix is typed by hand: every fact comes from

* a torch_npu wheel (``torch_npu/csrc/aten/npu_native_functions.yaml`` - hand-registered
  ops - and ``npu_native_functions_by_codegen.yaml`` - the op-plugin ops compiled into
  that wheel - plus the public names of ``torch_npu.contrib``, and the torch release it
  requires), per exact release: the newest release of a line in full in
  ``versions/torch_npu-<line>.txt``, every other release of that line (2.8.0, 2.8.0.post2...)
  as its differences from that one in ``versions/releases-<line>.txt``;
* the ``native_functions.yaml`` (``torchgen/packaged``) of each torch release a torch_npu
  release was built for: ``versions/torch_schema.txt`` (the newest torch in full, older ones
  as differences);
* op-plugin's ``op_plugin_functions.yaml`` (every overload with the torch_npu lines it is
  implemented for, ``structured_inherit`` links): ``versions/op_plugin.txt``; it also covers lines
  that have no wheel on PyPI (2.2, and newer lines before their release);
* op-plugin's ``unsupported_ops_info`` files (upstream OpInfo tests that fail on the NPU,
  per dtype): ``versions/dtype_notes.txt``.

Everything generated lives in ``versions/`` (shipped with the package as data).

The output is sorted line-based text so that a rebuild from the same sources is byte for
byte identical and a new release shows up as a readable diff.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

from opscope.errors import UserError
from opscope.matrix.versions import version_key

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NATIVE_YAML = "torch_npu/csrc/aten/npu_native_functions.yaml"
CODEGEN_YAML = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
CONTRIB_INIT = "torch_npu/contrib/__init__.py"
# yaml section -> kind of name in the matrix ("aten": an ATen overload the NPU registers)
_SECTION_KIND = {"supported": "aten", "symint": "aten", "autograd": "aten", "quant": "aten",
                 "tocpu": "aten", "custom": "custom"}
_WHEEL_VERSION = re.compile(r"torch_npu-([0-9][^-]*)-")


def release_line(version: str) -> str:
    """'2.8.0.post5' -> '2.8' (the torch_npu/op-plugin release line)."""
    m = re.match(r"v?(\d+)\.(\d+)", version.strip())
    if not m:
        raise UserError(f"not a torch_npu version: {version!r} (expected e.g. 2.8.0)")
    return f"{m.group(1)}.{m.group(2)}"


def line_key(line: str) -> tuple[int, int]:
    major, minor = line.split(".")[:2]
    return int(major), int(minor)


def _entry_name(entry) -> str | None:
    """'gelu.out' from either a bare 'gelu.out' or {func: 'gelu.out(Tensor self, ...) -> ...'}."""
    text = entry.get("func") if isinstance(entry, dict) else entry
    if not isinstance(text, str):
        return None
    return text.split("(", 1)[0].strip() or None


def _yaml_facts(text: str, origin: str) -> dict[tuple[str, str], set[str]]:
    facts: dict[tuple[str, str], set[str]] = {}
    data = yaml.load(text, Loader=_LOADER) or {}
    for section, kind in _SECTION_KIND.items():
        for entry in data.get(section) or []:
            name = _entry_name(entry)
            if name:
                facts.setdefault((kind, name), set()).add(f"{origin}:{section}")
    return facts


def _contrib_names(source: str) -> set[str]:
    """Public names of torch_npu.contrib: what its __init__ imports and lists in __all__."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names if not a.name.startswith("_"))
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                names.update(e.value for e in node.value.elts  # type: ignore[misc]  # __all__ holds strings
                             if isinstance(e, ast.Constant))
    return names


def wheel_version(path: Path) -> str:
    m = _WHEEL_VERSION.match(Path(path).name)
    if not m:
        raise UserError(f"{path} is not a torch_npu wheel (expected torch_npu-<version>-...whl)")
    return m.group(1)


_TORCH_REQ = re.compile(r"^Requires-Dist:\s*torch\s*\(?\s*==\s*([0-9][0-9.]*[0-9])", re.M)


def wheel_torch(path: Path) -> str | None:
    """The torch release a torch_npu wheel requires ('torch==2.8.0+cpu' -> '2.8.0'), None if unpinned."""
    with zipfile.ZipFile(path) as zf:
        meta = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        m = _TORCH_REQ.search(zf.read(meta[0]).decode("utf-8", "replace")) if meta else None
    return m.group(1) if m else None


def wheel_facts(path: Path) -> tuple[str, list[str]]:
    """(version, fact lines) of one torch_npu wheel."""
    version = wheel_version(path)
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if CODEGEN_YAML not in names:
                raise UserError(f"{path} has no {CODEGEN_YAML}: not a torch_npu wheel this builder understands")
            facts = _yaml_facts(zf.read(CODEGEN_YAML).decode(), "codegen")
            if NATIVE_YAML in names:
                for key, origins in _yaml_facts(zf.read(NATIVE_YAML).decode(), "native").items():
                    facts.setdefault(key, set()).update(origins)
            contrib = _contrib_names(zf.read(CONTRIB_INIT).decode()) if CONTRIB_INIT in names else set()
    except zipfile.BadZipFile:
        raise UserError(f"{path} is not a readable wheel (zip) file; download it again") from None
    lines = [f"{kind} {name} {','.join(sorted(origins))}" for (kind, name), origins in facts.items()]
    lines += [f"contrib {name} contrib" for name in contrib]
    return version, sorted(lines)


def render_version_file(version: str, lines: list[str], torch: str | None = None) -> str:
    head = [f"# torch_npu {version}: operators registered for the NPU (release line {release_line(version)})",
            "# from the wheel's torch_npu/csrc/aten/npu_native_functions*.yaml and torch_npu/contrib/__init__.py",
            f"# regenerate: opscope matrix build --version {version}   (do not edit by hand)",
            "# kind name origin:section[,...]",
            f"version {version}"] + ([f"torch {torch}"] if torch else [])
    return "\n".join(head + lines) + "\n"


def render_release_diffs(line: str, base: str, base_lines: list[str], others: dict) -> str:
    """Every other release of a line as differences from its newest (``base``) release.

    ``others``: version -> (torch, fact lines).  '+ kind name origins' is a registration of that
    release that the base lacks or records differently; '- kind name' one the base has and it lacks.
    """
    head = [f"# torch_npu {line} releases other than {base}: each one's differences from torch_npu-{line}.txt",
            "# regenerate: opscope matrix build --version V   (do not edit by hand)",
            "# release VERSION [torch T], then '+ kind name origin:section[,...]' (registered differently or only"
            " here) and '- kind name' (registered in the base release, not here)"]
    base_map = {" ".join(l.split()[:2]): l for l in base_lines}
    body = []
    for version in sorted(others, key=version_key):
        torch, lines = others[version]
        mine = {" ".join(l.split()[:2]): l for l in lines}
        body.append(f"release {version}" + (f" torch {torch}" if torch else ""))
        changes = [f"+ {l}" for k, l in mine.items() if base_map.get(k) != l]
        changes += [f"- {k}" for k in base_map if k not in mine]
        body += sorted(changes, key=lambda c: (c[2:].split()[:2], c[0]))
    return "\n".join(head + body) + "\n"


def read_line_releases(versions_dir: Path, line: str) -> dict:
    """version -> (torch, fact lines) of every release of a line in the committed files."""
    base_file = Path(versions_dir) / f"torch_npu-{line}.txt"
    if not base_file.is_file():
        return {}
    version, torch, base_lines = None, None, []
    for raw in base_file.read_text(encoding="utf-8").splitlines():
        if not raw or raw.startswith("#"):
            continue
        if raw.startswith("version "):
            version = raw.split()[1]
        elif raw.startswith("torch "):
            torch = raw.split()[1]
        else:
            base_lines.append(raw)
    out: dict[str | None, tuple] = {version: (torch, sorted(base_lines))}
    diff_file = Path(versions_dir) / f"releases-{line}.txt"
    if diff_file.is_file():
        base_map = {" ".join(l.split()[:2]): l for l in base_lines}
        current = None
        for raw in diff_file.read_text(encoding="utf-8").splitlines():
            if not raw or raw.startswith("#"):
                continue
            parts = raw.split()
            if parts[0] == "release":
                current = dict(base_map)
                out[parts[1]] = (parts[3] if len(parts) > 3 else None, current)
            elif parts[0] == "+":
                assert current is not None   # a release line opens every section of changes
                current[" ".join(parts[1:3])] = " ".join(parts[1:])
            elif parts[0] == "-":
                assert current is not None
                current.pop(" ".join(parts[1:3]), None)
        out = {v: (t, sorted(m.values()) if isinstance(m, dict) else m) for v, (t, m) in out.items()}
    return out


def write_line(out_dir: Path, line: str, releases: dict) -> list[Path]:
    """(Re)write the files of one release line from version -> (torch, fact lines)."""
    versions_dir = Path(out_dir) / "versions"
    versions_dir.mkdir(parents=True, exist_ok=True)
    base = max(releases, key=version_key)
    torch, base_lines = releases[base]
    written = [_write(versions_dir / f"torch_npu-{line}.txt", render_version_file(base, base_lines, torch))]
    others = {v: r for v, r in releases.items() if v != base}
    diff_file = versions_dir / f"releases-{line}.txt"
    if others:
        written.append(_write(diff_file, render_release_diffs(line, base, base_lines, others)))
    elif diff_file.is_file():
        diff_file.unlink()
    return written


# ---- op-plugin yaml ---------------------------------------------------------------------

def _expand_spec(spec, all_lines: list[str]) -> list[str]:
    """op-plugin version spec -> release lines ('all_version', '[v2.1, newest]', 'v2.1, v2.2')."""
    if spec is None:
        return []
    if isinstance(spec, str):
        spec = spec.strip()
        if spec == "all_version":
            return list(all_lines)
        return [release_line(v) for v in spec.split(",") if v.strip()]
    items = [str(v).strip() for v in spec]
    if len(items) == 2:  # [first, last|newest] is a range
        first = line_key(release_line(items[0]))
        last = line_key(all_lines[-1]) if items[1] == "newest" else line_key(release_line(items[1]))
        return [v for v in all_lines if first <= line_key(v) <= last]
    return [release_line(v) for v in items]


def compress_lines(lines: list[str], all_lines: list[str]) -> str:
    """['2.1','2.2','2.3','2.5'] -> '2.1-2.3,2.5' (runs over the known release lines)."""
    chosen = set(lines)
    runs, run = [], []
    for v in all_lines:
        if v in chosen:
            run.append(v)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return ",".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "-"


def op_plugin_facts(text: str, commit: str | None = None) -> str:
    data = yaml.load(text, Loader=_LOADER) or {}
    all_lines = [release_line(v) for v in data.get("all_version") or []]
    if not all_lines:
        raise UserError("op_plugin_functions.yaml has no all_version list; is this the op-plugin yaml?")
    rows = set()
    for section in ("official", "autograd", "custom", "symint", "quant"):
        for entry in data.get(section) or []:
            name = _entry_name(entry)
            if not name:
                continue
            fields = []
            for impl in ("acl_op", "op_api"):
                if impl in entry:
                    fields.append(f"{impl}={compress_lines(_expand_spec(entry[impl], all_lines), all_lines)}")
            inherit = (entry.get("gen_opapi") or {}).get("structured_inherit") if isinstance(
                entry.get("gen_opapi"), dict) else None
            if inherit:
                fields.append(f"inherit={inherit}")
            rows.add(" ".join([section, name] + (fields or ["none"])))
    head = ["# op-plugin op_plugin_functions.yaml: overloads and the torch_npu release lines implementing them",
            f"# source commit: {commit or 'unknown'}",
            "# regenerate: opscope matrix build --op-plugin DIR   (do not edit by hand)",
            "# section name [acl_op=LINES] [op_api=LINES] [inherit=OVERLOAD]",
            "lines " + " ".join(all_lines)]
    return "\n".join(head + sorted(rows)) + "\n"


def dtype_notes(base_text: str, per_version: dict[str, str]) -> str:
    """Upstream OpInfo tests that fail on the NPU: 'opinfo dtype tests lines'."""
    notes: dict[tuple[str, str], dict[str, set[str]]] = {}

    def add(text: str, where: str) -> None:
        for opinfo, tests in (yaml.load(text, Loader=_LOADER) or {}).items():
            for test, dtypes in (tests or {}).items():
                for dtype in dtypes or []:
                    notes.setdefault((str(opinfo).replace(" ", "_"), str(dtype).replace(" ", "_") or "-"), {}).setdefault(str(test), set()).add(where)

    add(base_text, "all")
    for line, text in sorted(per_version.items(), key=lambda kv: line_key(kv[0])):
        add(text, line)
    rows = []
    for (opinfo, dtype), tests in sorted(notes.items()):
        for test, where in sorted(tests.items()):
            scope = "all" if "all" in where else ",".join(sorted(where, key=line_key))
            rows.append(f"{opinfo} {dtype} {test} {scope}")
    head = ["# op-plugin unsupported_ops_info*.yaml: upstream OpInfo tests that fail on the NPU",
            "# regenerate: opscope matrix build --op-plugin DIR   (do not edit by hand)",
            "# opinfo dtype test lines(all|comma-separated release lines)"]
    return "\n".join(head + rows) + "\n"


def build_op_plugin(op_plugin_dir: Path, out_dir: Path) -> list[Path]:
    op_plugin_dir = Path(op_plugin_dir)
    main = op_plugin_dir / "op_plugin_functions.yaml"
    if not main.is_file():
        raise UserError(f"{main} not found: give --op-plugin the folder holding op_plugin_functions.yaml")
    commit_file = op_plugin_dir / "SOURCE_COMMIT"
    commit = commit_file.read_text().strip() if commit_file.is_file() else None
    (out_dir / "versions").mkdir(parents=True, exist_ok=True)
    written = [_write(out_dir / "versions" / "op_plugin.txt", op_plugin_facts(main.read_text(encoding="utf-8"), commit))]
    base = op_plugin_dir / "unsupported_ops_info_base.yaml"
    if base.is_file():
        per_version = {}
        for path in sorted(op_plugin_dir.glob("**/test_v*_ops.unsupported_ops_info.yaml")):
            m = re.match(r"test_v(\d+)r(\d+)_ops", path.name)
            if m:
                per_version[f"{m.group(1)}.{m.group(2)}"] = path.read_text(encoding="utf-8")
        written.append(_write(out_dir / "versions" / "dtype_notes.txt", dtype_notes(base.read_text(encoding="utf-8"), per_version)))
    return written


def build_wheels(wheels: list, out_dir: Path) -> tuple[list[Path], set]:
    """Add (or replace) the facts of these wheels' releases in their lines' files.

    Returns the files written and the torch releases those torch_npu releases require.
    """
    by_line: dict = {}
    torches = set()
    for wheel in wheels:
        version, lines = wheel_facts(Path(wheel))
        torch = wheel_torch(Path(wheel))
        if torch:
            torches.add(torch)
        by_line.setdefault(release_line(version), {})[version] = (torch, lines)
    written = []
    for line, new in sorted(by_line.items(), key=lambda kv: line_key(kv[0])):
        releases = read_line_releases(Path(out_dir) / "versions", line)
        releases.update(new)
        written += write_line(out_dir, line, releases)
    return written, torches


def download_wheel(version: str, dest: Path) -> Path:
    """Fetch one torch_npu wheel with pip (no dependencies)."""
    spec = version if version.startswith("torch_npu") else f"torch_npu=={version}"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", str(dest)],
                          capture_output=True, text=True)
    wanted = spec.split("==", 1)[-1]
    wheels = [p for p in Path(dest).glob("torch_npu-*.whl") if wheel_version(p) == wanted]
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise UserError(f"pip could not download {spec}: {tail[0]} (pass a wheel file with --wheel instead)")
    return wheels[0]


def committed_versions(out_dir: Path) -> list[str]:
    """Exact wheel versions of every release in the committed files (for --refresh)."""
    versions = []
    for path in sorted((Path(out_dir) / "versions").glob("torch_npu-*.txt")):
        line = path.stem.split("-", 1)[1]
        versions += list(read_line_releases(path.parent, line))
    return sorted(versions, key=version_key)


def build(out_dir: Path, wheels=(), versions=(), op_plugin: Path | None = None,
          download_dir: Path | None = None, torch_facts: bool = True, torch_wheels=(),
          refresh_torch: bool = False, progress=None) -> list[Path]:
    """Regenerate matrix files from wheel files, versions fetched with pip, and/or the op-plugin folder.

    ``progress(done, total, what)`` is called before each download and each build step."""
    out_dir = Path(out_dir)
    total = len(versions) + 2 + (1 if op_plugin is not None else 0)
    done = 0

    def step(what: str) -> None:
        if progress is not None:
            progress(done, total, what)

    with tempfile.TemporaryDirectory(prefix="opscope-wheels-") as tmp:
        where = Path(download_dir or tmp)
        files = [Path(w) for w in wheels]
        for version in versions:
            cached = [p for p in where.glob("torch_npu-*.whl") if wheel_version(p) == version]
            step(f"torch_npu {version}: " + ("cached wheel" if cached else "pip download"))
            files.append(cached[0] if cached else download_wheel(version, where))
            done += 1
        step(f"reading {len(files)} wheel(s)")
        written, torches = build_wheels(files, out_dir) if files else ([], set())
        done += 1
        step("torch facts")
        if (torches and torch_facts) or torch_wheels:
            from opscope.matrix.torch_schema import build_torch_schema
            written += build_torch_schema(out_dir, torches if torch_facts else (), where, torch_wheels=torch_wheels,
                                          refresh=refresh_torch)
        done += 1
    if op_plugin is not None:
        step("op-plugin yaml")
        written += build_op_plugin(Path(op_plugin), out_dir)
        done += 1
    if progress is not None:
        progress(done, total, "done")
    return written


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", newline="\n")
    return path
