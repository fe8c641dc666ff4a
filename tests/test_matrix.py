"""The support matrix: rebuilt from the real sources it is byte-for-byte the committed one;
loading, version resolution, `opscope matrix show|build`, substitutes data."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_opscope

from opscope.errors import UserError
from opscope.matrix.build import build, build_op_plugin, compress_lines, release_line, wheel_facts
from opscope.matrix.store import load_matrix, plugin_lines_of, resolve_line
from opscope.resources import support_matrix_dir

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
OP_PLUGIN = SHARED / "data" / "op_plugin"
MATRIX = support_matrix_dir()
needs_op_plugin = pytest.mark.skipif(not (OP_PLUGIN / "op_plugin_functions.yaml").is_file(),
                                     reason="../shared/data/op_plugin not available")


def _opscope(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "opscope", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


# ---- rebuilding reproduces the committed files ---------------------------------------

@needs_op_plugin
def test_op_plugin_files_rebuild_byte_for_byte(tmp_path):
    written = build_op_plugin(OP_PLUGIN, tmp_path)
    assert {p.name for p in written} == {"op_plugin.txt", "dtype_notes.txt"}
    for path in written:
        assert path.read_bytes() == (MATRIX / "versions" / path.name).read_bytes(), f"{path.name} differs"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """Two real torch_npu wheels (oldest and newest line) fetched with pip; skip when offline."""
    where = tmp_path_factory.mktemp("wheels")
    got = []
    for version in ("2.14.0", "2.1.0.post17"):
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               f"torch_npu=={version}", "-d", str(where)], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            pytest.skip(f"cannot download torch_npu {version} with pip: {proc.stderr.strip()[-200:]}")
        got.append(next(where.glob(f"torch_npu-{version}-*.whl")))
    return got


@pytest.mark.slow
def test_wheels_rebuild_byte_for_byte(wheels, tmp_path):
    steps = []
    written = build(tmp_path, wheels=wheels, torch_facts=False,
                    progress=lambda done, total, what: steps.append((done, total)))
    assert len(written) == 2
    assert steps == [(0, 2), (1, 2), (2, 2)]  # `matrix build` shows a progress bar from these
    for path in written:
        assert path.read_bytes() == (MATRIX / "versions" / path.name).read_bytes(), path.name


@pytest.mark.slow
def test_build_cli_from_wheel_file(wheels, tmp_path):
    import shutil
    (tmp_path / "versions").mkdir()
    shutil.copy(MATRIX / "versions" / "torch_schema.txt", tmp_path / "versions")  # has torch 2.14.0: no fetch
    proc = _opscope("matrix", "build", "--wheel", str(wheels[0]), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "versions" / "torch_npu-2.14.txt").read_bytes() == \
        (MATRIX / "versions" / "torch_npu-2.14.txt").read_bytes()
    version, lines = wheel_facts(wheels[0])
    assert version == "2.14.0" and "aten gelu.out codegen:supported" in lines and "contrib ROIAlign contrib" in lines


@pytest.mark.slow
def test_exact_releases_of_a_line_rebuild_byte_for_byte(tmp_path):
    """2.8.0 ... 2.8.0.post5 from PyPI: the line's files, newest in full and the others as differences."""
    from opscope.matrix.build import wheel_torch
    where = tmp_path / "wheels"
    versions = ("2.8.0", "2.8.0.post2", "2.8.0.post4", "2.8.0.post5")
    for version in versions:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               f"torch_npu=={version}", "-d", str(where)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.skip(f"cannot download torch_npu {version} with pip: {proc.stderr.strip()[-200:]}")
    wheels = sorted(where.glob("torch_npu-*.whl"))
    assert {wheel_torch(w) for w in wheels} == {"2.8.0"}
    written = build(tmp_path / "out", wheels=wheels, torch_facts=False)
    assert {p.name for p in written} == {"torch_npu-2.8.txt", "releases-2.8.txt"}
    for path in written:
        assert path.read_bytes() == (MATRIX / "versions" / path.name).read_bytes(), path.name


def test_committed_release_files_are_a_fixed_point_of_the_builder(tmp_path):
    """Reading every release back from the committed files and writing them again gives the same bytes
    (so adding one release with `matrix build --version` rewrites its line reproducibly)."""
    from opscope.matrix.build import read_line_releases, write_line
    from opscope.matrix.torch_schema import read_facts, render_facts
    versions = MATRIX / "versions"
    for path in sorted(versions.glob("torch_npu-*.txt")):
        line = path.stem.split("-", 1)[1]
        for written in write_line(tmp_path, line, read_line_releases(versions, line)):
            assert written.read_bytes() == (versions / written.name).read_bytes(), written.name
    schema = versions / "torch_schema.txt"
    assert render_facts(read_facts(schema)).encode() == schema.read_bytes()


