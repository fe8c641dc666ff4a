"""The one data model every part of opscope speaks.

Capture and the parsers produce these objects; analysis functions read them and
return new ones; reporters only read them.  Everything is a plain dataclass that
round-trips through JSON (``to_dict``/``from_dict``), because ``scan.json`` is the
contract between a scan and every later command (report, diff, verify).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from opscope.typed import build, json_key

SCAN_SCHEMA = "opscope.scan/1"

PHASES = ("forward", "backward", "optimizer", "eval", "other")
VERDICTS = ("native", "composite", "adapter", "cpu-fallback", "unsupported", "not-applicable", "unknown")
ROOT_KINDS = ("partial-batch", "loader-varies", "slice", "sized", "factory", "data-dependent-output", "host-sync",
              "untraced")


def json_safe(value: Any) -> Any:
    """Make a value JSON-safe (tuples -> lists, dataclasses -> dicts).

    A record read from a newer scan.json keeps the fields this version does not know
    (``unknown_fields``) and writes them back, so ``report``/``verify`` never drop them.
    """
    kind = type(value)
    if kind in _AS_IS:   # the common leaves first: a scan has ~10^5 of them
        return value
    if kind is list or kind is tuple:
        return [json_safe(v) for v in value]
    if isinstance(value, _Part):
        return value.to_dict()
    names = _record_fields(kind)
    if names is not None:
        out = {name: json_safe(getattr(value, name)) for name in names}
        for key, extra in getattr(value, "unknown_fields", {}).items():
            out.setdefault(key, json_safe(extra))
        return out
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


_AS_IS = frozenset({str, int, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _record_fields(kind: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type (None for any other type), looked up once per type."""
    try:
        return _FIELDS[kind]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind) else None
        _FIELDS[kind] = names
        return names


class _Record:
    __slots__ = ()   # lets record types with many instances (OpCall) use slots

    def to_dict(self) -> dict:
        return json_safe(self)

    @classmethod
    def from_dict(cls, data: dict):
        names = {f.name for f in dataclasses.fields(cls)}   # type: ignore[arg-type]  # subclasses are dataclasses
        record = cls(**{k: v for k, v in data.items() if k in names})
        record.keep_unknown({k: v for k, v in data.items() if k not in names})
        return record

    def keep_unknown(self, fields: dict) -> None:
        """Remember fields of a newer schema so that ``to_dict`` writes them back unchanged
        (records with ``__slots__``, never stored in scan.json, have nowhere to keep them)."""
        if fields and hasattr(self, "__dict__"):
            self.unknown_fields = dict(fields)   # type: ignore[misc]  # only where there is a __dict__

    def keep_read(self, keys: tuple) -> None:
        """The keys a record was read with (``opscope.typed.build``); only sections (``_Part``) use them."""


HOST, DEVICE, IMPORT = "host", "device", "import"   # OpCall.device values (HOST_BATCH below)


@dataclass(slots=True)   # a capture holds one per distinct call of every step: keep them small
class OpCall(_Record):
    """One operator invocation as recorded by a profiler (or parsed from a trace).

    ``parent`` is the name of the enclosing operator (None at top level, i.e. called
    from Python); ``source`` is ``file:line`` of the first frame in the user's code;
    ``library`` is ``file:line`` (relative to site-packages) of the innermost frame in
    model/library code below it that made the call (``transformers/models/.../modeling_x.py:NN``
    under ``trainer.train()``), None when the user's own line made it.
    ``origin`` is ``file:line`` of the line that produced the tensor whose shape this
    call inherits (used to find dynamic-shape root causes).

    ``device`` says where the call's work ran, one vocabulary for capture and every trace
    format (``opscope.parsers.calls`` builds both); which accelerator is the profile's
    ``device`` (cpu/cuda/npu), not the call's:
    ``DEVICE`` ("device"): on the accelerator: it touched tensors the script put there
    (capture) or launched device tasks (capture and traces);
    ``HOST`` ("host"): on the host CPU: the job's host work, or in a trace an operator with
    no device task or with CPU-fallback evidence;
    ``IMPORT`` ("import", capture only): host work while a library was being imported;
    ``HOST_BATCH`` ("host-batch", capture only): host work whose result the script then
    moved to its accelerator (data preparation).
    The last two are host work too, told apart because analysis treats them differently.
    Profiles built before this vocabulary said "cpu"/"cuda"/"npu" here; no scan.json holds it.
    """
    name: str
    overload: str | None = None
    input_shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    scalars: list = field(default_factory=list)
    output_shapes: list | None = None
    self_time_us: float = 0.0
    total_time_us: float = 0.0
    device_time_us: float = 0.0
    phase: str = "other"
    parent: str | None = None
    source: str | None = None
    origin: str | None = None
    origin_cause: str | None = None
    step: int = 0
    thread: int = 0
    seq_nr: int = -1
    start_us: float = 0.0
    children: list[str] = field(default_factory=list)
    device: str = "host"   # where it ran: DEVICE, HOST, IMPORT or HOST_BATCH (see above)
    origins: list = field(default_factory=list)   # ids of the shape origins of its inputs (capture side data)
    count: int = 1         # identical calls folded into this record (a step's repeats, a table row's
    #                        "# of Calls", a scan operator's share of a step); times are summed
    library: str | None = None
    # (last: a steps.jsonl row of an older capture lacks them, and its columns are read by position)
    repeats: int = 0       # of ``count``, those that re-ran the call just before them on the same tensors'
    #                        shapes (back to back at the top level, or inside such a call: a loop over one op)
    order: list = field(default_factory=list)   # a top-level record's places in its step's top-level call
    #                        sequence (the first steps only): the op stream's order, which folding loses

    def signature(self, frozen: dict | None = None) -> tuple:
        """(name, overload, shapes, dtypes), hashable; ``frozen``: see ``freeze_shared``."""
        if frozen is None:
            return (self.name, self.overload or "", freeze(self.input_shapes), freeze(self.dtypes))
        return (self.name, self.overload or "", freeze_shared(self.input_shapes, frozen),
                freeze_shared(self.dtypes, frozen))


