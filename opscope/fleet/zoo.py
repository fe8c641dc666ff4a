"""Generated fleet jobs: a model from a zoo turned into a short training script on synthetic data.

Each generator returns the text of an ordinary training script (argparse, a model built
with random weights, synthetic batches of the right input kind, loss, backward,
``optimizer.step()`` in a loop) that ``opscope scan`` runs like any user script; the text
is written next to the fleet's results, so ``opscope scan DIR/scripts/NAME.py`` repeats a
job exactly.  Nothing is downloaded: torchvision builders get ``weights=None`` (and
``weights_backbone=None``), timm ``pretrained=False``, transformers models are built
``from_config``.
"""
from __future__ import annotations

import importlib.util
import json
import re

from opscope.errors import UserError

ZOOS = ("torchvision", "timm", "transformers")

INSTALL_HINT = {
    "torchvision": "pip install 'opscope[fleet]' (torchvision paired with your torch, e.g. torchvision==0.28.* "
                   "for torch 2.13)",
    "timm": "pip install timm --no-deps (plus huggingface_hub and safetensors)",
    "transformers": "pip install transformers (its tokenizers are not needed)",
}


def zoo_available(zoo: str) -> bool:
    return importlib.util.find_spec(zoo) is not None


def require_zoo(zoo: str) -> None:
    if zoo not in ZOOS:
        raise UserError(f"unknown zoo {zoo!r}: choose from {', '.join(ZOOS)}")
    if not zoo_available(zoo):
        raise UserError(f"the {zoo} zoo needs the {zoo} package, which is not installed: {INSTALL_HINT[zoo]}")


# --------------------------------------------------------------------------- torchvision

def torchvision_models(tasks=("classification", "detection", "segmentation")) -> dict[str, str]:
    """Every model builder of torchvision by task: {name: task}."""
    require_zoo("torchvision")
    from opscope.fleet.tv_compat import import_torchvision

    models = import_torchvision().models
    modules = {"classification": models, "detection": models.detection, "segmentation": models.segmentation}
    out: dict[str, str] = {}
    for task in tasks:
        for name in models.list_models(module=modules[task]):
            out[name] = task
    return out


def torchvision_task(name: str) -> str:
    known = torchvision_models()
    if name not in known:
        close = [n for n in known if name.split("_")[0] in n][:5]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(f"torchvision has no classification/detection/segmentation model {name!r}{hint}")
    return known[name]


_HEADER = '''"""opscope fleet generated job: {zoo} {model} ({task}), a short training step on synthetic data.

Repeat it alone with: opscope scan THIS_FILE --steps N
"""
import argparse

import torch
import torch.nn.functional as F
'''

_LOOP = '''
parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=1000)
parser.add_argument("--batch-size", type=int, default={batch})
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = build().to(device)
model.train()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
for step in range(args.iters):
    loss = train_loss(model, args.batch_size, device)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''

_TV_CLASSIFICATION = '''
from opscope.fleet.tv_compat import import_torchvision

torchvision = import_torchvision()
NAME, SIZE, NUM_CLASSES = {model!r}, {size}, 1000


def build():
    return torchvision.models.get_model(NAME, weights=None{extra})


def train_loss(model, batch, device):
    images = torch.randn(batch, 3, SIZE, SIZE, device=device)
    labels = torch.randint(0, NUM_CLASSES, (batch,), device=device)
    out = model(images)
    if isinstance(out, tuple):          # inception_v3 / googlenet: (logits, aux logits...)
        return sum(F.cross_entropy(o, labels) for o in out if o is not None)
    if hasattr(out, "logits"):          # InceptionOutputs / GoogLeNetOutputs
        return F.cross_entropy(out.logits, labels)
    return F.cross_entropy(out, labels)
'''

_TV_SEGMENTATION = '''
from opscope.fleet.tv_compat import import_torchvision

torchvision = import_torchvision()
NAME, SIZE, NUM_CLASSES = {model!r}, {size}, 21


def build():
    return torchvision.models.get_model(NAME, weights=None, weights_backbone=None, num_classes=NUM_CLASSES)


def train_loss(model, batch, device):
    images = torch.randn(batch, 3, SIZE, SIZE, device=device)
    masks = torch.randint(0, NUM_CLASSES, (batch, SIZE, SIZE), device=device)
    out = model(images)
    loss = F.cross_entropy(out["out"], masks)
    if "aux" in out:
        loss = loss + 0.5 * F.cross_entropy(out["aux"], masks)
    return loss
'''

_TV_DETECTION = '''
from opscope.fleet.tv_compat import import_torchvision

torchvision = import_torchvision()
NAME, SIZE, NUM_CLASSES, BOXES = {model!r}, {size}, 91, 3


def build():
    return torchvision.models.get_model(NAME, weights=None, weights_backbone=None{extra})


