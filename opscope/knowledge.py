"""Shared knowledge read from ``support_matrix/`` (data, not code), loaded once.

Several stages need the same facts — capture folds backend-private kernels, the
verdict engine judges them through their parent, the diff folds them too — so the
facts live in one yaml file each and one predicate each, here.
"""
from __future__ import annotations

import fnmatch
from functools import cache, lru_cache

from opscope.resources import support_matrix_dir

# The top-level keys each knowledge file may have, and the type of each: a misspelt key
# would otherwise be silently ignored and its rules would quietly stop applying.  A new
# key (or file) is added here too; tests/test_hardening.py checks every shipped file.
SCHEMAS: dict[str, dict[str, type]] = {
    "backend_private_ops.yaml": {"patterns": list, "sources": dict, "public_ops": dict, "implements": dict},
    "cuda_api_rules.yaml": {"version": int, "device_flow": dict, "safe_npu_members": list, "rules": list,
                            "judged_by_the_run": list},
    "diff_rules.yaml": {**{k: list for k in (
        "structural", "private_ops", "phase_annotations", "step_annotations", "npu_inserted_ops",
        "npu_inserted_kernels", "fallback_children", "fallback_log_patterns", "device_processes",
        "device_kernel_categories", "launch_flow_categories", "user_cast_parents", "never_fold",
        "python_scalar_dtypes", "known_differences", "npu_kernel_name_families", "npu_inserted_kernel_types")},
        "device_task_classes": dict},
    "dtype_tests.yaml": {"warn": dict, "profiler_dtypes": dict, "opinfo_aliases": dict},
    "npu_memory.yaml": {"default": str, "chips": dict, "card_counts": list, "headroom": dict},
    "fake_mode.yaml": {"placeholders": dict, "bool_true_after": list, "bounded_sizes": dict, "factory_fake_mb": int,
                       "known_differences": dict, "known_dtype_differences": dict,
                       "optimizer_state_per_param": dict, "fused_attention": dict},
    "dynamic_shapes.yaml": {"data_dependent_ops": list, "python_to_aten": dict, "size_from_arguments": dict,
                            "suggestions": dict, "dimension_names": dict, "collate_settings": list, "collate_wrapped": list,
                            "shape_setters": dict, "loader_builders": list, "library_fixes": list},
    "substitutes.yaml": {"substitutes": dict, "namespaces": dict},
    "npu_chips.yaml": {"default": str, "sources": dict, "chips": dict, "families": dict,
                      "dtypes": dict},
    "npu_cost_model.yaml": {"version": int, "reference": dict, "dtype_bytes": dict, "dtype_aliases": dict,
                            "floors": dict, "aicpu": dict, "host": dict, "kernels": dict, "aten": dict,
                            "views": list, "transdata": dict, "aicpu_rules": dict, "alignment": dict, "fused_patterns": list,
                            "optimizers": dict, "families": dict,
                            "communication": dict, "calibration": dict, "l2": dict},
    "third_party.yaml": {"sources": dict, "fallback_rule": dict, "libraries": dict},
    "release_pairs.yaml": {"sources": dict, "branch_cann": dict, "lines": dict, "releases": dict, "companions": dict,
                           "incompatibilities": list},
    "glossary.yaml": {"terms": list},
    "runtime_remaps.yaml": {"rules": dict, "device": dict, "stand_in": dict, "torch_self_probes": list,
                            "wrappers": dict},
    "stderr_noise.yaml": {"lines": list},
    "verify_standards.yaml": {"schema": str, "msprobe": dict, "outcomes": dict, "selection": dict, "dtypes": dict,
                              "standards": dict, "accuracy_reached": dict, "index_outputs": dict, "backend_outputs": dict,
                              "skip": dict, "inputs": dict},
}


@cache
def load(name: str) -> dict:
    """One knowledge file, its top-level keys checked against ``SCHEMAS``."""
    return load_path(support_matrix_dir() / name, name)


@cache
def load_optional(name: str) -> dict:
    """``load``, or ``{}`` when the file is not shipped (an optional knowledge file)."""
    return load(name) if (support_matrix_dir() / name).is_file() else {}