def where_text(source: str | None, library: str | None, entry_lines=()) -> str:
    """The "where" of an operator, finding or root cause as reports show it: the user's line
    with the library line that made it (``train.py:40 (modeling_x.py:88)``), the library line
    first when the user's line is a framework entry (``modeling_x.py:88 (under train.py:40)``)."""
    if not library:
        return source or ""
    if not source:
        return library
    if source in entry_lines:
        return f"{library} (under {source})"
    return f"{source} (in {library})"


def loader_key(where: str, library: str | None) -> str:
    """The key of a DataLoader in a capture's ``dataloaders``: one user line may build several
    loaders in library code (``trainer.train()`` builds the training and evaluation loaders)."""
    return f"{where} @ {library}" if library else where


def freeze(value):
    """A hashable copy of a shapes/dtypes/scalars list (nested lists become tuples); unhashable
    content (an object inside) raises TypeError when hashed, absurd nesting RecursionError."""
    if not isinstance(value, (list, tuple)):
        return value
    # the common depth in one step: a list of scalars or of dimension lists
    flat = tuple([tuple(v) if type(v) is list else v for v in value])
    try:
        hash(flat)
        return flat
    except TypeError:   # deeper nesting, or an object inside: element by element
        return tuple(freeze(v) for v in value)


def freeze_shared(value, frozen: dict):
    """``freeze`` once per list object: ``frozen`` maps id -> frozen copy, valid while the caller
    holds every list it names (all the calls).  A capture's steps share their equal shape and
    dtype lists (``capture.events.compact_calls``), so a scan's ~10^4 calls freeze ~10^3 lists."""
    out = frozen.get(id(value))
    if out is None:
        out = frozen[id(value)] = freeze(value)
    return out


HOST_BATCH = "host-batch"   # OpCall.device of data preparation: host work whose result was moved to the device


@dataclass
class Step(_Record):
    """Summary of one training step (one optimizer step, or another marker)."""
    index: int
    duration_us: float = 0.0
    op_calls: int = 0
    phase_time_us: dict = field(default_factory=dict)
    complete: bool = True
    # what ran unprofiled to bound memory: {"after_calls": N, "where": "file:line"} when
    # recording stopped after N torch calls; {"eval_forwards": M} sampling/eval forwards skipped
    unrecorded: dict = field(default_factory=dict)


