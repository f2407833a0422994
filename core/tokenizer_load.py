"""Loading a tokenizer by its class, in a process that should not import torch.

`AutoTokenizer` resolves a folder's tokenizer class through transformers' auto classes, which import torch
(measured on a 2-core AMD EPYC: 8.8-9.5 CPU-s for the default model's tokenizer, torch imported; its own class's
`from_pretrained`: 2.3 CPU-s, torch not imported). A process that has loaded it once (the driver) names that
class (`class_path`) and sends the name, a few bytes; the other process (an env pool) loads the same class from
the same folder (`load`), as `AutoTokenizer` itself would after resolving it: the same tokenizer, the same ids.

Sending the loaded tokenizer instead costs about as much to unpickle, but its 3 MB pickle is bigger than what
Ray passes inline, so Ray keeps it in the object store, and an actor restarted from such arguments may fail
to start if they are lost (Ray logs an error for every such actor, ray-project/ray#53727).
"""
from __future__ import annotations

import importlib
from typing import Any


def class_path(tokenizer: Any) -> str:
    """`module:QualName` of a loaded tokenizer's class."""
    cls = type(tokenizer)
    return f"{cls.__module__}:{cls.__qualname__}"


def load(tokenizer_dir: str, cls_path: str = "") -> Any:
    """The tokenizer in `tokenizer_dir`, through the class `cls_path` names (`class_path`), or through
    `AutoTokenizer` when it is empty."""
    if not cls_path:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer_dir)
    module, sep, name = cls_path.partition(":")
    try:
        if not sep or not module or not name:
            raise ValueError("expected module:ClassName")
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"tokenizer class {cls_path!r}: {exc}") from None
    if not callable(getattr(cls, "from_pretrained", None)):
        raise ValueError(f"tokenizer class {cls_path!r} has no from_pretrained")
    return cls.from_pretrained(tokenizer_dir)
