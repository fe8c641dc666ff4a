"""One event -> OpCall builder: live Kineto events and the same run's Chrome trace give one model."""
from __future__ import annotations

from collections import Counter

from opscope.model import DEVICE, HOST, HOST_BATCH, IMPORT
from opscope.parsers.calls import MARK, OPERATOR, PRIVATE, CallBuilder, Launch, Reading

VOCABULARY = {HOST, DEVICE, IMPORT, HOST_BATCH}


def _profiled_step(tmp_path):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    with torch.autograd.profiler.profile(record_shapes=True, use_kineto=True) as prof:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    trace = tmp_path / "step.json"
    prof.export_chrome_trace(str(trace))
    return prof.kineto_results.events(), trace


def test_live_events_and_their_trace_file_give_the_same_calls(tmp_path):
    from opscope.capture.events import calls_from_kineto
    from opscope.parsers.chrome_trace import load_chrome_trace

    events, trace = _profiled_step(tmp_path)
    live = calls_from_kineto(events, 1, [], None)
    filed = load_chrome_trace(trace).calls
    assert live and {c.device for c in live} | {c.device for c in filed} <= VOCABULARY

    def keys(calls):   # children differ on purpose: a trace lists a folded kernel's whole subtree
        main = Counter(c.thread for c in calls).most_common(1)[0][0]   # the two number threads differently
        return Counter((c.name, c.parent, str(c.input_shapes), str(c.dtypes), c.phase, c.device, c.thread == main)
                       for c in calls)

    assert keys(live) == keys(filed)


def test_released_events_are_read_once_into_the_same_calls(tmp_path):
    # the capture hands the builder its only reference to a step's events: emptied once read,
    # each event is freed as its call is built, and the calls are the same as when kept
    from opscope.capture.events import calls_from_kineto

    events, _ = _profiled_step(tmp_path)
    kept = calls_from_kineto(events, 1, [], None)
    handed = list(events)
    released = calls_from_kineto(handed, 1, [], None, release=True)
    assert handed == [] and len(events) > 0
    assert [c.to_dict() for c in released] == [c.to_dict() for c in kept]


def _reading(**kw):
    kinds = {"aten::conv": OPERATOR, "aten::empty": OPERATOR, "mkldnn_conv": PRIVATE, "launch": MARK,
             "opscope.backward": MARK}
    return Reading(classify=kinds.__getitem__, details=lambda rec: (rec[6], [], [], None),
                   phase_of=lambda name: "backward" if name == "opscope.backward" else None, **kw)


def test_builder_nests_folds_and_charges_device_time():
    # (start, duration, name, seq, correlation, step, shapes)
    records = [(0, 100, "aten::conv", 1, 10, 3, [[1]]), (10, 20, "aten::empty", 2, 11, 3, [[2]]),
               (40, 50, "mkldnn_conv", -1, 12, 3, None), (45, 5, "aten::empty", 3, 13, 3, [[3]]),
               (50, 1, "launch", -1, Launch(14), 3, None), (200, 30, "opscope.backward", 7, 15, 3, None),
               (205, 10, "aten::empty", 8, 16, 3, [[4]])]
    builder = CallBuilder(_reading(private_label="{} (private)"))
    builder.add_thread(list(reversed(records)), thread=5)
    builder.close()
    builder.charge(builder.owner_of_device(14), 7.0)
    conv, empty, late = builder.finish()
    assert (conv.name, conv.parent, conv.children) == ("aten::conv", None, ["aten::empty", "mkldnn_conv (private)"])
    assert conv.self_time_us == 100 - 20 and conv.total_time_us == 100   # the folded kernel's op is not a call
    assert (conv.device, conv.device_time_us, empty.device) == (DEVICE, 7.0, HOST)
    assert (empty.parent, empty.input_shapes, empty.step, empty.thread) == ("aten::conv", [[2]], 3, 5)
    assert (late.phase, late.parent) == ("backward", None)


def test_rounded_clock_keeps_a_child_that_ends_within_eps():
    records = [(0.0, 10.0, "aten::conv", 1, None, 0, []), (9.0, 1.005, "aten::empty", 2, None, 0, [])]
    strict = CallBuilder(_reading())
    strict.add_thread(list(records), thread=0)
    rounded = CallBuilder(_reading(eps=0.01))
    rounded.add_thread(list(records), thread=0)
    assert strict.calls[1].parent == "aten::conv" and rounded.calls[1].parent == "aten::conv"
    late = [(0.0, 10.0, "aten::conv", 1, None, 0, []), (10.0, 0.0, "aten::empty", 2, None, 0, [])]
    strict, rounded = CallBuilder(_reading()), CallBuilder(_reading(eps=0.01))
    strict.add_thread(list(late), thread=0)
    rounded.add_thread(list(late), thread=0)
    # an exact clock closes a range at its end; a rounded one keeps an event starting there inside
    assert strict.calls[1].parent is None and rounded.calls[1].parent == "aten::conv"