@dataclass
class Operator(_Record):
    """One distinct operator signature (name, overload, input shapes, dtypes) across a run."""
    name: str
    overload: str | None = None
    input_shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    scalars: list = field(default_factory=list)
    output_shapes: list | None = None
    calls: int = 0
    self_time_us: float = 0.0
    total_time_us: float = 0.0
    device_time_us: float = 0.0
    phase: str = "other"
    phases: list[str] = field(default_factory=list)
    source: str | None = None
    sources: list[str] = field(default_factory=list)
    library: str | None = None   # most common model/library line under ``source`` (see OpCall)
    parent: str | None = None
    top_level: bool = True
    children: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    dynamic: bool = False
    on_device: bool = True   # False: the script only ran it on host (CPU) tensors
    import_time: bool = False  # only ran while a library was being imported (e.g. version probes)
    steady_time_us: float | None = None  # median self time per steady-state step (None: no such step)
    # median device (GPU) time per steady-state step of the kernels it launched (None: no such step)
    steady_device_time_us: float | None = None
    # estimated time per step on the scan's NPU chip (device kernels; a CPU fallback's host time and copies):
    # from shapes, so identical scans give identical figures; what the score and every share weigh
    npu_time_us: float | None = None
    verdict: str | None = None
    evidence: dict = field(default_factory=dict)
    substitute: dict | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass
class DynamicShape(_Record):
    """An operator whose input shapes in a later step were not seen in the first step."""
    op: str
    source: str | None
    cause: str
    varying_dims: list[dict] = field(default_factory=list)
    shapes_per_step: dict = field(default_factory=dict)
    root_cause: str | None = None
    suggestion: str = ""
    library: str | None = None   # the model/library line under ``source`` (see OpCall)


@dataclass
class RootCause(_Record):
    """A user source line that makes downstream operators dynamic: what to fix.

    ``kind`` says how the varying size enters there (``ROOT_KINDS``); ``related`` lists
    lines that only pass the same varying size on (folded into this cause).  ``library``
    is the model/library line under ``source`` that made the data; ``set_by`` names the
    call that sets the shape (a DataLoader's collate function / sampler) with its settings;
    ``varied`` names the dimensions that varied.
    """
    source: str | None
    cause: str
    ops: list[str] = field(default_factory=list)
    varying_dims: list[dict] = field(default_factory=list)
    suggestion: str = ""
    evidence: str = ""
    kind: str = ""
    related: list = field(default_factory=list)
    library: str | None = None
    set_by: str | None = None
    varied: str = ""   # the varying dimensions by name: "sequence length (dim 1), batch size (dim 0)"


@dataclass
class Finding(_Record):
    """A CUDA-specific API use: found in the source (static) or remapped at run time."""
    rule: str
    file: str | None
    line: int | None
    api: str
    message: str
    replacement: str | None = None
    severity: str = "warning"
    column: int | None = None
    snippet: str | None = None
    origin: str = "static"  # "static" | "runtime"
    count: int = 1
    remapped_to: str | None = None  # run-time only: what the call did during a CPU scan
    library: str | None = None  # run-time only: the library line under file:line that made the call


@dataclass
class Profile(_Record):
    """Operator calls of one run, whatever produced them (opscope capture or a parser)."""
    calls: list[OpCall] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    device: str = "cpu"
    source_format: str = "opscope"
    path: str | None = None
    rank: int | None = None
    metadata: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict):
        prof = super().from_dict(data)
        prof.calls = [c if isinstance(c, OpCall) else OpCall.from_dict(c) for c in prof.calls]
        prof.steps = [s if isinstance(s, Step) else Step.from_dict(s) for s in prof.steps]
        return prof


_JSON_KEYS: dict[type, dict[str, str]] = {}


def _json_keys(kind: type) -> dict[str, str]:
    """JSON key -> field name of a section type in declaration order, looked up once per type."""
    keys = _JSON_KEYS.get(kind)
    if keys is None:
        fields = dataclasses.fields(kind)   # type: ignore[arg-type]  # sections are dataclasses
        keys = _JSON_KEYS[kind] = {json_key(f.name): f.name for f in fields}
    return keys


class _Part(_Record):
    """A section of scan.json kept as one typed record (``ScanResult.settings``, ``exit``, ...).

    Built from JSON by ``from_dict``, which checks every field against its type hint (a
    ``SchemaError`` names the JSON path of a bad value).  ``to_dict`` writes the JSON these
    sections always had: a section read from a file is written back key for key in the
    file's order (a field it lacked and nobody set stays absent); one built in code writes
    its set fields in declaration order, plus those it always carries as null (``_ALWAYS``, every
    field with ``_ALWAYS_ALL``, or named with ``writing``).
    """
    _ALWAYS: ClassVar[frozenset[str]] = frozenset()
    _ALWAYS_ALL: ClassVar[bool] = False   # every field is always written (None as null)

    @classmethod
    def from_dict(cls, data: dict, where: str = "$"):
        return build(cls, data, where)

    def keep_read(self, keys: tuple) -> None:
        self._read = tuple(keys)

    def writing(self, *names: str):
        """Write these fields even when None (a section that always carried them as null)."""
        self._also = getattr(self, "_also", frozenset()) | frozenset(names)
        return self

    def to_dict(self) -> dict:
        read: tuple = getattr(self, "_read", ())
        attrs = _json_keys(type(self))   # JSON key -> field (``from`` -> ``from_``)
        keep = set(read) if hasattr(self, "_read") else set(attrs) if self._ALWAYS_ALL else set(self._ALWAYS)
        keep |= getattr(self, "_also", frozenset())
        unknown = getattr(self, "unknown_fields", {})
        out = {}
        for key in [*read, *(n for n in attrs if n not in read)]:
            if key in unknown:
                out[key] = json_safe(unknown[key])
            elif getattr(self, attrs[key]) is not None or key in keep:
                out[key] = json_safe(getattr(self, attrs[key]))
        for key, extra in unknown.items():
            out.setdefault(key, json_safe(extra))
        return out

    def is_empty(self) -> bool:
        """True for a section with nothing in it (``{}`` in scan.json)."""
        return not self.to_dict()


