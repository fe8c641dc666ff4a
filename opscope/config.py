"""Project defaults for the CLI, read like coverage.py and ruff read theirs.

opscope looks in the current folder and its parents for ``.opscope.toml`` (keys at the top
level, or under ``[tool.opscope]``) or a ``pyproject.toml`` with a ``[tool.opscope]`` table;
the first folder that has one wins.  Keys are option names (``target``, ``steps``,
``format``/``formats``, ``fail-under``, ``device``, ``out``, ...) and become that option's default
for every command that has it; a sub-table (``[tool.opscope.scan]``) applies to one command
and wins over the shared keys.  Options given on the command line always win.

    [tool.opscope]
    target = "2.8.0"
    steps = 10
    formats = ["html", "xlsx", "md"]
    fail-under = 70
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

ALIASES = {"formats": "format"}


@dataclass
class Config:
    path: Path | None = None
    shared: dict = field(default_factory=dict)
    commands: dict = field(default_factory=dict)

    def for_command(self, command: str) -> dict:
        return {**self.shared, **self.commands.get(command, {})}


def _load_toml(path: Path) -> dict:
    import tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        from opscope.errors import UserError
        raise UserError(f"cannot read {path}: {exc}; fix or remove it") from None


def _normalise(table: dict) -> dict:
    out = {}
    for key, value in table.items():
        key = ALIASES.get(key, key).replace("-", "_")
        if key == "format" and isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out[key] = value
    return out


def find_config(start: Path | None = None) -> Config:
    """The nearest .opscope.toml or pyproject.toml [tool.opscope], from ``start`` (cwd) upwards."""
    folder = Path(start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        own = candidate / ".opscope.toml"
        if own.is_file():
            data = _load_toml(own)
            table = (data.get("tool") or {}).get("opscope", data)
            return _split(own, table)
        project = candidate / "pyproject.toml"
        if project.is_file():
            table = (_load_toml(project).get("tool") or {}).get("opscope")
            if table is not None:
                return _split(project, table)
    return Config()


def _split(path: Path, table: dict) -> Config:
    shared = {k: v for k, v in table.items() if not isinstance(v, dict)}
    commands = {k: _normalise(v) for k, v in table.items() if isinstance(v, dict) and k != "tool"}
    return Config(path=path, shared=_normalise(shared), commands=commands)


def apply(parser, config: Config) -> None:
    """Make the config's values the defaults of every (sub-)command parser that has the option."""
    if config.path is None:
        return
    import logging
    logging.getLogger("opscope").info("defaults from %s", config.path)
    from opscope.commands._common import leaf_parsers
    used = set()
    for sub in leaf_parsers(parser):
        command = sub.prog.split()[1] if len(sub.prog.split()) > 1 else ""
        dests = {a.dest for a in sub._actions if a.option_strings}
        values = {k: v for k, v in config.for_command(command).items() if k in dests}
        # a number given for a string-typed option is still parsed as text
        values = {k: (str(v) if not isinstance(v, (str, bool)) else v) for k, v in values.items()}
        if values:
            sub.set_defaults(**values)
            used |= set(values)
    unknown = (set(config.shared) | {k for table in config.commands.values() for k in table}) - used
    if unknown:
        print(f"opscope: warning: {config.path}: no command has the option(s) "
              f"{', '.join(sorted(k.replace('_', '-') for k in unknown))}; ignored", file=sys.stderr)
