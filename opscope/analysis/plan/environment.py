"""The scanned environment against a release plan: what must change, line by line, and what to install.

* Installed versions (``importlib.metadata``, in the Python running opscope: the scan's child runs the same
  interpreter) of torch and the libraries whose release follows torch or that need a minimum torch.
* The project's ``requirements*.txt`` and ``pyproject.toml`` (``[project] dependencies`` and optional
  dependencies) in the script's folder and its parents, up to the project root (a folder with ``.git``,
  ``pyproject.toml``, ``setup.py`` or ``setup.cfg``; at most six levels).  A file that cannot be read or
  parsed, and a line that is not a requirement, is skipped with a note: never a traceback.
* Each requirement of torch / torch_npu / torchvision / torchaudio that the planned release does not satisfy
  becomes a change (``requirements.txt:3 torch==2.5.1 -> torch==2.6.0 (...)``); so does an installed library
  whose own ``Requires-Dist`` on torch, or a known incompatibility of ``release_pairs.yaml``, excludes the
  planned torch.
* The install block for the Ascend machine: the CANN version, then pip lines.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from opscope.knowledge import load_optional

PACKAGES = ("torch", "torch-npu", "torchvision", "torchaudio", "transformers", "accelerate", "deepspeed",
            "lightning", "pytorch-lightning", "timm", "peft", "diffusers", "torchmetrics", "xformers", "triton",
            "bitsandbytes", "mmcv", "apex", "numpy")
ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
MAX_LEVELS = 6
MAX_FILE_BYTES = 1 << 20
# x86 wheels of torch without CUDA come from PyTorch's CPU index (Ascend/pytorch README.md, "Install PyTorch")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions(packages=PACKAGES) -> dict[str, str | None]:
    """name -> installed version (None: not installed) in this interpreter."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
        except Exception:   # a broken distribution's metadata: as if absent
            out[name] = None
    return out


def _packaging():
    """(Requirement, InvalidRequirement, Version, InvalidVersion) or None when ``packaging`` is missing."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return None
    return Requirement, InvalidRequirement, Version, InvalidVersion


def _contains(specifier, version: str | None) -> bool | None:
    """Whether ``version`` satisfies ``specifier`` (None: cannot tell)."""
    if version is None:
        return None
    tools = _packaging()
    if tools is None:
        return None
    try:
        if version.endswith(".*"):   # a companion series: test its first release
            version = version[:-2] + ".0"
        return bool(specifier.contains(tools[2](version.split("+")[0]), prereleases=True))
    except tools[3]:
        return None


# ---- requirement files ---------------------------------------------------------------------------------

def project_folders(script: str | None, cwd: str | None = None) -> list[Path]:
    """The script's folder and its parents up to the project root (or ``cwd``'s when no script)."""
    start = Path(script).resolve().parent if script else Path(cwd or ".").resolve()
    folders = []
    for folder in [start, *start.parents][:MAX_LEVELS]:
        folders.append(folder)
        if any((folder / marker).exists() for marker in ROOT_MARKERS):
            break
    return folders


def _tool_root() -> Path:
    """The folder holding opscope's own source tree (its checkout, when opscope is installed from one)."""
    from opscope.resources import package_parent
    return package_parent()


def requirement_files(folders: list[Path], notes: list[str] | None = None) -> list[Path]:
    """Requirement and project files of ``folders``; never opscope's own (a bundled example's parents)."""
    files: list[Path] = []
    tool = _tool_root()
    for folder in folders:
        if folder == tool and (folder / "opscope" / "__init__.py").is_file():
            # the script lies inside opscope's own checkout (a bundled example): the project file there
            # states what opscope needs, not what the script's job runs on
            if notes is not None:
                notes.append(f"{folder}: opscope's own project folder, not the script's: its requirement "
                             "files were not read")
            break
        try:
            found = sorted(folder.glob("requirements*.txt")) + sorted(folder.glob("requirements/*.txt"))
        except OSError:
            found = []
        files.extend(found)
        if (folder / "pyproject.toml").exists():
            files.append(folder / "pyproject.toml")
    return files