@dataclass
class ScanSettings(_Part):
    """What a scan was asked for (``opscope scan`` flags, or ``opscope.capture(...)`` arguments)."""
    steps: int | None = None
    warmup: int | None = None
    step_marker: str | None = None
    timeout: float | None = None
    target: str | None = None   # the torch_npu version asked for (None: the newest known)
    requested_device: str | None = None
    remap: bool | None = None   # in-process capture: never remapped
    chip: str | None = None
    calibration: str | None = None
    wrapper: dict | None = None   # the launch wrapper's settings (accelerate, deepspeed, ...)
    mode_auto: str | None = None   # why --mode auto chose the mode
    mode: str | None = None        # "fake" (absent: a real run)
    distributed: dict | None = None   # {"launcher", "world_size", "ranks", "rank_dirs"}
    rank: int | None = None
    _ALWAYS = frozenset({"steps", "warmup", "step_marker", "timeout", "target", "requested_device"})

    @classmethod
    def of(cls, value: ScanSettings | dict | None) -> ScanSettings:
        """``value`` as ScanSettings: the scan's child receives the settings as JSON."""
        return value if isinstance(value, ScanSettings) else cls.from_dict(value or {}, "$.settings")


@dataclass
class ScanExit(_Part):
    """How the scanned script ended (``kind``: steps-reached, finished, exit, exception, timeout, ...)."""
    kind: str | None = None
    code: int | None = None
    message: str | None = None
    where: str | None = None
    _ALWAYS_ALL = True


@dataclass
class ScanSummary(_Part):
    """Counts, time shares and the readiness score (``analysis.verdicts.readiness_summary``)."""
    verdict_counts: dict[str, int] | None = None
    time_share: dict[str, float] | None = None
    cpu_fallback_time_share: float | None = None
    blocking_signatures: int | None = None
    blocking_ops: list[dict] | None = None
    blocking_time_share: float | None = None
    native_or_composite_share: float | None = None
    dynamic_root_causes: int | None = None
    findings: int | None = None
    findings_by_severity: dict[str, int] | None = None
    readiness_score: float | None = None   # None: nothing was measured (``score_unavailable`` says why)
    score_formula: str | None = None
    time_basis: str | None = None
    precision: dict | None = None   # requested vs recorded dtypes (analysis.precision)
    score_unavailable: str | None = None


@dataclass
class ScanTarget(_Part):
    """The torch_npu release the verdicts were judged against (``analysis.verdicts.assign_verdicts``)."""
    package: str | None = None
    version: str | None = None
    line: str | None = None
    source: str | None = None
    torch: str | None = None
    torch_schema: str | None = None   # whose composite/structured facts judged decompositions
    op_plugin_commit: str | None = None
    note: str | None = None
    torch_schema_note: str | None = None


@dataclass
class VerificationResult(_Part):
    """One replayed signature of ``verification.results`` / ``substitutes`` (written by ``opscope verify``)."""
    op: str | None = None
    overload: str | None = None
    outcome: str | None = None   # pass, warn, fail, error, measured, skipped
    message: str | None = None
    standard: str | None = None
    predicted_verdict: str | None = None
    disagreement: str | None = None
    metrics: dict | None = None   # cosine, max_abs_err, max_rel_err (null: not a number)
    input_shapes: list | None = None
    dtypes: list | None = None
    replacement: str | None = None   # substitutes only: the suggested replacement
    check: str | None = None         # substitutes only: the expression replayed against the original


