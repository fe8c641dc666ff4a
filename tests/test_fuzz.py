"""Property-based fuzzing: mutated real inputs through `opscope diff` and `opscope report`.

The seeds are real artefacts (a torch.profiler trace, .json.gz and text table made here,
a window of the shared Ascend NPU profile, the scan.json of examples/train_cnn.py) and
the mutators are bench/fuzz.py's (truncation, byte flips, junk, JSON values swapped for
wrong types, 1e400, 400-digit integers, deep nesting, ANSI escapes, absurd counts).
Every case must exit 0 or 2 with one ``opscope: error:`` line: never exit 70, never a
traceback, never past the per-case hang guard.  bench/fuzz.py runs >= 10,000 such cases.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 120   # a hang guard, not a speed test: a case normally takes well under a second


def _load_fuzz():
    spec = importlib.util.spec_from_file_location("opscope_bench_fuzz", ROOT / "bench" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()
MUTATIONS = st.lists(st.tuples(st.sampled_from(fuzz.OPS), st.floats(0, 1, exclude_max=True),
                               st.integers(0, 1 << 16)), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, cnn_scan):
    folder = tmp_path_factory.mktemp("fuzz_seeds")
    found = fuzz.make_torch_seeds(folder / "torch")
    ascend = fuzz.make_ascend_seed(folder / "ascend")
    if ascend is not None:
        found["ascend"] = ascend
    found["scan"] = fuzz.scan_seed_bytes(cnn_scan / "scan.json")
    return found


def test_seeds_themselves_load(seeds, tmp_path):
    """Unmutated, every seed gives exit 0: the mutations, not the seeds, make the errors."""
    for target in fuzz.TARGETS:
        if target == "ascend" and "ascend" not in seeds:
            continue
        argv = fuzz.build_case(target, seeds, [], tmp_path / target, "html,xlsx,json")
        outcome, code, err = fuzz.run_cli(argv, HANG_GUARD_S)
        assert outcome == "ok", f"{target}: exit {code}: {err[-2000:]}"


@pytest.mark.parametrize("target", fuzz.TARGETS)
def test_mutated_input_exits_cleanly(target, seeds, tmp_path):
    if target == "ascend" and "ascend" not in seeds:
        pytest.skip("../shared/data/ascend_profiles absent")

    @settings(max_examples=40, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(ops=MUTATIONS, all_formats=st.booleans())
    def check(ops, all_formats):
        argv = fuzz.build_case(target, seeds, ops, tmp_path / "case", "html,xlsx,json" if all_formats else "json")
        outcome, code, err = fuzz.run_cli(argv, HANG_GUARD_S)
        assert outcome in ("ok", "clean"), f"{outcome} (exit {code}) for {target} {ops}:\n{err[-3000:]}"

    check()


@pytest.mark.parametrize("op", sorted(set(fuzz.OPS)))
def test_each_mutator_changes_its_input(op, seeds):
    """A mutator that silently returned its input would make the fuzz test vacuous."""
    data = seeds["trace"].read_bytes()
    changed = sum(fuzz.mutate(data, op, u / 10, k) != data for u in range(10) for k in range(3))
    assert changed >= 20