def load_path(path, name: str | None = None) -> dict:
    """A knowledge yaml at ``path`` (``name`` picks its schema); bad content is an InputError (exit 2)."""
    import difflib

    import yaml

    from opscope.errors import InputError
    fix = "correct the file (support_matrix/ is data: see its comments) or reinstall opscope"
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror})", fix=fix) from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(path, f"is not valid YAML ({str(exc).splitlines()[0] if str(exc) else exc})",
                         fix=fix) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise InputError(path, f"holds a {type(data).__name__}, expected a mapping of keys", fix=fix)
    schema = SCHEMAS.get(name or "")
    if schema:
        for key, value in data.items():
            if key not in schema:
                close = difflib.get_close_matches(str(key), schema, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(schema)})"
                raise InputError(path, f"unknown key {key!r}{hint}", fix=fix)
            if value is not None and not isinstance(value, schema[key]):
                raise InputError(path, f"{key!r} is a {type(value).__name__}, expected a {schema[key].__name__}",
                                 where=str(key), fix=fix)
    return data


def backend_private_patterns() -> list[str]:
    """fnmatch patterns (without ``aten::``) of backend-private ATen kernels."""
    return list(load("backend_private_ops.yaml").get("patterns") or [])


@lru_cache(maxsize=4096)
def is_backend_private(name: str) -> str | None:
    """The matching pattern when ``aten::mkldnn_convolution`` & co. are backend-private (folded into the
    public operator around them).  A backend kernel that a run records with no public operator around it
    (``standalone`` in ``implements``: ``aten::cudnn_batch_norm_backward``, called by its autograd node) is
    not: it is recorded, and judged as the public op it implements."""
    ns, _, base = name.rpartition("::")
    if ns not in ("aten", ""):
        return None
    if (backend_kernel(name) or {}).get("standalone"):
        return None
    return next((p for p in backend_private_patterns() if fnmatch.fnmatchcase(base, p)), None)


@lru_cache(maxsize=4096)
def backend_kernel(name: str) -> dict | None:
    """The ``implements`` entry of a backend's own kernel for a public op (``backend_private_ops.yaml``),
    with ``op`` as ``aten::public_op``, ``part`` and ``backend`` always set; None for any other op."""
    ns, _, base = name.rpartition("::")
    if ns not in ("aten", ""):
        return None
    entry = (load("backend_private_ops.yaml").get("implements") or {}).get(base)
    if not isinstance(entry, dict) or not entry.get("op"):
        return None
    return {**entry, "op": f"aten::{entry['op']}", "part": str(entry.get("part") or "forward"),
            "backend": str(entry.get("backend") or "a backend's own kernel"), "kernel": f"aten::{base}"}


def kernel_public_op(kernel: dict, scalars) -> str:
    """The public op of one recorded call of a backend kernel (``backend_kernel``): ``by_mode`` picks it by an
    argument (cuDNN's RNN mode: ``gru`` for 3), else the entry's ``op``."""
    by_mode = kernel.get("by_mode") or {}
    values = list(scalars or [])
    arg = by_mode.get("arg")
    mode = values[arg] if isinstance(arg, int) and arg < len(values) else None
    picked = (by_mode.get("ops") or {}).get(mode) if isinstance(mode, int) and not isinstance(mode, bool) else None
    return f"aten::{picked}" if picked else str(kernel["op"])


def implemented_public_op(name: str) -> tuple[str, str] | None:
    """``(aten::public_op, part)`` when ``name`` is a backend's own kernel for that public op
    (``aten::_scaled_dot_product_flash_attention_for_cpu_backward`` -> SDPA, ``backward``)."""
    entry = backend_kernel(name)
    return (entry["op"], entry["part"]) if entry else None


def public_op_note(public: str) -> str | None:
    """How torch_npu runs ``public`` (``aten::scaled_dot_product_attention``), when the data says."""
    text = (load("backend_private_ops.yaml").get("public_ops") or {}).get(public.rpartition("::")[2])
    return str(text) if text else None


def is_private_kernel(name: str) -> bool:
    """Backend-private (folded) or a backend's own kernel for a public op: never an NPU decomposition step."""
    return bool(is_backend_private(name) or implemented_public_op(name))