@dataclass
class Verification(_Part):
    """What ``opscope verify`` measured: replayed operators and the end-to-end loss comparison."""
    device: str | None = None
    inputs: str | None = None
    reference: str | None = None
    standards: str | None = None
    started_at: str | None = None
    seed: int | None = None
    duration_s: float | None = None
    counts: dict[str, int] | None = None
    substitute_counts: dict[str, int] | None = None
    results: list[VerificationResult] | None = None
    substitutes: list[VerificationResult] | None = None
    e2e: dict | None = None

    @classmethod
    def of(cls, value: Verification | dict | None) -> Verification | None:
        return _optional_part(cls, value, "$.verification")


@dataclass
class MemoryParts(_Part):
    """What a step's device memory is made of (bytes), each part at its largest (``analysis.npu.memory_fit``)."""
    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    activations: int = 0
    _ALWAYS_ALL = True

    def items(self) -> list[tuple[str, int]]:
        """``(part, bytes)`` in the order the reports list them."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]


@dataclass
class LayoutFit(_Part):
    """One parallel layout's fit: the fewest cards that hold the step (None: not within the largest count)
    and the bytes per card at that count (at the largest count when none holds it)."""
    cards: int | None = None
    per_card_bytes: int = 0
    _ALWAYS_ALL = True


@dataclass
class MemoryHeadroom(_Part):
    """Bytes a card keeps from the job's tensors: the runtime's share, HCCL's buffers on more than one card."""
    runtime_bytes: int = 0
    hccl_bytes: int = 0
    assumption: str | None = None
    _ALWAYS_ALL = True


@dataclass
class MemoryFit(_Part):
    """The peak device memory of a step, its parts, and the NPU cards it needs (``analysis.npu.memory_fit``)."""
    chip: str | None = None
    hbm_bytes: int | None = None          # the card's memory (absent in scans made before it was recorded)
    capacity_bytes: int = 0               # usable on one card: the HBM less the runtime's share
    peak_bytes: int = 0
    parts: MemoryParts = field(default_factory=MemoryParts)
    fits_one_card: bool = False
    cards: dict[str, LayoutFit] = field(default_factory=dict)   # layout (zero1, zero2, zero3, tensor_parallel) ->
    headroom: MemoryHeadroom | None = None
    peak_step: int | None = None
    peak_phase: str | None = None
    peak_where: str | None = None
    peak_module: str | None = None
    peak_autograd_node: str | None = None
    basis: str | None = None
    _ALWAYS_ALL = True


@dataclass
class FakePlace(_Part):
    """A place where a ``--mode fake`` run had to invent a value or a size: its line, what it did, how often,
    and the policy that stood in for the data (``support_matrix/fake_mode.yaml``)."""
    kind: str | None = None     # value-read, bool-read, data-dependent-size, checkpoint-save
    op: str | None = None
    where: str | None = None    # file:line in the user's code (None: library code)
    policy: str | None = None
    count: int = 0
    value: Any = None           # the placeholder value read, where there was one
    _ALWAYS = frozenset({"kind", "op", "where", "policy", "count"})


@dataclass
class FakeMode(_Part):
    """What a ``--mode fake`` scan could not measure and where it invented data (``analysis.fake_results``)."""
    places: list[FakePlace] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    collectives: list[dict] = field(default_factory=list)        # shape-only collectives: where, op, bytes, count
    skipped_forwards: list[dict] = field(default_factory=list)   # repeated no-grad forwards not re-run
    timings: str | None = None
    factory_fake_mb: int | None = None
    _ALWAYS_ALL = True


@dataclass
class EstimateBatch(_Part):
    """The batch size the FPS figures use, and where it was read (None: no forward input showed one)."""
    value: int | None = None
    evidence: str | None = None


@dataclass
class EstimateGradients(_Part):
    """The gradient bytes DDP all-reduces each step, the parameters they cover and how they were counted."""
    bytes: float = 0.0
    parameters: int | None = None
    evidence: str | None = None


@dataclass
class EstimateBasis(_Part):
    """The chip-independent part of the NPU estimate (``analysis.npu.estimate.build_basis``), stored so that
    ``opscope report --chip`` re-prices it without the script.  Its rows (the kernels each signature becomes,
    with FLOPs, bytes, TransData and alternatives) are the estimator's own input: only ``price`` reads them."""
    version: int | None = None
    rows: list[dict] = field(default_factory=list)
    patterns: list[dict] = field(default_factory=list)   # fusable op sequences matched in the op stream
    batch: EstimateBatch = field(default_factory=EstimateBatch)
    gradients: EstimateGradients = field(default_factory=EstimateGradients)
    foreach_launches: list[str] = field(default_factory=list)   # foreach kernels the optimizer launches per step


