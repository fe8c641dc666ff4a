"""Every command the README shows is accepted by the CLI as written, and its examples run."""
from __future__ import annotations

import re
import shlex
import tomllib

import pytest
from conftest import ROOT

from opscope.cli import build_parser

README = (ROOT / "README.md").read_text()
# The pages README's detail moved to (docs/): their examples are checked here as README's were.
CONFIGURATION = (ROOT / "docs" / "reference" / "configuration.md").read_text()
NOTEBOOK = (ROOT / "docs" / "guides" / "notebook.md").read_text()
# placeholders in the synopses -> values a user would type
VALUES = {"SCRIPT": "train.py", "N": "3", "DIR": "out", "S": "30", "K": "1", "SCORE": "50", "ARGS": "--epochs",
          "PATH": "src", "RUN_DIR": "runs/cnn", "A": "a", "B": "b", "DEV": "cpu", "V": "2.8.0", "LIST": "0,1"}


def _commands() -> list[str]:
    found = re.findall(r"`(opscope [^`]*)`", README)
    blocks = "\n".join(re.findall(r"```(?:sh)?\n(.*?)```", README, re.S))  # the shell blocks
    found += [line for line in blocks.splitlines() if line.startswith("opscope ")]
    return list(dict.fromkeys(c.replace("\\|", "|") for c in found))


def _argv(command: str) -> list[str]:
    """'opscope scan SCRIPT [--steps N] [--device auto|cpu] -- ARGS' -> a concrete argv (first choice)."""
    words = []
    command = re.sub(r"(?<=\S)\[(\S+?)\]", r"\1", command)  # op[.Tensor]: an optional suffix, kept
    for word in shlex.split(command.replace("[", " ").replace("]", " "))[1:]:
        word = word.split("|")[0] if "|" in word else word
        words.append(VALUES.get(word, word))
    return words


def test_readme_lists_every_command():
    commands = {c.split()[1] for c in _commands() if len(c.split()) > 1}
    assert commands >= {"scan", "report", "diff", "verify", "matrix", "migrate"}


@pytest.mark.parametrize("command", [c for c in _commands() if len(c.split()) > 2])
def test_every_readme_command_parses(command):
    argv = _argv(command)
    rest = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)  # argparse exits (fails the test) on any unknown flag or value
    assert callable(args.func)
    if rest:
        assert hasattr(args, "script_args"), command


def test_readme_config_example_is_read(tmp_path, monkeypatch):
    block = re.search(r"```toml\n(.*?)```", CONFIGURATION, re.S).group(1)
    tomllib.loads(block)
    (tmp_path / "pyproject.toml").write_text(block)
    monkeypatch.chdir(tmp_path)
    from opscope import config
    parser = build_parser()
    config.apply(parser, config.find_config())
    scan = parser.parse_args(["scan", "train.py"])
    assert (scan.target, scan.steps, scan.format, scan.fail_under) == ("2.8.0", 10, ("html", "xlsx", "md"), 70.0)
    assert parser.parse_args(["report", "run"]).format == ("html",)


def test_readme_notebook_example_runs(huber_scan):
    block = next(b for b in re.findall(r"```python\n(.*?)```", NOTEBOOK, re.S) if "opscope.load(" in b)
    code = block.replace('"runs/cnn"', repr(str(huber_scan))).replace('"runs/cpu"', repr(str(huber_scan)))
    code = code.replace('"runs/npu"', repr(str(huber_scan)))
    exec(compile(code, "README.md", "exec"), {})


def test_readme_setup_is_the_one_command_ci_runs():
    setup = README.split("## Set up", 1)[1].split("##", 1)[0]
    commands = [line for line in re.findall(r"```sh\n(.*?)```", setup, re.S)[0].splitlines() if line.strip()]
    assert commands == ['pip install torch==2.13.0 -e ".[test]"']
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q torch==2.13.0 -e ".[test' in ci and "python -m pytest -q" in ci
    assert "CUDA build" in setup
