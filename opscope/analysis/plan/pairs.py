"""The facts of ``support_matrix/release_pairs.yaml``: what each torch_npu release pairs with (torch, Python,
CANN) and the companion packages built for each torch (torchvision 0.21.* for torch 2.6).  Read by the release
plan and by the environment check, so that neither needs the other.
"""
from __future__ import annotations

from opscope.knowledge import load_optional

PAIRS_FILE = "release_pairs.yaml"


def pairs() -> dict:
    return load_optional(PAIRS_FILE)


def companion_version(package: str, torch: str | None) -> str | None:
    """The release of ``package`` that pairs with ``torch`` (``torchvision`` 0.21.* for torch 2.6.0)."""
    if not torch:
        return None
    rule = ((pairs().get("companions") or {}).get(package)) or {}
    parts = torch.split("+")[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    if "minor_offset" in rule and parts[0] == "2":
        return f"0.{int(parts[1]) + int(rule['minor_offset'])}.*"
    if rule.get("same_version"):
        return ".".join(parts[:3])
    return None