@dataclass
class EstimateRow(_Part):
    """One ranked row of the NPU estimate, per step: an operator signature (``kind`` "operator") or a group one fix
    is for ("pattern": a fusable sequence, the optimizer's per-parameter ops, unaligned cube shapes at a line)."""
    kind: str = "operator"
    operator: str = ""
    input_shapes: list | None = None
    dtypes: list | None = None
    phase: str | None = None
    source: str | None = None
    library: str | None = None
    calls_per_step: float = 0.0
    kernels: str = ""
    npu_time_us: float = 0.0
    cube_us: float = 0.0
    vector_us: float = 0.0
    aicpu_us: float = 0.0
    transdata_us: float = 0.0
    host_us: float = 0.0
    reason: str | None = None
    fix: str | None = None
    reason_kinds: list[str] = field(default_factory=list)
    weight_us: float | None = None    # what the operator weighs in the readiness score (None: its npu_time_us)
    priced_by: str | None = None      # the kernel that costs it most and the rule that priced it


@dataclass
class EstimateWorld(_Part):
    """The step on ``devices`` NPUs: DDP's all-reduce (and what of it backward does not hide), host, step, bound."""
    devices: int = 1
    communication_us: float = 0.0
    exposed_communication_us: float = 0.0
    link: str | None = None
    host_us: float = 0.0
    ddp_vector_us: float = 0.0
    device_us: float | None = None   # absent in scans made before DDP's vector work was priced: the step's
    step_us: float = 0.0
    bound: str | None = None         # host, compute, memory, aicpu or communication
    fps: float | None = None         # None: the batch size is unknown


@dataclass
class EstimateStep(_Part):
    """A step's estimated NPU time by unit, its host launch time, and the step at each device count."""
    device_us: float = 0.0
    compute_us: float = 0.0
    vector_us: float = 0.0
    transdata_us: float = 0.0
    transdata_kernels: float = 0.0
    aicpu_us: float = 0.0
    host_us: float = 0.0
    kernels: float = 0.0
    gradient_bytes: float = 0.0
    batch: int | None = None
    per_world_size: list[EstimateWorld] = field(default_factory=list)
    kernel_types_us: dict[str, float] = field(default_factory=dict)   # per kernel type, costliest first

    def world(self, devices: int) -> EstimateWorld | None:
        """The step on ``devices`` NPUs (None: not priced for that count)."""
        return next((w for w in self.per_world_size if w.devices == devices), None)


@dataclass
class NpuEstimate(_Part):
    """What will be slow on one NPU chip, per signature and per step (``analysis.npu.estimate.price``): every
    figure an estimate from shapes and dtypes, with the calibration error it carries."""
    chip: str | None = None
    family: str | None = None
    rows: list[EstimateRow] = field(default_factory=list)   # by estimated NPU time, largest first
    step: EstimateStep = field(default_factory=EstimateStep)
    patterns: list[dict] = field(default_factory=list)
    batch: EstimateBatch = field(default_factory=EstimateBatch)
    gradients: EstimateGradients = field(default_factory=EstimateGradients)
    calibration: dict = field(default_factory=dict)   # what the figures were fitted on, and their error
    factors: dict[str, float] | None = None           # per-unit scaling from the user's own profiles
    basis: EstimateBasis | None = None                 # None: a stored estimate that cannot be re-priced
    label: str | None = None

    def operator_rows(self) -> list[EstimateRow]:
        """The rows of single operator signatures (no pattern groups): what weighs each operator in the score."""
        return [r for r in self.rows if r.kind == "operator"]


@dataclass
class LibraryOp(_Part):
    """One operator a third-party library registered: its verdict and its share of the step's time."""
    name: str | None = None
    verdict: str | None = None
    time_share: float = 0.0
    _ALWAYS_ALL = True


@dataclass
class ThirdPartyLibrary(_Part):
    """A third-party library the scan judged (``analysis.verdicts.third_party.library_rows``): its version here,
    what to install on the Ascend machine for the target, and its operators."""
    library: str | None = None
    install: str | None = None       # the adapter release to install (None: no adapter for the target)
    paired: str | None = None        # what that adapter release pairs with
    ops: list[LibraryOp] = field(default_factory=list)
    time_share: float = 0.0
    stand_in: bool = False           # not installed here: opscope's stand-in ran
    version_here: str | None = None
    _ALWAYS_ALL = True


