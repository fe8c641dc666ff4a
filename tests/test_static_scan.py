"""Static migration scan: CUDA-specific APIs found in source, with line and NPU replacement."""
from __future__ import annotations

import ast
import functools
import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from opscope.analysis.static.scan import load_rules
from opscope.analysis.findings import merge_findings
from opscope.analysis.static.scan import scan_file, scan_paths, scan_source
from opscope.model import Finding, ScanResult
from opscope.report.sarif import to_sarif, write_sarif

HERE = Path(__file__).resolve().parent
STATIC = HERE / "data" / "static"
SCRIPTS = HERE / "data" / "scripts"
RULES_FILE = HERE.parent / "support_matrix" / "cuda_api_rules.yaml"

# (line, rule) of every CUDA-specific use in data/static/ddp_train.py
EXPECTED_DDP = {
    (20, "apex-import"),            # from apex import amp            (inside try/except)
    (21, "apex-import"),            # from apex.optimizers import FusedAdam
    (22, "apex-import"),            # from apex.normalization import FusedLayerNorm
    (28, "third-party-cuda"),       # import pynvml
    (30, "cuda-extension"),         # load(name="roi_ops", sources=[... .cu])
    (35, "nccl-backend"),           # argparse default="nccl"
    (46, "apex-fused-layernorm"),   # FusedLayerNorm(128)
    (55, "cuda-set-device"),        # t.cuda.set_device(...)   (import torch as t)
    (57, "cudnn-flags"),            # t.backends.cudnn.benchmark = True
    (58, "cuda-device"),            # t.device(f"cuda:{args.local_rank}")
    (62, "pin-memory"),             # DataLoader(..., pin_memory=True) on the next line
    (62, "drop-last"),              # ... and no drop_last=True
    (65, "cuda-call"),              # Net().cuda()
    (66, "apex-fused-optimizer"),   # FusedAdam(...)
    (68, "apex-amp"),               # amp.initialize(...)
    (69, "ddp-device-ids"),         # DDP(model, device_ids=[args.local_rank])
    (70, "cuda-amp-gradscaler"),    # cuda_amp.GradScaler()   (from torch.cuda import amp as cuda_amp)
    (73, "cuda-event"),
    (74, "cuda-event"),
    (79, "cuda-call"),              # images.cuda(non_blocking=True)
    (80, "cuda-device"),            # target.to("cuda", ...)
    (81, "cuda-amp-autocast"),      # with cuda_amp.autocast():
    (88, "cuda-synchronize"),
    (90, "cuda-memory"),            # t.cuda.max_memory_allocated() inside an f-string
}


def _pairs(findings):
    return {(f.line, f.rule) for f in findings}


