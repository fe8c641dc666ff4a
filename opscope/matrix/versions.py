"""The order of torch_npu and torch versions, below every matrix module that sorts them."""
from __future__ import annotations

from opscope.errors import UserError


def version_key(version: str):
    """Order of torch_npu/torch versions: 2.8.0 < 2.8.0.post2 < 2.8.0.post5 < 2.9.0."""
    from packaging.version import InvalidVersion, Version
    try:
        return Version(version)
    except InvalidVersion:
        raise UserError(f"not a version: {version!r}") from None
