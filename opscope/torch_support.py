"""Which builds of torch opscope runs on, said before a scan starts rather than as a traceback inside it.

The range is what CI runs: the oldest release below, the CPU wheel and a CUDA wheel of the current ones
(.ci/run).  Read from the installed package's metadata, so the check costs no torch import.
"""
from __future__ import annotations

import re
from importlib import metadata

from opscope.errors import UserError

OLDEST = (2, 4)
SUPPORTED = "torch 2.4 or newer (2.x), CPU or CUDA build"


def installed_torch() -> str | None:
    """The installed torch's version string (``2.14.1``, ``2.13.0+cpu``), None when it is not installed."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def check_installed_torch(version: str | None = None) -> None:
    """A one-line UserError for a torch opscope cannot scan with: missing, too old, or not 2.x."""
    version = installed_torch() if version is None else version
    if version is None:
        raise UserError(f"torch is not installed in this Python environment; install {SUPPORTED} "
                        "(e.g. `pip install torch`) next to opscope")
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return   # a source build with an odd version string: let the scan try
    major_minor = (int(m.group(1)), int(m.group(2)))
    if major_minor < OLDEST or major_minor[0] != OLDEST[0]:
        raise UserError(f"torch {version} is outside the range opscope supports ({SUPPORTED}); install a "
                        f"supported torch in this environment, e.g. `pip install \"torch>={OLDEST[0]}.{OLDEST[1]},<3\"`")


def check_stand_in_build(version: str, hip: str | None) -> None:
    """The CPU stand-in for CUDA knows the CPU and CUDA builds only: a ROCm build gets one line, not a guess."""
    if hip:
        raise UserError(f"torch {version} is a ROCm build (HIP {hip}): opscope's CPU stand-in for CUDA supports "
                        f"{SUPPORTED}; scan on the AMD GPU itself (--device cuda), or install the CPU build of "
                        "torch in another environment for this scan")
