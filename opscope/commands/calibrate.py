"""`opscope calibrate NPU_PROFILE...`: fit the NPU estimate to your own real profiles."""
from __future__ import annotations

from pathlib import Path

from opscope.commands._common import add_out

DEFAULT_FILE = "opscope-calibration.json"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit the NPU time estimate's per-chip factors to real Ascend profiles",
        description="Price every kernel of the profiles' kernel_details.csv with opscope's cost model and write, "
                    "per chip and kernel unit (cube, flash attention, vector, AI CPU), the factor that makes the "
                    f"estimate match them. Later scans and reports run in that folder use the file ({DEFAULT_FILE} "
                    "in the current folder, or --calibration FILE).")
    parser.add_argument("profiles", nargs="+", metavar="NPU_PROFILE",
                        help="Ascend profiler exports (*_ascend_pt folders, folders of ranks, kernel_details.csv)")
    parser.add_argument("--chip", default=None, help="the chip the profiles ran on (default: from their AI core count)")
    add_out(parser, default=DEFAULT_FILE, metavar="FILE", help="calibration file to write (default %(default)s)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the path written")
    parser.set_defaults(func=run)


def run(args) -> int:
    from opscope.analysis.npu.cost import fit_calibration, merge_calibration
    from opscope.errors import UserError
    from opscope.parsers.ascend_kernels import find_kernel_csvs
    paths = [p for profile in args.profiles for p in find_kernel_csvs(Path(profile))]
    if not paths:
        raise UserError(f"no kernel_details.csv under {', '.join(args.profiles)}; pass Ascend profiler exports")
    from opscope.analysis.npu.compare import chip_for
    from opscope.analysis.npu.cost import resolve_chip
    by_chip: dict[str, list[Path]] = {}   # each profile fits the chip it ran on (its AI core count)
    for csv_path in paths:
        by_chip.setdefault(resolve_chip(args.chip or chip_for(csv_path.parent))[0], []).append(csv_path)
    for chip, chip_paths in by_chip.items():
        fitted = fit_calibration(chip_paths, chip)
        path = merge_calibration(Path(args.out), fitted)
        if not args.quiet:
            for unit, entry in fitted["units"].items():
                print(f"{fitted['chip']} {unit}: x{entry['factor']:.2f} over {entry['kernels']} kernels "
                      f"(median |log2| before {entry['median_abs_log2_before']:.2f}, "
                      f"after {entry['median_abs_log2_after']:.2f})")
    print(path)
    return 0