def _read(path: Path, notes: list[str]) -> str | None:
    try:
        if not path.is_file():
            notes.append(f"{path}: not a regular file, skipped")
            return None
        if path.stat().st_size > MAX_FILE_BYTES:
            notes.append(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, skipped")
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        notes.append(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc.__class__.__name__}), skipped")
        return None


def _text_and_packaging(path: Path, notes: list[str]):
    """(the file's text, packaging's classes); either None (noted) when the file cannot be parsed."""
    text = _read(path, notes)
    if text is None:
        return None, None
    tools = _packaging()
    if tools is None:
        notes.append(f"{path}: not parsed (the 'packaging' library is not installed)")
    return text, tools


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(number of the first physical line, text) of each requirement line, with ``\\`` continuations joined
    (pip-compile writes ``torch==2.5.1 \\`` then ``--hash=sha256:...`` lines)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def parse_requirements_txt(path: Path, notes: list[str]) -> list[dict]:
    """``[{"file", "line", "text", "requirement"}]`` of one requirements file; bad lines noted and skipped."""
    text, tools = _text_and_packaging(path, notes)
    if text is None or tools is None:
        return []
    requirement_cls, invalid = tools[0], tools[1]
    out = []
    for number, raw in _logical_lines(text):
        line = "" if raw.lstrip().startswith("#") else re.split(r"\s+#", raw, maxsplit=1)[0].strip()
        if not line or line.startswith(("-", "--")):   # options, -r other files, -e editable installs
            continue
        line = re.sub(r"\s--[A-Za-z][\w-]*(=\S+)?", "", line).strip()   # per-line options: --hash=sha256:...
        if "://" in line or line.startswith((".", "/")):
            continue   # a URL or a path: not a named requirement
        try:
            requirement = requirement_cls(line)
        except invalid as exc:
            notes.append(f"{path}:{number}: not a requirement ({str(exc).splitlines()[0]}), skipped")
            continue
        out.append({"file": str(path), "line": number, "text": line, "requirement": requirement})
    return out


def parse_pyproject(path: Path, notes: list[str]) -> list[dict]:
    """Requirements of ``[project] dependencies`` / ``optional-dependencies`` with their line numbers."""
    import tomllib
    text, tools = _text_and_packaging(path, notes)
    if text is None or tools is None:
        return []
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        notes.append(f"{path}: not valid TOML ({exc}), skipped")
        return []
    project: dict = data["project"] if isinstance(data.get("project"), dict) else {}
    entries = list(project.get("dependencies") or []) if isinstance(project.get("dependencies"), list) else []
    optional = project.get("optional-dependencies")
    if isinstance(optional, dict):
        for values in optional.values():
            if isinstance(values, list):
                entries.extend(values)
    lines = text.splitlines()
    out = []
    for entry in entries:
        if not isinstance(entry, str):
            notes.append(f"{path}: a dependency that is not a string ({entry!r}), skipped")
            continue
        try:
            requirement = tools[0](entry)
        except tools[1] as exc:
            notes.append(f"{path}: {entry!r} is not a requirement ({str(exc).splitlines()[0]}), skipped")
            continue
        number = next((i for i, line in enumerate(lines, start=1) if f'"{entry}"' in line or f"'{entry}'" in line), 0)
        out.append({"file": str(path), "line": number, "text": entry, "requirement": requirement})
    return out