def test_every_pypi_release_from_2_1_is_in_the_matrix_with_its_torch():
    matrix = load_matrix()
    pypi = """2.14.0 2.13.0 2.12.0.post3 2.12.0.post2 2.12.0 2.11.0.post3 2.11.0.post2 2.11.0 2.10.0.post7
    2.10.0.post6 2.10.0.post4 2.10.0.post2 2.10.0 2.9.1 2.9.0.post9 2.9.0.post8 2.9.0.post6 2.9.0.post4 2.9.0.post2
    2.9.0 2.8.0.post5 2.8.0.post4 2.8.0.post2 2.8.0 2.7.1.post11 2.7.1.post10 2.7.1.post8 2.7.1.post6 2.7.1.post4
    2.7.1.post2 2.7.1 2.6.0.post5 2.6.0.post3 2.6.0 2.5.1.post1 2.5.1 2.4.0.post4 2.4.0.post2 2.4.0 2.3.1.post6
    2.3.1.post4 2.3.1.post2 2.1.0.post17 2.1.0.post13 2.1.0.post12 2.1.0.post10 2.1.0.post8""".split()
    assert set(matrix.versions) == set(pypi)  # `pip index versions torch_npu`, 2026-11
    assert matrix.exact["2.8.0"].torch == "2.8.0" and matrix.exact["2.9.1"].torch == "2.9.1"
    from opscope.matrix.torch_schema import schema_for
    for version in matrix.versions:  # every torch they are built for has its facts committed
        assert schema_for(matrix.exact[version].torch) is not None, version
    # exact releases really differ (the example), and a line stands for its newest release
    assert "gelu" in matrix.exact["2.8.0"].aten and "gelu" not in matrix.exact["2.8.0.post5"].aten
    assert "_chunk_cat" not in matrix.exact["2.8.0"].aten and "_chunk_cat" in matrix.exact["2.8.0.post5"].aten
    assert matrix.release("2.8") is matrix.exact["2.8.0.post5"]


def test_torch_facts_differ_between_torch_releases():
    """What is composite/structured is taken from the torch each torch_npu release is built for."""
    from opscope.matrix.torch_schema import schema_for
    old, new = schema_for("2.1.0"), schema_for("2.14.0")
    assert old.get("_fused_adam_", "").dispatch == ("CUDA",)  # CPU fused Adam came with torch 2.4
    assert "CPU" in new.get("_fused_adam_", "").dispatch
    assert old.get("rms_norm", "") is None and new.get("rms_norm", "").composite_implicit
    assert new.get("gelu", "").structured_delegate == "gelu.out"


# ---- the committed matrix ----------------------------------------------------------------

def test_every_release_line_2_1_to_2_14_is_present_and_from_a_wheel():
    matrix = load_matrix()
    wheel_lines = [line for line, rel in matrix.releases.items() if rel.from_wheel]
    assert wheel_lines == ["2.1", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12",
                           "2.13", "2.14"]
    assert matrix.default_line == "2.14"
    # lines without a PyPI wheel come from op-plugin's ranges and say so
    assert {"2.2", "2.15"} <= set(matrix.lines)
    assert not matrix.release("2.15").from_wheel and "no torch_npu 2.15 wheel" in matrix.release("2.15").note
    for rel in matrix.releases.values():
        assert len(rel.aten) > 1000 and len(rel.custom) > 100


@needs_op_plugin
def test_wheel_lists_agree_with_op_plugin_for_the_newest_lines():
    """Two independent sources: every overload op-plugin implements for 2.13/2.14 is in that wheel."""
    matrix = load_matrix()
    for line in ("2.13", "2.14"):
        implemented = {name for name, e in matrix.plugin.items()
                       if e.section != "custom" and line in plugin_lines_of(e, matrix.plugin_lines)}
        missing = implemented - set(matrix.release(line).aten)
        assert not missing, f"{line}: op-plugin implements {sorted(missing)[:5]} but the wheel lacks them"


def test_known_facts_of_the_real_lists():
    matrix = load_matrix()
    r14, r8 = matrix.release("2.14"), matrix.release("2.8")
    assert "gelu.out" in r14.aten and "gelu" not in r14.aten and "huber_loss" not in r14.aten
    assert "_fused_adam_" in r14.aten and "_fused_adam_" not in r8.aten
    assert matrix.plugin["abs"].inherit == "abs.out"
    assert "npu_nms_v4" in r14.custom and "ROIAlign" in r14.contrib
    assert matrix.dtype_notes["nn.functional.conv2d"]["float32"]["test_compare_cpu"] == "all"


