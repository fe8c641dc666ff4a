"""`opscope migrate`: safe CUDA->NPU rewrites as a patch that applies cleanly and still parses."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opscope.analysis.static.migrate import migrate_source, plan_migration, render_report
from opscope.analysis.static.scan import scan_paths

HERE = Path(__file__).resolve().parent
STATIC = HERE / "data" / "static"
SCRIPTS = HERE / "data" / "scripts"


def _opscope(*args, cwd):
    return subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the GPU fixture project (the originals must never change)."""
    proj = tmp_path / "proj"
    shutil.copytree(STATIC, proj)
    shutil.copy(SCRIPTS / "gpu_style_train.py", proj / "gpu_style_train.py")
    return proj


def test_migrate_cli_patch_applies_with_git_and_patch_and_still_parses(project, tmp_path):
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    proc = _opscope("migrate", ".", "--out", tmp_path / "out", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before  # nothing touched
    patch = tmp_path / "out" / "opscope-migrate.patch"
    text = patch.read_text()
    assert "+++ b/ddp_train.py" in text and "+++ b/gpu_style_train.py" in text
    assert "cpu_train.py" not in text and "lookalikes.py" not in text

    if shutil.which("patch"):
        copy = tmp_path / "with_patch"
        shutil.copytree(project, copy)
        done = subprocess.run(["patch", "-p1", "-i", str(patch)], cwd=copy, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FAILED" not in done.stdout and "fuzz" not in done.stdout.lower()
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", "."], cwd=project, check=True)
        done = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=project, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        subprocess.run(["git", "apply", str(patch)], cwd=project, check=True)
    else:  # no git here: apply the patched copies instead
        for f in (tmp_path / "out").rglob("*.py"):
            shutil.copy(f, project / f.relative_to(tmp_path / "out"))

    for name in ("ddp_train.py", "gpu_style_train.py"):
        patched = (project / name).read_text()
        ast.parse(patched)
        assert patched == (tmp_path / "out" / name).read_text()
        assert patched.count("import torch_npu") == 1
    ddp = (project / "ddp_train.py").read_text().splitlines()
    assert 'default="hccl"' in ddp[35]
    assert "torch_npu.npu.set_device(args.local_rank)" in ddp[55]
    assert 't.device(f"npu:{args.local_rank}")' in ddp[58]
    assert "model = Net().npu()" in ddp[65]
    assert 'target.to("npu", non_blocking=True)' in ddp[80]
    assert "torch_npu.npu.synchronize()" in ddp[88]
    # what remains after the patch is exactly what needs judgement
    left = {f.rule for f in scan_paths([project / "ddp_train.py"])}
    assert left == {"apex-import", "third-party-cuda", "cuda-extension", "apex-fused-layernorm", "cudnn-flags",
                    "pin-memory", "drop-last", "apex-fused-optimizer", "apex-amp", "ddp-device-ids"}
    report = (tmp_path / "out" / "opscope-migrate.md").read_text()
    assert "## Not changed" in report and "apex-amp" in report and "custom-op" in report and "cuda-source" in report


def test_gpu_style_script_rewrites(tmp_path):
    source = (SCRIPTS / "gpu_style_train.py").read_text()
    result = migrate_source(source, "gpu_style_train.py")
    after = result.patched.splitlines()
    assert after[4] == "import torch_npu  # added by opscope migrate: registers the NPU device with torch"
    assert "assert torch_npu.npu.is_available()" in after[18]
    assert 'device = torch.device("npu:0")' in after[23]
    assert "torch_npu.npu.amp.GradScaler()" in after[27]
    assert "with torch_npu.npu.amp.autocast():" in after[32]
    assert "torch_npu.npu.max_memory_allocated()" in after[39]
    assert {s.rule for s in result.skipped} == {"cudnn-flags", "pin-memory"}
    assert all(s.reason for s in result.skipped)


@pytest.mark.parametrize("source, expected, skipped", [
    # no trailing newline, CRLF endings, torch only imported inside try, torch_npu already imported
    ("import torch\ntorch.cuda.synchronize()", "import torch\nimport torch_npu  # added by opscope migrate: "
     "registers the NPU device with torch\ntorch_npu.npu.synchronize()", set()),
    ("import torch\r\nx = torch.zeros(2).cuda()\r\n", "import torch\r\nimport torch_npu  # added by opscope migrate: "
     "registers the NPU device with torch\r\nx = torch.zeros(2).npu()\r\n", set()),
    ('"""Doc."""\nfrom __future__ import annotations\ntry:\n    import torch\nexcept ImportError:\n    torch = None\n'
     'device = "cuda"\n', '"""Doc."""\nfrom __future__ import annotations\nimport torch_npu  # added by opscope migrate: '
     'registers the NPU device with torch\ntry:\n    import torch\nexcept ImportError:\n    torch = None\ndevice = "npu"\n',
     set()),
    ("import torch\nimport torch_npu\ndist_backend = 'nccl'\n", "import torch\nimport torch_npu\ndist_backend = 'hccl'\n",
     set()),
    # a UTF-8 BOM stays, offsets on line 1 still right
    ("\ufeffimport torch; torch.cuda.synchronize()\n", "\ufeffimport torch; torch_npu.npu.synchronize()\n"
     "import torch_npu  # added by opscope migrate: registers the NPU device with torch\n", set()),
    # a config module without torch: strings change, the import is left to the entry script
    ("DEVICE = 'cuda:1'\n", "DEVICE = 'npu:1'\n", {"import-torch-npu"}),
    # a torch.cuda member with no confirmed torch_npu equivalent is left alone
    ("import torch\nv = torch.cuda.ipc_collect()\n", "import torch\nv = torch.cuda.ipc_collect()\n", {"cuda-api"}),
    ("import torch\nv = torch.cuda.nccl.version()\n", "import torch\nv = torch.cuda.nccl.version()\n", {"nccl-api"}),
    # an expression split over lines is not rewritten
    ("import torch\ntorch.cuda \\\n    .synchronize()\n", "import torch\ntorch.cuda \\\n    .synchronize()\n",
     {"cuda-synchronize"}),
    # what needs judgement is never touched
    ("import torch\nm = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n",
     "import torch\nm = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n", {"data-parallel"}),
])
def test_safe_rewrite_edge_cases(source, expected, skipped):
    result = migrate_source(source, "m.py")
    assert result.error is None
    assert result.patched == expected
    assert {s.rule for s in result.skipped} == skipped
    ast.parse(result.patched.lstrip("\ufeff"))


def test_patch_for_edge_cases_applies_with_git(tmp_path):
    if not shutil.which("git"):
        pytest.skip("git not installed")
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "a.py").write_bytes(b"import torch\ntorch.cuda.synchronize()")       # no final newline
    (proj / "b.py").write_bytes(b"import torch\r\nx = torch.ones(1).cuda()\r\n")  # CRLF
    (proj / "c.py").write_text("# \u00e9l\u00e8ve: \u00fcnicode before the column\nimport torch\ns = '\u00e9'; d = torch.device('cuda')\n",
                               encoding="utf-8")
    migration = plan_migration([proj], root=proj)
    patch = tmp_path / "m.patch"
    patch.write_text(migration.diff(), encoding="utf-8", newline="")
    subprocess.run(["git", "init", "-q", "."], cwd=proj, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=proj, check=True, capture_output=True)
    assert (proj / "a.py").read_bytes().endswith(b"torch_npu.npu.synchronize()")
    assert b"x = torch.ones(1).npu()\r\n" in (proj / "b.py").read_bytes()
    assert "d = torch.device('npu')" in (proj / "c.py").read_text(encoding="utf-8")
    for name in ("a.py", "b.py", "c.py"):
        ast.parse((proj / name).read_bytes())


def test_unparseable_file_is_reported_not_changed(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n    torch.cuda.synchronize()\n")
    migration = plan_migration([tmp_path], root=tmp_path)
    assert migration.diff() == ""
    assert [f.error is not None for f in migration.files] == [True]
    assert "could not parse" in render_report(migration)


def test_migrate_cli_errors_are_one_line(tmp_path):
    proc = _opscope("migrate", tmp_path / "missing.py", "--out", tmp_path / "o", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "path not found" in proc.stderr
    (tmp_path / "file").write_text("x")
    (tmp_path / "t.py").write_text("import torch\n")
    proc = _opscope("migrate", tmp_path / "t.py", "--out", tmp_path / "file", cwd=tmp_path)
    assert proc.returncode == 2 and "is a file" in proc.stderr and "Traceback" not in proc.stderr


def test_output_folder_inside_project_is_not_rescanned(project):
    first = _opscope("migrate", ".", "--out", "patched", "-q", cwd=project)
    assert first.returncode == 0, first.stderr
    second = _opscope("migrate", ".", "--out", "patched", "-q", cwd=project)
    assert second.returncode == 0, second.stderr
    assert "patched/" not in (project / "patched" / "opscope-migrate.patch").read_text()
    assert textwrap.dedent((project / "patched" / "ddp_train.py").read_text()).count("import torch_npu") == 1


def _apply_both(patch: Path, tree: Path, tmp_path: Path) -> list[Path]:
    """Apply ``patch`` to two copies of ``tree`` with `patch -p1` and `git apply`; return the copies."""
    copies = []
    for tool in ("patch", "git"):
        if not shutil.which(tool):
            continue
        copy = tmp_path / f"with_{tool}"
        shutil.copytree(tree, copy, symlinks=True)
        cmd = ["patch", "-p1", "-i", str(patch)] if tool == "patch" else ["git", "apply", "-v", str(patch)]
        done = subprocess.run(cmd, cwd=copy, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        copies.append(copy)
    return copies


def test_symlink_out_of_the_project_is_never_followed_or_written(tmp_path):
    """`ext_link.py -> ../outside/train.py` with `--out .`: the outside file stays as it was."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "train.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    before = (outside / "train.py").read_bytes()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "ext_link.py").symlink_to("../outside/train.py")
    (proj / "loop1.py").symlink_to("loop2.py")      # a symlink loop
    (proj / "loop2.py").symlink_to("loop1.py")
    (proj / "sub").mkdir()
    (proj / "sub" / "up").symlink_to("..")          # a folder loop
    (proj / "own.py").write_text("import torch\ny = torch.ones(1).cuda()\n")
    os.mkfifo(proj / "pipe.py")                     # reading it would block forever
    for out in (".", "patched"):
        proc = _opscope("migrate", ".", "--out", out, "-q", cwd=proj)
        assert proc.returncode == 0, proc.stderr
        assert (outside / "train.py").read_bytes() == before
        assert (proj / "ext_link.py").is_symlink()
        report = (proj / out / "opscope-migrate.md").read_text()
        assert "ext_link.py | not-followed" in report and "loop1.py | not-read" in report
        assert "outside/train.py" not in (proj / out / "opscope-migrate.patch").read_text()
    assert (proj / "own.py").read_text() == "import torch\ny = torch.ones(1).cuda()\n"
    assert ".npu()" in (proj / "patched" / "own.py").read_text()


def test_out_that_would_overwrite_an_input_is_refused_before_writing(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    proc = _opscope("migrate", ".", "--out", ".", cwd=proj)   # --out is the project: nothing rewritten
    assert proc.returncode == 0 and (proj / "train.py").read_text().endswith(".cuda()\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.py").symlink_to(proj / "train.py")   # a copy's destination links to the input
    proc = _opscope("migrate", ".", "--out", out, cwd=proj)
    assert proc.returncode == 2 and "would overwrite your file" in proc.stderr
    assert proc.stderr.count("\n") == 1 and (proj / "train.py").read_text().endswith(".cuda()\n")
    assert not (out / "opscope-migrate.patch").exists()
    (out / "train.py").unlink()
    (out / "train.py").symlink_to(tmp_path / "elsewhere.py")   # a dangling link is replaced, not followed
    proc = _opscope("migrate", ".", "--out", out, cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "train.py").is_symlink() and not (tmp_path / "elsewhere.py").exists()


@pytest.mark.parametrize("name", ["my train.py", "tab\tname.py", 'quote"back\\slash.py', "ünï cödé.py"])
def test_patch_for_any_file_name_applies_with_git_and_patch(tmp_path, name):
    proj = tmp_path / "proj"
    (proj / "sub dir").mkdir(parents=True)
    (proj / "sub dir" / name).write_text("import torch\nx = torch.zeros(2).cuda()\n")
    proc = _opscope("migrate", ".", "--out", tmp_path / "out", "-q", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    patch = tmp_path / "out" / "opscope-migrate.patch"
    for copy in _apply_both(patch, proj, tmp_path):
        assert (copy / "sub dir" / name).read_text() == (tmp_path / "out" / "sub dir" / name).read_text()
        assert ".npu()" in (copy / "sub dir" / name).read_text()


def test_out_that_cannot_be_created_is_exit_2_before_any_work(tmp_path):
    (tmp_path / "t.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    (tmp_path / "file").write_text("x")
    proc = _opscope("migrate", "t.py", "--out", tmp_path / "file" / "sub", cwd=tmp_path)
    assert proc.returncode == 2 and "cannot create --out" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_porting_idioms_rewrite_device_strings_and_leave_judgement(tmp_path):
    """Formatted device strings and is_nccl_available are rewritten; kwargs-dict pin_memory,
    comparisons, version probes and torch.cuda.nccl are left with a reason; a TVM target, log
    text and dict keys are never touched."""
    source = (STATIC / "port_idioms.py").read_text()
    result = migrate_source(source, "port_idioms.py")
    assert result.error is None and result.import_added
    before, after = source.splitlines(), result.patched.splitlines()
    changed = {b: a for b, a in zip(before, [l for l in after if "added by opscope migrate" not in l]) if a != b}
    assert {b.strip(): a.strip() for b, a in changed.items()} == {
        'p.add_argument("--device", default="cuda")': 'p.add_argument("--device", default="npu")',
        'return "cuda" if torch.cuda.is_available() else "cpu"': 'return "npu" if torch_npu.npu.is_available() else "cpu"',
        "torch.cuda.set_device(gpu)": "torch_npu.npu.set_device(gpu)",
        'device = torch.device("cuda:{}".format(gpu))': 'device = torch.device("npu:{}".format(gpu))',
        'replica = torch.device(f"cuda:{gpu + 1}")': 'replica = torch.device(f"npu:{gpu + 1}")',
        'spare = torch.zeros(1, device="cuda:%d" % gpu)': 'spare = torch.zeros(1, device="npu:%d" % gpu)',
        "if dist.is_nccl_available():": "if dist.is_hccl_available():",
        'dist.init_process_group("nccl")': 'dist.init_process_group("hccl")',
    }
    ast.parse(result.patched)
    assert {(s.rule, s.line) for s in result.skipped} == {
        ("pin-memory", 28), ("drop-last", 31), ("pin-memory", 32), ("nccl-api", 46), ("cuda-version", 46),
        ("pin-memory", 55), ("cuda-device-check", 57), ("is-cuda", 57)}
    reasons = {s.rule: s.reason for s in result.skipped}
    assert "branch" in reasons["cuda-device-check"] and "CANN" in reasons["cuda-version"]


@pytest.mark.parametrize("source, expected, skipped", [
    ("import torch\nx = torch.ones(1).to('cuda:' + str(1))\n",
     "import torch\nimport torch_npu  # added by opscope migrate: registers the NPU device with torch\n"
     "x = torch.ones(1).to('npu:' + str(1))\n", set()),
    # a name imported on its own is left alone: the import would have to change too
    ("import torch\nfrom torch.distributed import is_nccl_available\nok = is_nccl_available()\n",
     "import torch\nfrom torch.distributed import is_nccl_available\nok = is_nccl_available()\n", {"nccl-available"}),
    # an argparse device option: its default and choices change together; another option's do not
    ("import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--device', default='cuda', choices=['cpu', 'cuda'])\n"
     "p.add_argument('--tvm-target', default='cuda', choices=['cuda', 'llvm'])\nx = torch.ones(1).to(p.parse_args().device)\n",
     "import argparse, torch\nimport torch_npu  # added by opscope migrate: registers the NPU device with torch\n"
     "p = argparse.ArgumentParser()\np.add_argument('--device', default='npu', choices=['cpu', 'npu'])\n"
     "p.add_argument('--tvm-target', default='cuda', choices=['cuda', 'llvm'])\nx = torch.ones(1).to(p.parse_args().device)\n",
     set()),
    # a 'cuda' string that is not a device is not touched
    ("import torch\nimport tvm\nt = tvm.target.Target('cuda')\n", "import torch\nimport tvm\nt = tvm.target.Target('cuda')\n",
     set()),
])
def test_new_rule_rewrites(source, expected, skipped):
    result = migrate_source(source, "m.py")
    assert result.patched == expected
    assert {s.rule for s in result.skipped} == skipped