def project_requirements(script: str | None, cwd: str | None = None) -> tuple[list[dict], list[str], list[str]]:
    """(requirements, files read, notes) near the scanned script."""
    notes: list[str] = []
    files = requirement_files(project_folders(script, cwd), notes)
    requirements: list[dict] = []
    for path in files:
        parser = parse_pyproject if path.name == "pyproject.toml" else parse_requirements_txt
        try:
            requirements.extend(parser(path, notes))
        except Exception as exc:   # never a traceback for a user's file
            notes.append(f"{path}: skipped ({exc.__class__.__name__}: {exc})")
    if not files and not any("opscope's own project folder" in n for n in notes):
        notes.append("no requirements*.txt or pyproject.toml in the script's folder or its parents up to the "
                     "project root")
    return requirements, [str(p) for p in files], notes


# ---- the plan's versions against the environment -------------------------------------------------------

def planned_versions(planned: dict) -> dict[str, tuple[str, str]]:
    """package -> (version or series, why) that the planned release installs."""
    from opscope.analysis.plan.pairs import companion_version
    torch_npu, torch = planned["torch_npu"], planned.get("torch")
    out = {"torch-npu": (torch_npu, "the planned torch_npu release")}
    if torch:
        out["torch"] = (torch, f"torch_npu {torch_npu} is built for torch {torch}")
        for package in ("torchvision", "torchaudio"):
            version = companion_version(package, torch)
            if version:
                out[package] = (version, f"{package} {version} is the release built for torch {torch}")
    return out


def _pin(name: str, version: str) -> str:
    return f"{name}=={version}"


def environment_against(planned: dict, script: str | None = None, cwd: str | None = None,
                        adapters: list | None = None) -> dict:
    """What in this environment and in the project's requirement files must change for ``planned``
    (``release_plan.release_facts`` of the planned release), and the install block."""
    wanted = planned_versions(planned)
    installed = installed_versions()
    changes: list[dict] = []
    for package, (version, why) in wanted.items():
        have = installed.get(package)
        if have is None:
            if package in ("torch", "torch-npu"):
                changes.append({"where": "installed", "package": package, "from": None, "to": version,
                                "reason": why})
            continue
        tools = _packaging()
        ok = None
        if tools is not None:
            from packaging.specifiers import SpecifierSet
            ok = _contains(SpecifierSet(f"=={version}"), have)
        if ok is False:
            changes.append({"where": "installed", "package": package, "from": have, "to": version, "reason": why})
    torch = wanted.get("torch", (None, ""))[0]
    changes.extend(_library_needs(installed, torch))
    requirements, files, notes = project_requirements(script, cwd)
    for entry in requirements:
        requirement = entry["requirement"]
        name = _canon(requirement.name)
        if name in wanted:
            version, why = wanted[name]
            if _contains(requirement.specifier, version) is False or (
                    name in ("torch", "torch-npu") and str(requirement.specifier) == ""):
                if not str(requirement.specifier) and name != "torch-npu":
                    continue   # unpinned: any torch works
                new = _pin(requirement.name, version)
                changes.append({"where": f"{_short(entry['file'], script, cwd)}:{entry['line']}", "package": name,
                                "from": entry["text"], "to": new, "reason": why})
        elif torch and _pinned(requirement):
            needs = _known_incompatibility(name, _pinned(requirement), torch)
            if needs:
                changes.append({"where": f"{_short(entry['file'], script, cwd)}:{entry['line']}", "package": name,
                                "from": entry["text"], "to": None, "reason": needs})
    return {"python": sys.version.split()[0], "python_executable": sys.executable,
            "python_ok": _python_ok(planned), "installed": installed, "files": files, "notes": notes,
            "changes": changes, "install": install_block(planned, installed, adapters or [])}


