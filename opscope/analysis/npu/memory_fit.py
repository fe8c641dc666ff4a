"""Memory fit: the peak device memory of a training step, what it is made of, and the NPU cards it needs.

Input is the capture's tensor-lifetime record (``--mode fake``: every fake storage from its
creation to its release, classed as parameters, gradients, optimizer state or activations;
``fake_mode.MemoryTracker``).  The peak is measured, in the captured precision; the
per-card figures for data parallel with optimizer-state sharding (ZeRO-1/2/3 style) and
for tensor parallel of N are the usual first-order splits of those four parts:

* data parallel, ZeRO-1: params + grads + optimizer state / N + activations
* data parallel, ZeRO-2: params + (grads + optimizer state) / N + activations
* data parallel, ZeRO-3: (params + grads + optimizer state) / N + activations
* tensor parallel N: (params + grads + optimizer state + activations) / N  (an estimate: norms
  and embeddings are not always split)

Card capacity is data (``npu_chips.yaml`` ``hbm_gib``).  Not all of it holds tensors: the runtime keeps a
share of each card and, on more than one card, HCCL keeps its buffers per communicator; both are data with
their basis (``npu_memory.yaml`` ``headroom``), taken off before the fit is judged and stated with it.
"""
from __future__ import annotations

import dataclasses

from opscope.knowledge import load
from opscope.model import LayoutFit, MemoryFit, MemoryHeadroom, MemoryParts

PARTS = ("parameters", "gradients", "optimizer_state", "activations")
FAKE_BASIS = "fake-tensor storage lifetimes (device tensors only; host-side data batches not counted)"
REAL_BASIS = ("the allocator's events of each captured step from its first forward (real tensors; data made "
              "before that forward, such as the step's batch, not counted)")