# ---- the port plan (analysis/plan/releases.py plan_for) ------------------------------------------------
# Built as JSON by the analysis and read back through ``from_dict``, so scan.json keeps its keys and order.

@dataclass
class ReleaseFacts(_Part):
    """One torch_npu release and what it installs with, each fact with where it comes from
    (``releases.release_facts``); the planned release also says why it was chosen and what still falls back."""
    torch_npu: str
    line: str | None = None
    torch: str | None = None
    torch_source: str | None = None
    python: list[str] = field(default_factory=list)   # the Python versions it has wheels for
    python_source: str | None = None
    cann: str | None = None                  # None: no pairing known (``cann_why`` says why)
    cann_source: str | None = None
    cann_inferred: bool = False              # paired by its release branch, not by Ascend's table
    branch: str | None = None
    line_status: str | None = None           # EOL, maintenance, development, planned
    line_eol: str | None = None
    from_wheel: bool = False                 # torch read from the wheel's METADATA (in the matrix)
    cann_why: str | None = None
    why: str | None = None                   # planned only: why this release
    blocking_signatures: int | None = None   # planned only: signatures that fall back there
    blocking_ops: dict[str, str] | None = None   # planned only: operator -> its worst verdict there


@dataclass
class PlanBlocker(_Part):
    """An operator that falls back on some release: the first release that runs it, the one from which every
    later release does (None: it falls back on the newest), and the runs of releases each way."""
    op: str
    verdicts: list[str] = field(default_factory=list)
    blocks: int = 0                          # releases it falls back on
    first_supported_in: str | None = None    # None: no release runs it
    supported_from: str | None = None
    blocked_in: list[list[str]] = field(default_factory=list)     # [[first, last], ...] in release order
    supported_in: list[list[str]] = field(default_factory=list)


@dataclass
class PlanReleaseRow(_Part):
    """One judged release: how many signatures fall back there."""
    version: str
    torch: str | None = None
    blocking_signatures: int = 0


@dataclass
class PlanAdapter(_Part):
    """The Ascend adapter release (torchvision_npu, apex, ...) of a third-party library the scan recorded."""
    library: str | None = None
    adapter: str | None = None    # its package
    paired: str | None = None     # how its release was paired with the planned torch_npu
    install: str | None = None
    activate: str | None = None
    tag: str | None = None        # None: no release pairs with the plan
    cann: str | None = None


@dataclass
class PlanChange(_Part):
    """What must change for the plan: an installed package or a line of a requirement file."""
    where: str | None = None      # "installed" or "requirements.txt:3"
    package: str | None = None
    from_: str | None = None      # scan.json's "from": the version or line there now (None: not installed)
    to: str | None = None         # None: no pin fixes it (``reason`` says what to do)
    reason: str | None = None


@dataclass
class PlanEnvironment(_Part):
    """The scanned environment against the planned release (``environment.environment_against``)."""
    python: str | None = None
    python_executable: str | None = None
    python_ok: bool | None = None     # None: the release's Python versions are not known
    installed: dict[str, str | None] = field(default_factory=dict)   # package -> version (None: absent)
    files: list[str] = field(default_factory=list)    # requirement files read
    notes: list[str] = field(default_factory=list)    # files or lines skipped, and why
    changes: list[PlanChange] = field(default_factory=list)
    install: str | None = None        # the install block for the Ascend machine


@dataclass
class PortPlan(_Part):
    """Which torch_npu releases run the scan's operators and the one to install, with what must change here
    (``releases.plan_for``)."""
    releases_judged: int
    fewest_blocking: int        # the fewest signatures that fall back on any one release
    all_native: bool
    oldest: ReleaseFacts        # the oldest and the newest release with that fewest
    newest: ReleaseFacts
    best_ranges: list[list[str]]   # the runs of such releases: [[first, last], ...]
    planned: ReleaseFacts
    blockers: list[PlanBlocker] = field(default_factory=list)
    per_release: list[PlanReleaseRow] = field(default_factory=list)
    adapters: list[PlanAdapter] = field(default_factory=list)
    sources: dict[str, str] | None = None
    timing_s: dict[str, float] | None = None
    environment: PlanEnvironment | None = None   # None: planned without the environment check
    install: str | None = None                   # the environment's install block


@dataclass
class CaptureMeta:
    """What a capture recorded beside its calls (``capture.store``): for the analysis, never in scan.json."""
    traces: list[str] = field(default_factory=list)        # the Chrome traces written, in step order
    dataloaders: dict = field(default_factory=dict)        # DataLoaders and collators, where each was built
    precision: dict | None = None                          # requested vs recorded dtypes (analysis.precision)
    memory: dict = field(default_factory=dict)             # {"steps": [each step's device-memory peak]}
    overloads_resolved: bool = False   # every step's calls carry their overload: the analysis asks torch for none
    notes: list[str] = field(default_factory=list)         # what reading the capture back had to drop