def _pinned(requirement) -> str | None:
    """The version a requirement pins (``transformers==5.24.0``), else None: a range may take another release."""
    specs = list(requirement.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator in ("==", "===") else None


def _short(path: str, script: str | None, cwd: str | None) -> str:
    root = project_folders(script, cwd)[-1]
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def _python_ok(planned: dict) -> bool | None:
    versions = planned.get("python") or []
    if not versions:
        return None
    return f"{sys.version_info.major}.{sys.version_info.minor}" in versions


def _known_incompatibility(name: str, have: str | None, torch: str) -> str | None:
    """A known incompatibility (release_pairs.yaml) of ``name`` at version ``have`` with ``torch``: its detail,
    or None."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    for item in load_optional("release_pairs.yaml").get("incompatibilities") or []:
        if _canon(str(item.get("package", ""))) != name:
            continue
        try:
            versions, needs = SpecifierSet(str(item.get("versions", ""))), SpecifierSet(str(item["needs_torch"]))
        except (InvalidSpecifier, KeyError):
            continue
        if have is None or _contains(versions, have) is False:
            continue
        if _contains(needs, torch) is False:
            return f"{item.get('detail', '')} [source: {item.get('source')}, support_matrix/release_pairs.yaml]"
    return None


def _library_needs(installed: dict, torch: str | None) -> list[dict]:
    """Installed libraries whose own Requires-Dist on torch (or a known incompatibility) excludes ``torch``."""
    if not torch or _packaging() is None:
        return []
    requirement_cls, invalid = _packaging()[0], _packaging()[1]
    out = []
    for package, have in installed.items():
        if have is None or package in ("torch", "torch-npu", "torchvision", "torchaudio", "numpy"):
            continue
        try:
            requires = metadata.requires(package) or []
        except Exception:
            requires = []
        for text in requires:
            try:
                requirement = requirement_cls(text)
            except invalid:
                continue
            if _canon(requirement.name) != "torch" or not str(requirement.specifier):
                continue
            if requirement.marker is not None and "extra" in str(requirement.marker) and \
                    'extra == "torch"' not in str(requirement.marker):
                continue
            if _contains(requirement.specifier, torch) is False:
                out.append({"where": "installed", "package": package, "from": have, "to": None,
                            "reason": f"{package} {have} requires torch{requirement.specifier} (its METADATA), "
                                      f"not the planned torch {torch}: install a {package} release that supports "
                                      f"torch {torch}, or plan a newer torch_npu"})
                break
        else:
            known = _known_incompatibility(_canon(package), have, torch)
            if known:
                out.append({"where": "installed", "package": package, "from": have, "to": None, "reason": known})
    return out


def install_block(planned: dict, installed: dict, adapters: list) -> str:
    """The commands for the Ascend machine, as text."""
    torch_npu, torch = planned["torch_npu"], planned.get("torch")
    lines = []
    if planned.get("cann"):
        how = " (inferred from its release branch)" if planned.get("cann_inferred") else ""
        lines.append(f"# 1. CANN {planned['cann']}{how}: toolkit + the kernels package for your chip, then")
    else:
        lines.append("# 1. CANN: no pairing known for torch_npu "
                     f"{torch_npu} ({planned.get('cann_why', 'not in the table')}); check Ascend's table")
    lines.append("source /usr/local/Ascend/ascend-toolkit/set_env.sh")
    if planned.get("python"):
        lines.append(f"# 2. Python {', '.join(planned['python'])} (torch_npu {torch_npu} wheels)")
    if torch:
        lines.append(f"pip install torch=={torch} --index-url {TORCH_CPU_INDEX}   # x86_64; aarch64: "
                     f"pip install torch=={torch}")
    lines.append(f"pip install torch-npu=={torch_npu} pyyaml setuptools")
    from opscope.analysis.plan.pairs import companion_version
    for package in ("torchvision", "torchaudio"):
        version = companion_version(package, torch)
        if installed.get(package) and version:
            lines.append(f"pip install '{package}=={version}'")
    for adapter in adapters:
        if adapter.get("tag"):
            lines.append(f"# {adapter['adapter']} {adapter['tag']} ({adapter['library']}): {adapter.get('install', '')}")
        else:
            lines.append(f"# {adapter['adapter']} ({adapter['library']}): {adapter.get('paired', '')}")
    return "\n".join(lines)