@pytest.mark.parametrize("text,line", [(None, "2.14"), ("2.8.0", "2.8"), ("torch_npu==2.8.0.post5", "2.8"),
                                       ("2.14", "2.14"), ("v2.1", "2.1"), ("2.15", "2.15"), ("2.2.0", "2.2")])
def test_resolve_line(text, line):
    assert resolve_line(load_matrix(), text) == line


@pytest.mark.parametrize("text", ["2.99.0", "banana", "torch==2.8.0", "2.8.0.post3", "2.1.0"])
def test_resolve_line_rejects_unknown_versions(text):
    with pytest.raises(UserError) as err:
        resolve_line(load_matrix(), text)
    assert "2.14" in str(err.value) or "torch_npu" in str(err.value)


def test_version_ranges_compress_over_known_lines():
    lines = ["2.1", "2.2", "2.3", "2.4", "2.5"]
    assert compress_lines(["2.1", "2.2", "2.3", "2.5"], lines) == "2.1-2.3,2.5"
    assert compress_lines([], lines) == "-"
    assert release_line("2.10.0.post7") == "2.10"


# ---- CLI -------------------------------------------------------------------------------------

def test_matrix_show_gelu_across_versions():
    proc = _opscope("matrix", "show", "aten::gelu", "--json")
    assert proc.returncode == 0, proc.stderr
    import json
    rows = {(r["line"], r["op"]): r for r in json.loads(proc.stdout)}
    # every overload of the family, per release line
    assert rows["2.14", "aten::gelu"]["verdict"] == "composite"
    assert "gelu.out" in rows["2.14", "aten::gelu"]["evidence"]["path"]
    assert rows["2.14", "aten::gelu.out"]["verdict"] == "native"
    assert rows["2.1", "aten::gelu"]["verdict"] == "native"  # 2.1 still registered the functional gelu
    table = _opscope("matrix", "show", "huber_loss", "--target", "2.14.0")
    assert table.returncode == 0 and "cpu-fallback" in table.stdout and "smooth_l1_loss" in table.stdout


def test_matrix_cli_errors_are_one_line():
    for args in (["matrix", "show", "gelu", "--target", "9.9"], ["matrix", "build"],
                 ["matrix", "build", "--wheel", "/nonexistent/torch_npu-2.1.0-x.whl"], ["matrix"]):
        proc = _opscope(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("opscope: error:"), proc.stderr


# ---- substitutes data -----------------------------------------------------------------------

def _options():
    data = yaml.safe_load((MATRIX / "substitutes.yaml").read_text())
    for op, options in data["substitutes"].items():
        for option in options:
            yield op, option


def test_every_torch_npu_api_a_substitute_names_is_declared_and_exists():
    matrix = load_matrix()
    for op, option in _options():
        requires = option.get("requires") or {}
        named = set(re.findall(r"torch_npu\.(?:contrib\.)?(?:module\.|function\.)?(\w+)", option["replacement"]))
        declared = set(requires.get("custom", [])) | set(requires.get("contrib", []))
        assert named <= declared, f"{op}: {named - declared} used but not in requires"
        valid_in = [line for line, rel in matrix.releases.items()
                    if all(n in rel.custom for n in requires.get("custom", []))
                    and all(n in rel.contrib for n in requires.get("contrib", []))
                    and all(n in rel.aten for n in requires.get("aten", []))]
        assert valid_in, f"{op}: {option['replacement']} is valid in no torch_npu release"
        assert option.get("rationale"), op


def test_huber_substitute_is_numerically_the_huber_loss():
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    x, y = torch.randn(64, 3) * 3, torch.randn(64, 3)
    for delta in (0.5, 1.0, 2.5):
        assert torch.allclose(F.huber_loss(x, y, delta=delta), delta * F.smooth_l1_loss(x, y, beta=delta), atol=1e-6)


def test_show_keeps_a_library_api_name_whole():
    """apex::amp.scale_loss is the name the apex stand-in records (an adapter op), not amp with overload scale_loss."""
    from opscope.commands.matrix import _parse_op
    assert _parse_op("apex::amp.scale_loss") == ("apex::amp.scale_loss", None)
    assert _parse_op("aten::add.Tensor") == ("aten::add", "Tensor")
    assert _parse_op("torchvision::nms") == ("torchvision::nms", None)
    proc = run_opscope("matrix", "show", "apex::amp.scale_loss", "--target", "2.6.0")
    assert proc.returncode == 0 and "adapter" in proc.stdout, proc.stdout + proc.stderr