class Capture(NamedTuple):
    """A capture as the analysis reads it: ``capture.store.load_capture`` (from the run folder) or a session's
    ``snapshot`` (from memory)."""
    calls: list[OpCall]
    steps: list[Step]
    side: dict[int, dict]     # step -> the source tracker's side record (origins, loaders) for dynamic shapes
    findings: list[Finding]   # run-time findings (remaps, library stand-ins, precision)
    meta: CaptureMeta


def _optional_part(part: type[_Part], value, where: str):
    """An optional section: None, the record itself, or its JSON object (checked)."""
    return value if value is None or isinstance(value, part) else part.from_dict(value, where)


_PARTS: dict[str, type[_Part]] = {"settings": ScanSettings, "exit": ScanExit, "summary": ScanSummary,
                                  "target": ScanTarget}


@dataclass
class ScanResult(_Record):
    """Everything ``opscope scan`` learned about a run; serialised as ``scan.json``."""
    script: str | None = None
    argv: list[str] = field(default_factory=list)
    device: str = "cpu"
    torch_version: str = ""
    complete: bool = False
    incomplete_reason: str | None = None
    schema: str = SCAN_SCHEMA
    tool_version: str = ""
    python_version: str = ""
    platform: str = ""
    cwd: str | None = None
    started_at: str | None = None
    duration_s: float = 0.0
    settings: ScanSettings = field(default_factory=lambda: ScanSettings.from_dict({}))
    exit: ScanExit = field(default_factory=lambda: ScanExit.from_dict({}))
    steps: list[Step] = field(default_factory=list)
    operators: list[Operator] = field(default_factory=list)
    dynamic_shapes: list[DynamicShape] = field(default_factory=list)
    root_causes: list[RootCause] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    summary: ScanSummary = field(default_factory=lambda: ScanSummary.from_dict({}))
    target: ScanTarget = field(default_factory=lambda: ScanTarget.from_dict({}))
    traces: list[str] = field(default_factory=list)
    verification: Verification | None = None
    notes: list[str] = field(default_factory=list)
    npu_estimate: NpuEstimate | None = None   # "what will be slow on <chip>": opscope.analysis.npu.estimate
    fake_mode: FakeMode | None = None    # --mode fake: data-dependent places and the policy applied
    memory_fit: MemoryFit | None = None   # peak device memory per step, its parts, NPU cards needed
    # the port plan (analysis/plan/releases.py plan_for): releases that run every operator, the planned one
    # with its torch / Python / CANN, what in the environment must change, the install block
    plan: PortPlan | None = None
    # third-party libraries judged (analysis/verdicts/third_party.py library_rows): version here, what to install, ops
    third_party: list[ThirdPartyLibrary] | None = None
    # user lines that run the whole training loop in library code (trainer.train(), trainer.fit()):
    # the user cannot act on them, so reports lead with the library line
    entry_lines: list[str] = field(default_factory=list)

    _NESTED = {"steps": Step, "operators": Operator, "dynamic_shapes": DynamicShape,
               "root_causes": RootCause, "findings": Finding}

    def __post_init__(self):
        """Sections given as JSON objects become their records (checked: ``SchemaError`` on a bad value)."""
        for name, part in _PARTS.items():
            value = getattr(self, name)
            if not isinstance(value, part):
                setattr(self, name, part.from_dict(value, f"$.{name}"))
        self.verification = _optional_part(Verification, self.verification, "$.verification")
        self.memory_fit = _optional_part(MemoryFit, self.memory_fit, "$.memory_fit")
        self.npu_estimate = _optional_part(NpuEstimate, self.npu_estimate, "$.npu_estimate")
        self.fake_mode = _optional_part(FakeMode, self.fake_mode, "$.fake_mode")
        self.plan = _optional_part(PortPlan, self.plan, "$.plan")
        if self.third_party is not None:
            self.third_party = [_optional_part(ThirdPartyLibrary, lib, f"$.third_party[{i}]")
                                for i, lib in enumerate(self.third_party)]

    @classmethod
    def from_dict(cls, data: dict):
        res = super().from_dict(data)
        kind: type[_Record]
        for name, kind in cls._NESTED.items():
            setattr(res, name, [x if isinstance(x, kind) else kind.from_dict(x) for x in getattr(res, name)])
        return res