GIB = 2 ** 30
LAYOUT_NAMES = {"zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "tensor_parallel": "tensor parallel"}


def _chips() -> dict:
    """The chip table: ``npu_chips.yaml`` (the NPU estimate's, with ``hbm_gib`` per chip) where it exists,
    else this fit's own ``npu_memory.yaml``."""
    from opscope.resources import support_matrix_dir
    if (support_matrix_dir() / "npu_chips.yaml").is_file():
        data = load("npu_chips.yaml")
        if any("hbm_gib" in (spec or {}) for spec in (data.get("chips") or {}).values()):
            return data
    return load("npu_memory.yaml")


def chip(name: str | None = None) -> dict:
    """Capacity of chip ``name`` (the table's default when None or unknown to the table)."""
    data = _chips()
    chips = data.get("chips") or {}
    if name not in chips:
        name = data.get("default") or next(iter(chips))
    spec = chips[name]
    return {"name": name, "capacity_bytes": int(float(spec["hbm_gib"]) * GIB), "hbm_gib": spec["hbm_gib"]}


def memory_fit(memory: dict, chip_name: str | None = None, basis: str = FAKE_BASIS) -> MemoryFit | None:
    """The fit of a capture's memory record (``{"steps": [...]}``), or None when nothing was tracked."""
    steps = [s for s in (memory or {}).get("steps") or [] if s.get("bytes")]
    if not steps:
        return None
    peak = max(steps, key=lambda s: s["bytes"])
    parts = {p: 0 for p in PARTS}
    for s in steps:   # persistent parts at their largest: as they stand between steps (the optimizer
        #               update's temporaries are gone), gradients also at the peak (set_to_none frees them)
        end, at_peak = s.get("end_breakdown") or {}, s.get("breakdown") or {}
        for p in ("parameters", "optimizer_state"):
            parts[p] = max(parts[p], int(end.get(p, 0)))
        parts["gradients"] = max(parts["gradients"], int(end.get("gradients", 0)), int(at_peak.get("gradients", 0)))
    parts["activations"] = max(0, int(peak["bytes"]) - sum(int((peak.get("breakdown") or {}).get(p, 0))
                                                          for p in ("parameters", "gradients", "optimizer_state")))
    # the measured peak; what a step holds at its end is a floor under it (the parts are each at their largest,
    # not at one moment: their sum would count gradients a step had freed before its peak)
    peak_bytes = max(int(peak["bytes"]), max(int(s.get("end_bytes") or 0) for s in steps))
    return MemoryFit(**_cards(MemoryParts(**parts), peak_bytes, chip_name),
                     peak_step=peak.get("step"), peak_phase=peak.get("phase"), peak_where=peak.get("where"),
                     peak_module=peak.get("module"), peak_autograd_node=peak.get("autograd_node"), basis=basis)


def for_chip(fit: MemoryFit, chip_name: str) -> MemoryFit:
    """A stored fit judged again for another chip's memory (``opscope report RUN_DIR --chip C``): the same
    parts and peak, that chip's capacity and card counts."""
    return dataclasses.replace(fit, **_cards(fit.parts, fit.peak_bytes, chip_name))


def headroom() -> MemoryHeadroom:
    """Bytes a card keeps from the job's tensors: the runtime's share, and HCCL's buffers on more than one card."""
    data = load("npu_memory.yaml").get("headroom") or {}
    runtime = int(float(data.get("runtime_gib") or 0) * GIB)
    hccl = int(float(data.get("hccl_buffsize_mb") or 0) * 2**20 * int(data.get("hccl_buffers_per_communicator") or 0)
               * int(data.get("communicators") or 0))
    text = (f"{size_text(runtime)} per card for the runtime ({data.get('runtime_source') or 'assumption'}), "
            f"and on more than one card {size_text(hccl)} of HCCL buffers ({data.get('hccl_buffers_per_communicator')} x "
            f"HCCL_BUFFSIZE {data.get('hccl_buffsize_mb')} MB per communicator, the CANN default)")
    return MemoryHeadroom(runtime_bytes=runtime, hccl_bytes=hccl, assumption=text)


def _cards(parts: MemoryParts, peak_bytes: int, chip_name: str | None) -> dict:
    """Capacity, whether one card holds the peak, and the cards each layout needs, for one chip (the
    chip-dependent fields of a ``MemoryFit``)."""
    card = chip(chip_name)
    reserve = headroom()
    hbm = card["capacity_bytes"]
    cap = hbm - reserve.runtime_bytes               # usable on one card
    counts = [int(n) for n in load("npu_memory.yaml").get("card_counts") or [1, 2, 4, 8]]
    P, G, S, A = parts.parameters, parts.gradients, parts.optimizer_state, parts.activations
    layouts = {
        "zero1": lambda n: P + G + S / n + A,
        "zero2": lambda n: P + (G + S) / n + A,
        "zero3": lambda n: (P + G + S) / n + A,
        "tensor_parallel": lambda n: (P + G + S + A) / n,
    }
    cards = {}
    usable = lambda n: cap - (reserve.hccl_bytes if n > 1 else 0)   # noqa: E731
    for name, per_card in layouts.items():
        fit = next((n for n in counts if per_card(n) <= usable(n)), None)
        cards[name] = LayoutFit(cards=fit, per_card_bytes=int(per_card(fit)) if fit else int(per_card(counts[-1])))
    return {"chip": card["name"], "hbm_bytes": hbm, "capacity_bytes": cap, "peak_bytes": peak_bytes, "parts": parts,
            "fits_one_card": peak_bytes <= cap, "cards": cards, "headroom": reserve}


def size_text(n: float) -> str:
    """``20.8 GiB`` / ``9.5 MiB``."""
    return f"{n / GIB:,.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:,.1f} MiB"


def one_line(fit: MemoryFit) -> str:
    """The terminal line: peak, its parts, where, and the cards needed."""
    parts = fit.parts
    node = f"in {fit.peak_autograd_node}" if fit.peak_autograd_node else None
    where = ", " + " ".join(x for x in (node, fit.peak_module and f"in {fit.peak_module}",
                                        fit.peak_where and f"at {fit.peak_where}") if x) \
        if node or fit.peak_module or fit.peak_where else ""
    verdict = "fits" if fit.fits_one_card else "does NOT fit"
    hbm = fit.hbm_bytes
    card = (f"one {size_text(hbm)} {fit.chip} card ({size_text(fit.capacity_bytes)} usable)" if hbm
            else f"one {size_text(fit.capacity_bytes)} {fit.chip} card")
    cards = fit.cards

    floor = {"zero1": parts.parameters + parts.gradients + parts.activations,
             "zero2": parts.parameters + parts.activations, "zero3": parts.activations}

    def n(layout: str) -> str:
        c = cards[layout].cards
        if c:
            return str(c)
        if layout in floor and floor[layout] > fit.capacity_bytes:   # the unsharded part alone is too big
            return f"never ({size_text(floor[layout])} unsharded per card)"
        return "more than the largest count"

    return (f"memory: peak {size_text(fit.peak_bytes)} per step ({fit.peak_phase or '?'}{where}) = params "
            f"{size_text(parts.parameters)} + grads {size_text(parts.gradients)} + optimizer state "
            f"{size_text(parts.optimizer_state)} + activations {size_text(parts.activations)}; {verdict} "
            f"{card}; cards needed: " + ", ".join(f"{name} {n(key)}" for key, name in LAYOUT_NAMES.items()))


def basis_text(fit: MemoryFit) -> str:
    """What the fit was measured from and what it assumes of the card (for every report, under the table)."""
    room = fit.headroom.assumption if fit.headroom else None
    return f"Measured from {fit.basis or 'the capture'}." + (f" Assumed kept from the tensors: {room}." if room else "")


def rows(fit: MemoryFit) -> list[dict]:
    """One row per layout, for the HTML/XLSX section and the DataFrame."""
    out = [{"layout": "single card", "cards": 1 if fit.fits_one_card else None,
            "per_card_gib": round(fit.peak_bytes / GIB, 3)}]
    names = {"zero1": "data parallel, ZeRO-1 (optimizer state sharded)",
             "zero2": "data parallel, ZeRO-2 (+ gradients sharded)",
             "zero3": "data parallel, ZeRO-3 (+ parameters sharded)",
             "tensor_parallel": "tensor parallel"}
    for key, label in names.items():
        c = fit.cards[key]
        out.append({"layout": label, "cards": c.cards, "per_card_gib": round(c.per_card_bytes / GIB, 3)})
    return out