def train_loss(model, batch, device):
    images, targets = [], []
    for _ in range(batch):
        images.append(torch.rand(3, SIZE, SIZE, device=device))
        xy = torch.rand(BOXES, 2, device=device) * (SIZE / 2)
        wh = torch.rand(BOXES, 2, device=device) * (SIZE / 2) + 8
        target = {{"boxes": torch.cat([xy, xy + wh], dim=1),
                  "labels": torch.randint(1, NUM_CLASSES, (BOXES,), device=device)}}
        if "maskrcnn" in NAME:
            target["masks"] = torch.randint(0, 2, (BOXES, SIZE, SIZE), dtype=torch.uint8, device=device)
        if "keypointrcnn" in NAME:
            points = torch.rand(BOXES, 17, 2, device=device) * (SIZE / 2) + xy[:, None, :]
            target["keypoints"] = torch.cat([points, torch.ones(BOXES, 17, 1, device=device)], dim=2)
        targets.append(target)
    losses = model(images, targets)
    return sum(losses.values())
'''


def torchvision_script(model: str, task: str | None = None, image_size: int | None = None, batch: int = 2) -> str:
    task = task or torchvision_task(model)
    if task == "classification":
        size = image_size or (299 if model == "inception_v3" else 224)
        extra = ", aux_logits=True, init_weights=True" if model in ("inception_v3", "googlenet") else ""
        body = _TV_CLASSIFICATION.format(model=model, size=size, extra=extra)
    elif task == "segmentation":
        body = _TV_SEGMENTATION.format(model=model, size=image_size or 224)
    elif task == "detection":
        size = image_size or (300 if model.startswith("ssd300") else 320)
        extra = "" if model.startswith("ssd") else ", min_size=SIZE, max_size=SIZE"
        body = _TV_DETECTION.format(model=model, size=size, extra=extra)
    else:
        raise UserError(f"unknown torchvision task {task!r}: classification, detection or segmentation")
    return _HEADER.format(zoo="torchvision", model=model, task=task) + body + _LOOP.format(batch=batch)


# --------------------------------------------------------------------------- timm

def timm_models(pattern: str) -> list[str]:
    require_zoo("timm")
    from opscope.fleet.tv_compat import import_torchvision

    import_torchvision()    # timm imports torchvision
    import timm

    names = timm.list_models(pattern)
    if not names:
        raise UserError(f"no timm model matches {pattern!r} (patterns are fnmatch-style, e.g. 'resnet1*')")
    return names


_TIMM = '''
from opscope.fleet.tv_compat import import_torchvision

import_torchvision()
import timm

NAME = {model!r}


def build():
    return timm.create_model(NAME, pretrained=False)


def train_loss(model, batch, device):
    channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
    images = torch.randn(batch, channels, height, width, device=device)
    labels = torch.randint(0, model.num_classes, (batch,), device=device)
    return F.cross_entropy(model(images), labels)
'''


def timm_script(model: str, batch: int = 2) -> str:
    return _HEADER.format(zoo="timm", model=model, task="classification") + _TIMM.format(model=model) \
        + _LOOP.format(batch=batch)


# --------------------------------------------------------------------------- transformers

_HF = '''
import importlib.util

if importlib.util.find_spec("torchvision"):     # transformers imports torchvision when it is installed
    from opscope.fleet.tv_compat import import_torchvision
    import_torchvision()
import transformers

MODEL_TYPE, OVERRIDES, HEAD, SEQ = {model_type!r}, json.loads({overrides!r}), {head!r}, {seq}


def build():
    config = transformers.AutoConfig.for_model(MODEL_TYPE, **OVERRIDES)
    auto = {{"causal-lm": transformers.AutoModelForCausalLM, "masked-lm": transformers.AutoModelForMaskedLM,
             "sequence-classification": transformers.AutoModelForSequenceClassification}}[HEAD]
    return auto.from_config(config)     # random weights, nothing downloaded


def train_loss(model, batch, device):
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, SEQ), device=device)
    if HEAD == "sequence-classification":
        labels = torch.randint(0, model.config.num_labels, (batch,), device=device)
    else:
        labels = ids
    return model(input_ids=ids, labels=labels).loss
'''

HF_HEADS = ("causal-lm", "masked-lm", "sequence-classification")


def transformers_script(model_type: str, overrides: dict | None = None, head: str = "causal-lm",
                        seq: int = 32, batch: int = 2) -> str:
    if head not in HF_HEADS:
        raise UserError(f"unknown transformers head {head!r}: choose from {', '.join(HF_HEADS)}")
    return (_HEADER.format(zoo="transformers", model=model_type, task=head) + "import json\n"
            + _HF.format(model_type=model_type, overrides=json.dumps(overrides or {}, sort_keys=True),
                         head=head, seq=int(seq))
            + _LOOP.format(batch=batch))


def safe_name(text: str) -> str:
    """A file-system-safe job name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return name or "job"