def _scan_text(tmp_path, text: str, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return scan_file(path)


def test_ddp_script_every_cuda_use_found_with_line_and_replacement():
    findings = scan_paths([STATIC / "ddp_train.py"])
    assert _pairs(findings) == EXPECTED_DDP
    lines = (STATIC / "ddp_train.py").read_text().splitlines()
    by = {(f.line, f.rule): f for f in findings}
    for f in findings:
        assert f.origin == "static" and f.file == str(STATIC / "ddp_train.py")
        assert f.snippet == lines[f.line - 1].strip()
        assert f.severity in ("error", "warning", "info") and f.message and f.replacement
        assert f.column >= 1
    assert "torch_npu.npu.synchronize()" in by[(88, "cuda-synchronize")].replacement
    assert "hccl" in by[(35, "nccl-backend")].replacement
    assert "torch.nn.LayerNorm" in by[(46, "apex-fused-layernorm")].replacement
    assert "NpuFusedAdam" in by[(66, "apex-fused-optimizer")].replacement
    assert "npu" in by[(81, "cuda-amp-autocast")].replacement
    assert by[(79, "cuda-call")].column == lines[78].index("images.cuda") + 1
    assert by[(62, "drop-last")].severity == "info"


def test_gpu_style_script_matches_what_the_runtime_remapper_reports():
    """Every rule the run-time remap fires for this script is found statically on the same line."""
    findings = scan_paths([SCRIPTS / "gpu_style_train.py"])
    rules = {f.rule for f in findings}
    assert {"cuda-is-available", "cuda-set-device", "cudnn-flags", "pin-memory", "cuda-device", "cuda-call",
            "cuda-amp-gradscaler", "cuda-amp-autocast", "cuda-synchronize", "cuda-memory"} <= rules
    assert "drop-last" not in rules  # the loader sets drop_last=True


@pytest.mark.parametrize("name", ["cpu_train.py", "lookalikes.py"])
def test_no_findings_on_cpu_code_or_name_lookalikes(name):
    assert scan_paths([STATIC / name]) == []


@pytest.mark.parametrize("source, expected", [
    ("import torch as t\nt.cuda.synchronize()\n", {(2, "cuda-synchronize")}),
    ("from torch import cuda\ncuda.empty_cache()\n", {(2, "cuda-memory")}),
    ("from torch.cuda import synchronize as sync\nsync()\n", {(2, "cuda-synchronize")}),
    ("import torch\ncu = torch.cuda\ncu.manual_seed(1)\n", {(3, "cuda-manual-seed")}),
    ("import torch.cuda.amp\nwith torch.cuda.amp.autocast():\n    pass\n", {(2, "cuda-amp-autocast")}),
    ("import torch\nwith torch.autocast(device_type='cuda', dtype=torch.float16):\n    pass\n",
     {(2, "cuda-amp-autocast")}),
    ("import torch\nwith torch.autocast('cpu'):\n    pass\n", set()),
    ("import torch\ns = torch.amp.GradScaler('cuda')\n", {(2, "cuda-amp-gradscaler")}),
    ("import torch.distributed as dist\ndist.init_process_group('nccl', rank=0)\n", {(2, "nccl-backend")}),
    ("from torch import distributed\ndistributed.init_process_group(backend='gloo')\n", set()),
    ("import torch\nx = torch.zeros(3, device='cuda:1')\n", {(2, "cuda-device")}),
    ("import torch\nd = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
     {(2, "cuda-device"), (2, "cuda-is-available")}),
    ("import torch\nsd = torch.load('m.pt', map_location='cuda:0')\n", {(2, "cuda-load")}),
    ("import torch\nm = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n", {(2, "data-parallel")}),
    ("import torch\nwith torch.autograd.profiler.profile(use_cuda=True) as p:\n    pass\n",
     {(2, "profiler-use-cuda")}),
    ("import torch\nwith torch.autograd.profiler.profile(use_cuda=False) as p:\n    pass\n", set()),
    ("from torch.profiler import ProfilerActivity\nacts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]\n",
     {(2, "profiler-activity-cuda")}),
    ("import torch\nt = torch.cuda.FloatTensor(3)\n", {(2, "cuda-tensor-type")}),
    ("import torch\ng = torch.cuda.CUDAGraph()\n", {(2, "cuda-graph")}),
    ("import torch\ntorch.cuda.nvtx.range_push('fwd')\n", {(2, "cuda-nvtx")}),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", {(2, "cuda-backend-flags")}),
    ("import torch\ntorch.ops.load_library('build/libops.so')\n", {(2, "custom-op-library")}),
    ("import torch.utils.cpp_extension as ext\nm = ext.load_inline('m', cpp_sources='')\n",
     {(2, "cuda-extension")}),
    ("from apex.parallel import DistributedDataParallel as ADDP\nm = ADDP(None)\n",
     {(1, "apex-import"), (2, "apex-parallel")}),
    ("import cupy as cp\nimport triton.language as tl\nfrom flash_attn import flash_attn_func\n"
     "import xformers.ops\nimport bitsandbytes as bnb\nimport nvtx\n",
     {(1, "third-party-cuda"), (2, "third-party-cuda"), (3, "third-party-cuda"), (4, "third-party-cuda"),
      (5, "third-party-cuda"), (6, "third-party-cuda")}),
    ("import os\nos.environ['NCCL_DEBUG'] = 'INFO'\n", {(2, "nccl-env")}),
    ("import torch\nb = torch.ops.detops.roi_align(x, r)\ny = torch.ops.aten.add.Tensor(x, x)\n", {(2, "custom-op")}),
    ("import torch\ntorch.set_default_tensor_type('torch.cuda.HalfTensor')\n", {(2, "cuda-tensor-type")}),
    ("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0,1'\n", {(2, "cuda-env")}),
    ("import torch\ndef f(x):\n    return x.float() if x.is_cuda else x\n", {(3, "is-cuda")}),
    ("import torch.distributed as dist\ndist.init_process_group(backend=dist.Backend.NCCL)\n", {(2, "nccl-backend")}),
    # user code that shadows or merely shares a name
    ("def cuda():\n    pass\ncuda()\n", set()),
    ("import torch\ndef f(torch):\n    torch.cuda.synchronize()\n", set()),
    ("import torch\nclass A:\n    def synchronize(self):\n        pass\nA().synchronize()\n", set()),
    ("from mylib import cuda\ncuda.synchronize()\n", set()),
    ("try:\n    from apex import amp\nexcept ImportError:\n    amp = None\nif amp:\n    amp.scale_loss(1, 2)\n",
     {(2, "apex-import"), (6, "apex-amp")}),
])
def test_import_and_alias_resolution(tmp_path, source, expected):
    assert _pairs(_scan_text(tmp_path, source)) == expected


def _line_of(path: Path, text: str) -> int:
    [line] = [i for i, l in enumerate(path.read_text().splitlines(), 1) if text in l]
    return line


def test_porting_idioms_found_with_honest_severity_and_nothing_else():
    """Formatted device strings, kwargs dicts, pin_memory(), version/NCCL probes are found; a
    comparison is info; TVM targets, log messages and dict keys are not findings."""
    path = STATIC / "port_idioms.py"
    at = functools.partial(_line_of, path)
    expected = {
        (at('add_argument("--device"'), "cuda-device", "error"),         # read by .to(args.device)
        (at('return "cuda" if'), "cuda-device", "error"),                 # pick_device() -> .to(...)
        (at('return "cuda" if'), "cuda-is-available", "warning"),
        (at('cuda_kwargs = {'), "pin-memory", "warning"),                 # reaches DataLoader via .update + **
        (at("train = tud.DataLoader"), "drop-last", "info"),
        (at("extra = dict(pin_memory=True"), "pin-memory", "warning"),    # dict(...) passed as **extra
        (at("torch.cuda.set_device(gpu)"), "cuda-set-device", "error"),
        (at('torch.device("cuda:{}".format(gpu))'), "cuda-device", "error"),
        (at('torch.device(f"cuda:{gpu + 1}")'), "cuda-device", "error"),
        (at('device="cuda:%d" % gpu'), "cuda-device", "error"),
        (at("dist.is_nccl_available()"), "nccl-available", "warning"),
        (at('dist.init_process_group("nccl")'), "nccl-backend", "error"),
        (at("torch.cuda.nccl.version()"), "nccl-api", "error"),
        (at("torch.cuda.nccl.version()"), "cuda-version", "warning"),     # torch.version.cuda on the same line
        (at("x.pin_memory()"), "pin-memory", "warning"),
        (at('x.device.type == "cuda"'), "cuda-device-check", "info"),
        (at('x.device.type == "cuda"'), "is-cuda", "info"),
    }
    findings = scan_paths([path])
    assert {(f.line, f.rule, f.severity) for f in findings} == expected
    by = {(f.line, f.rule): f for f in findings}
    assert by[(at("cuda_kwargs = {"), "pin-memory")].api == \
        f"torch.utils.data.DataLoader(**kwargs) on line {at('train = tud.DataLoader')}"
    assert "is_hccl_available" in by[(at("dist.is_nccl_available()"), "nccl-available")].replacement
    assert "torch.version.cann" in by[(at("torch.cuda.nccl.version()"), "cuda-version")].replacement
    assert "hccl" in by[(at("torch.cuda.nccl.version()"), "nccl-api")].replacement
    line = at('device="cuda:%d" % gpu')
    assert by[(line, "cuda-device")].column == path.read_text().splitlines()[line - 1].index('"cuda:%d"') + 1


@pytest.mark.parametrize("source, expected", [
    # formatted device strings, in every place a device is read
    ("import torch\nd = torch.device('cuda:{}'.format(0))\n", {(2, "cuda-device", "error")}),
    ("import torch as t\nr = 1\nd = t.device(f'cuda:{r}')\n", {(3, "cuda-device", "error")}),
    ("from torch import device as D\nd = D('cuda:%d' % 3)\n", {(2, "cuda-device", "error")}),
    ("import torch\nx = torch.ones(1).to('cuda:' + str(2))\n", {(2, "cuda-device", "error")}),
    ("import torch\nsd = torch.load('m.pt', map_location='cuda:{}'.format(1))\n", {(2, "cuda-load", "error")}),
    ("import torch\nloc = 'cuda:{}'.format(1)\nsd = torch.load('m.pt', map_location=loc)\n",
     {(2, "cuda-device", "error")}),
    ("i = 0\ndev = f'cuda:{i}'\nmodel.to(dev)\n", {(2, "cuda-device", "error")}),
    # ... through a parameter default, a call of a local function, a return value, a class attribute
    ("def train(model, where='cuda'):\n    return model.to(where)\n", {(1, "cuda-device", "error")}),
    ("def train(model, where):\n    return model.to(where)\ntrain(None, 'cuda:1')\n", {(3, "cuda-device", "error")}),
    ("def where():\n    return 'cuda'\nm = model.to(where())\n", {(2, "cuda-device", "error")}),
    ("import torch\nclass Cfg:\n    run_on = 'cuda'\nx = torch.zeros(1, device=Cfg.run_on)\n",
     {(3, "cuda-device", "error")}),
    ("import torch\nclass Net(torch.nn.Module):\n    def __init__(self, where):\n        super().__init__()\n"
     "        self.lin = torch.nn.Linear(2, 2).to(where)\nnet = Net('cuda' if torch.cuda.is_available() else 'cpu')\n",
     {(6, "cuda-device", "error"), (6, "cuda-is-available", "warning")}),
    # ... or a setting named like a device, read in another module
    ("DEVICE = 'cuda:1'\n", {(1, "cuda-device", "error")}),
    ("class Config:\n    default_device: str = 'cuda'\n", {(2, "cuda-device", "error")}),
    # comparisons are info; x.is_cuda too
    ("import torch\nx = torch.ones(1)\nif x.device.type == 'cuda':\n    pass\n", {(3, "cuda-device-check", "info")}),
    ("def f(d):\n    return 'cuda' in str(d) or d.startswith('cuda:0')\n",
     {(2, "cuda-device-check", "info")}),
    ("def f(x):\n    return x.is_cuda\n", {(2, "is-cuda", "info")}),
    ("import torch.distributed as dist\nif dist.get_backend() == 'nccl':\n    pass\nb = 'nccl'\n",
     {(2, "nccl-backend-check", "info"), (4, "nccl-backend", "error")}),
    ("def f(kind):\n    match kind:\n        case 'cuda':\n            return 1\n", {(3, "cuda-device-check", "info")}),
    ("import torch\ndef on_gpu(x):\n    return x.device == torch.device('cuda:0')\n", {(3, "cuda-device-check", "info")}),
    # not a device: TVM targets, log and print text, dict keys, a variable only a non-torch API reads
    ("import tvm\nt = tvm.target.Target('cuda')\nlib = tvm.build(None, target='cuda')\ndev = tvm.cuda(0)\n", set()),
    ("import tvm\ntarget = 'cuda'\nlib = tvm.build(None, target=target)\n", set()),
    ("import logging\nlogging.info('cuda')\nrank = 0\nprint(f'cuda:{rank}')\nprint('cuda:{}'.format(rank))\n", set()),
    ("timings = {'cuda': 1.0}\ntimings['cuda'] += 1\nbackend_names = {'gpu': 'cuda'}\n", set()),
    ("import os\nflavour = os.environ.get('FLAVOUR', 'cuda')\nprint(flavour)\n", set()),
    # pin_memory in a kwargs dict, found at the entry; silent where it is off or never reaches a DataLoader
    ("import torch\nkw = {'num_workers': 4, 'pin_memory': True}\nl = torch.utils.data.DataLoader([1], drop_last=True, **kw)\n",
     {(2, "pin-memory", "warning")}),
    ("import torch\nkw = {'pin_memory': True} if torch.cuda.is_available() else {}\n"
     "l = torch.utils.data.DataLoader([1], drop_last=True, **kw)\n",
     {(2, "pin-memory", "warning"), (2, "cuda-is-available", "warning")}),
    ("from torch.utils.data import DataLoader\nkw = dict(batch_size=8)\nkw['pin_memory'] = True\n"
     "l = DataLoader([1], **kw)\n", {(3, "pin-memory", "warning"), (4, "drop-last", "info")}),
    ("from torch.utils.data import DataLoader\nl = DataLoader([1], **dict(pin_memory=True, drop_last=True))\n",
     {(2, "pin-memory", "warning")}),
    ("from torch.utils.data import DataLoader\nkw = {'pin_memory': False, 'drop_last': True}\nl = DataLoader([1], **kw)\n",
     set()),
    ("settings = {'pin_memory': True}\nprint(settings)\n", set()),
    # drop_last: found in a followed dict, silent when the **kwargs cannot be followed
    ("import torch\ndef make(ds, **kw):\n    return torch.utils.data.DataLoader(ds, **kw)\n", set()),
    # tensor.pin_memory()
    ("import torch\nx = torch.ones(2).pin_memory()\n", {(2, "pin-memory", "warning")}),
    ("from mylib import pin_memory\nx = pin_memory([1])\n", set()),
    # version and NCCL probes, with aliases
    ("import torch as t\nif t.version.cuda:\n    pass\n", {(2, "cuda-version", "warning")}),
    ("from torch import version\nv = version.cuda\n", {(2, "cuda-version", "warning")}),
    ("import mylib\nv = mylib.version.cuda\n", set()),
    ("from torch.distributed import is_nccl_available\nok = is_nccl_available()\n",
     {(2, "nccl-available", "warning")}),
    ("from torch.cuda import nccl\nnccl.all_reduce([])\n", {(2, "nccl-api", "error")}),
])
def test_device_string_flow_and_new_rules(tmp_path, source, expected):
    assert {(f.line, f.rule, f.severity) for f in _scan_text(tmp_path, source)} == expected


def test_device_flow_is_data(tmp_path):
    """What reads a device is the rules file's device_flow section: make `target=` one and the
    TVM target is found; drop `to` and a variable read only by .to() is not."""
    source = "import tvm\nt = 'cuda'\nlib = tvm.build(None, target=t)\nx = model.to(f'cuda:{0}')\n"
    assert {(h.line, h.rule.id) for h in scan_source(source)} == {(4, "cuda-device")}
    data = yaml.safe_load(RULES_FILE.read_text())
    data["device_flow"]["kwargs"].append("target")
    data["device_flow"]["methods"].remove("to")
    custom = tmp_path / "rules.yaml"
    custom.write_text(yaml.safe_dump(data))
    rules = load_rules(str(custom))
    assert {(h.line, h.rule.id) for h in scan_source(source, rules=rules)} == {(2, "cuda-device"), (4, "cuda-device")}
    assert {(h.line, h.rule.id) for h in scan_source("w = 'cuda'\nm = model.to(w)\n", rules=rules)} == set()
    data["rules"][0]["flows"] = ["somewhere"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="flows"):
        load_rules(str(broken))


def test_multiline_call_is_reported_on_the_line_python_reports_at_run_time(tmp_path):
    """The run-time remapper sees f_lineno: the attribute's line for method calls."""
    source = "import torch\nmodel = (torch.nn.Linear(2, 2)\n         .cuda())\nloader = torch.utils.data.DataLoader(\n    [1],\n    pin_memory=True,\n    drop_last=True)\n"
    assert _pairs(_scan_text(tmp_path, source)) == {(3, "cuda-call"), (4, "pin-memory")}
    # and really: run the equivalent and read f_lineno at the call
    import sys
    seen = []

    class Probe:
        def cuda(self):
            seen.append(sys._getframe(1).f_lineno)
    exec(compile("model = (Probe()\n  .cuda())\n", "probe", "exec"), {"Probe": Probe})
    assert seen == [2]


def test_syntax_error_is_a_finding_and_the_scan_goes_on(tmp_path):
    (tmp_path / "broken.py").write_text("import torch\n\ndef main()\n    torch.cuda.synchronize()\n")
    (tmp_path / "ok.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tmp_path / "py2.py").write_text("import torch\nprint 'cuda'\n")
    findings = scan_paths([tmp_path])
    by_file = {(Path(f.file).name, f.rule) for f in findings}
    assert by_file == {("broken.py", "parse-error"), ("ok.py", "cuda-synchronize"), ("py2.py", "parse-error")}
    broken = next(f for f in findings if f.file.endswith("broken.py"))
    assert broken.line == 3 and "parse" in broken.message


def test_declared_source_encoding_gives_character_columns(tmp_path):
    path = tmp_path / "legacy.py"
    path.write_bytes("# -*- coding: latin-1 -*-\nimport torch\ns = 'caf\xe9'; torch.cuda.synchronize()\n".encode("latin-1"))
    [finding] = scan_paths([path])
    assert (finding.line, finding.column, finding.rule) == (3, 15, "cuda-synchronize")
    assert finding.snippet == "s = 'caf\xe9'; torch.cuda.synchronize()"


def test_cuda_sources_and_custom_op_registrations():
    findings = scan_paths([STATIC / "csrc", STATIC / "setup.py"])
    ops = sorted(f.api for f in findings if f.rule == "custom-op")
    assert ops == ["TORCH_EXTENSION_NAME.roi_align_forward", "detops::nms", "detops::roi_align"]
    cu = [f for f in findings if f.rule == "cuda-source"]
    assert len(cu) == 1 and "roi_align_forward_kernel" in cu[0].message and "roi_align_backward_kernel" in cu[0].message
    cpp = (STATIC / "csrc" / "roi_align.cpp").read_text().splitlines()
    for f in findings:
        if f.rule == "custom-op":
            assert f.api.split("::")[-1].split(".")[-1] in cpp[f.line - 1]
    assert {(f.line, f.rule) for f in findings if f.file.endswith("setup.py")} == {(8, "cuda-extension")}


def test_directory_scan_skips_virtualenvs_and_reports_relative_paths(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / ".venv" / "lib").mkdir(parents=True)
    (proj / "src" / "a.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (proj / ".venv" / "lib" / "b.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    monkeypatch.chdir(tmp_path)
    findings = scan_paths([Path("proj")])
    assert [(f.file, f.line) for f in findings] == [(str(Path("proj/src/a.py")), 2)]


def test_generated_project_of_60_files(tmp_path):
    """A 60-file project: every file's CUDA uses are found (the benchmark times the same thing)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("static_scan_speed", HERE.parent / "bench" / "static_scan_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    root = bench.make_project(tmp_path / "proj", n_files=60)
    findings = scan_paths([root])
    per_file = {}
    for f in findings:
        per_file.setdefault(Path(f.file).name, set()).add(f.rule)
    gpu_files = [p for p in root.rglob("train_*.py")]
    assert len(list(root.rglob("*.py"))) >= 60 and len(gpu_files) == 45
    expected = {"apex-import", "cuda-set-device", "nccl-backend", "cudnn-flags", "cuda-device", "pin-memory",
                "drop-last", "cuda-call", "cuda-amp-gradscaler", "cuda-amp-autocast", "cuda-synchronize",
                "cuda-memory"}
    assert all(per_file.get(p.name) == expected for p in gpu_files)
    assert set(per_file) == {p.name for p in gpu_files}


def test_rules_are_data(tmp_path):
    """A new API is found by adding a rule to the yaml, without touching code."""
    data = yaml.safe_load(RULES_FILE.read_text())
    data["rules"].insert(0, {"id": "my-rule", "names": ["torch.cuda.jiterator._create_jit_fn"],
                             "severity": "error", "message": "{name}", "replacement": "compose torch ops"})
    custom = tmp_path / "rules.yaml"
    custom.write_text(yaml.safe_dump(data))
    hits = scan_source("import torch\nfn = torch.cuda.jiterator._create_jit_fn('x')\n", rules=load_rules(str(custom)))
    assert [(h.line, h.rule.id, h.message) for h in hits] == [(2, "my-rule", "torch.cuda.jiterator._create_jit_fn")]


def test_rule_ids_cover_every_runtime_remap_id():
    remaps = yaml.safe_load((HERE.parent / "support_matrix" / "runtime_remaps.yaml").read_text())["rules"]
    remap_source = (HERE.parent / "opscope" / "capture" / "remap.py").read_text()
    recorded = set(re.findall(r'(?:record|rec)\("([a-z0-9-]+)"', remap_source))
    runtime_ids = set(remaps) | recorded
    assert recorded and recorded <= set(remaps)   # every id the remapper records is described
    # notes on what the scan itself did (a device-generic API, compile made a no-op, a library's own
    # CUDA calls answered by the stand-in, a call that needed the real CUDA runtime, the script's own
    # profiler made a stand-in, a GPU-only library stood in, or missing where nothing stands in): no CUDA API
    # in the script to find
    runtime_only = {"accelerator-api", "torch-compile", "framework-cuda", "cuda-runtime", "script-profiler",
                    "library-stand-in", "library-fallback"}
    yaml_ids = {r.id for r in load_rules().rules}
    assert runtime_only <= set(remaps) and not runtime_only & yaml_ids
    assert runtime_ids - runtime_only <= yaml_ids
    for rule in load_rules().rules:
        assert rule.severity in ("error", "warning", "info")
        assert rule.names or rule.methods or rule.attributes or rule.strings or rule.imports or rule.files or rule.cpp


def test_merge_static_and_runtime_findings():
    static = scan_paths([SCRIPTS / "gpu_style_train.py"])
    for f in static:
        f.file = "gpu_style_train.py"  # the scan command makes paths relative to the script folder
    runtime = [
        Finding(rule="cuda-synchronize", file="gpu_style_train.py", line=38, api="torch.cuda.synchronize()",
                message="torch.cuda.synchronize(); remapped to CPU", replacement="`torch.npu.synchronize()`",
                origin="runtime", count=8),
        Finding(rule="cuda-call", file="gpu_style_train.py", line=30, api="Tensor.cuda()", message="x",
                origin="runtime", count=8),
        Finding(rule="cuda-load", file="helpers.py", line=3, api="torch.load", message="y", origin="runtime"),
    ]
    merged = merge_findings(runtime, static)
    keys = [(f.rule, f.file, f.line) for f in merged]
    assert len(keys) == len(set(keys)) == len(static) + 1
    sync = next(f for f in merged if f.rule == "cuda-synchronize")
    assert sync.origin == "static+runtime" and sync.count == 9 and sync.column and sync.snippet
    assert "torch_npu.npu.synchronize" in sync.replacement
    assert next(f for f in merged if f.rule == "cuda-load").origin == "runtime"
    result = ScanResult(findings=merged)
    again = ScanResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert [f.to_dict() for f in again.findings] == [f.to_dict() for f in merged]
    assert merge_findings(merged, []) == merged


def test_sarif_output(tmp_path):
    findings = scan_paths([STATIC / "ddp_train.py"]) + [Finding(rule="parse-error", file="x.py", line=3,
                                                                 api="(file)", message="could not parse")]
    path = write_sarif(findings, tmp_path / "out" / "findings.sarif")
    log = json.loads(path.read_text())
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert len({r["id"] for r in rules}) == len(rules)
    assert len(run["results"]) == len(findings)
    for result, finding in zip(run["results"], findings):
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == finding.rule
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] == finding.line
        assert result["level"] in ("error", "warning", "note")
    sync = next(r for r in run["results"] if r["ruleId"] == "cuda-synchronize")
    assert "torch_npu.npu.synchronize()" in sync["message"]["text"]
    assert to_sarif([])["runs"][0]["results"] == []


def test_findings_table_prints(tmp_path):
    from rich.console import Console
    from opscope.report.findings_table import print_findings
    console = Console(record=True, width=200)
    print_findings(scan_paths([STATIC / "ddp_train.py"]), console)
    text = console.export_text()
    assert "cuda-synchronize" in text and "ddp_train.py:88" in text
    console = Console(record=True)
    print_findings([], console)
    assert "No CUDA-specific API" in console.export_text()


def test_fixture_scripts_are_valid_python():
    for path in STATIC.glob("*.py"):
        ast.parse(path.read_text())


def _opscope(*args, cwd):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_static_only_cli_on_a_generated_project(tmp_path):
    """`opscope scan --static-only DIR` (wired by the scan command) runs nothing and writes findings + SARIF."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("static_scan_speed", HERE.parent / "bench" / "static_scan_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.make_project(tmp_path / "proj", n_files=60)
    proc = _opscope("scan", "--static-only", "proj", "--out", "out", "--format", "sarif", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert len(findings) == 45 * 14 and all(f["file"].startswith("proj/") for f in findings)
    sarif = json.loads((tmp_path / "out" / "findings.sarif").read_text())
    assert len(sarif["runs"][0]["results"]) == len(findings)
    assert not (tmp_path / "out" / "scan.json").exists()  # nothing was run


def test_full_scan_merges_static_and_runtime_findings(tmp_path):
    """A real scan of a GPU-style script on the CPU: one finding per place, both origins recorded."""
    proc = _opscope("scan", SCRIPTS / "gpu_style_train.py", "--steps", "2", "--out", tmp_path / "run", "--quiet",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = ScanResult.from_dict(json.loads((tmp_path / "run" / "scan.json").read_text()))
    keys = [(f.rule, f.file, f.line) for f in result.findings]
    assert len(keys) == len(set(keys))
    by = {(f.rule, f.line): f for f in result.findings}
    for rule, line in [("cuda-synchronize", 38), ("cuda-call", 30), ("pin-memory", 22), ("cuda-amp-autocast", 32)]:
        assert by[(rule, line)].origin == "static+runtime", (rule, line)
        assert by[(rule, line)].snippet and by[(rule, line)].column
    assert by[("cuda-device", 23)].origin == "static"     # torch.device('cuda:0'): no torch call to remap


@pytest.mark.parametrize("jobs", [1, 2])
def test_static_scan_reports_progress_in_and_out_of_worker_processes(tmp_path, jobs):
    from opscope.analysis.static.scan import PARALLEL_MIN_FILES, scan_paths
    for i in range(PARALLEL_MIN_FILES + 10):
        (tmp_path / f"m{i}.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    calls = []
    findings = scan_paths([tmp_path], jobs=jobs, progress=lambda done, total: calls.append((done, total)))
    total = PARALLEL_MIN_FILES + 10
    assert len(findings) >= total
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_static_only_does_not_follow_links_out_of_the_folder_or_read_fifos(tmp_path):
    import os
    from opscope.analysis.static.scan import scan_paths
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("x = torch.ones(1).cuda()\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
    (project / "link.py").symlink_to(outside / "secret.py")
    (project / "loop").symlink_to(project)        # a folder link back into itself
    os.mkfifo(project / "pipe.py")                 # reading it would block forever
    files = {f.file.replace(os.sep, "/").rsplit("/", 1)[-1] for f in scan_paths([project], jobs=1)}
    assert files == {"train.py"}


def test_rules_file_is_read_through_its_declared_schema(tmp_path):
    """A misspelt top-level key of a rules file is an error that names it (knowledge.py's schema),
    not a section silently ignored, and a wrongly typed section is one too."""
    from opscope.errors import InputError
    data = yaml.safe_load(RULES_FILE.read_text())
    data["device_flows"] = data.pop("device_flow")
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="unknown key 'device_flows' \\(did you mean 'device_flow'\\?\\)"):
        load_rules(str(misspelt))
    data["device_flow"] = data.pop("device_flows")
    data["rules"] = {"cuda-call": data["rules"][0]}
    mistyped = tmp_path / "mistyped.yaml"
    mistyped.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="'rules' is a dict, expected a list"):
        load_rules(str(mistyped))
