"""Loading an engine: its target and sidecar from references, and where each runs (devices, core sets).
`Engine.from_pretrained` is `from_pretrained` here."""
from __future__ import annotations

import os

from .chat import require_chat_template
from .gcheap import freeze_gc_heap
from .sidecar import cores, layout


def from_pretrained(cls, target="embedded", sidecar=None, *, target_device=None, sidecar_device=None,
                    dtype=None, **kw):
    """`Engine.from_pretrained` (its docstring says what each argument does): an engine of class `cls`."""
    from . import models
    t_where, s_where = places(sidecar, target_device, sidecar_device, kw)
    t_dev, s_dev = t_where.device, s_where.device
    adapter = kw.pop("adapter", None)
    chat_template = kw.pop("chat_template", None)
    freeze_gc = kw.pop("freeze_gc", True)
    sidecar_kw = {k: kw.pop(k) for k in list(kw) if k.startswith("sidecar_")}
    name = None
    if str(target) == models.EMBEDDED_THINKING_REF:  # the embedded target taught to think before it answers
        target, name = "embedded", "embedded-thinking:SmolLM2-135M-Instruct"
        adapter = models.EMBEDDED_THINKING_ADAPTER if adapter is None else adapter
        chat_template = models.THINKING_CHAT_TEMPLATE if chat_template is None else chat_template
    if str(target) == "embedded" and adapter is None and models.EMBEDDED_TARGET_ADAPTER.exists():
        adapter = models.EMBEDDED_TARGET_ADAPTER
    model, tok = models.load_model(target, device=t_dev, dtype=models.resolve_dtype(dtype, t_dev), adapter=adapter,
                                   chat_template=chat_template)
    require_chat_template(tok)  # before a sidecar loads for nothing
    sidecar = "embedded" if sidecar is None else None if sidecar is False else sidecar
    side = load_sidecar(sidecar, s_where, models.resolve_dtype(dtype, s_dev), sidecar_kw)
    name = name or ("embedded:SmolLM2-135M-Instruct" if str(target) == "embedded" else str(target))
    engine = cls(model, tok, side, model_name=name, target_cores=t_where.cores, **kw)
    if t_where.cores is not None:  # loaded on every core; decodes on its own
        engine.pin_target_cores()
    if freeze_gc:
        freeze_gc_heap()
    return engine


def places(sidecar, target_device, sidecar_device, kw: dict) -> tuple[cores.Place, cores.Place]:
    """Where the target and the sidecar run: the devices asked for (or the defaults), and on a CPU the
    core sets (`sidecar_placement="auto"` may split the cores, `auto_layout`); checked before anything loads."""
    from . import models
    t_where, s_where = (None if d is None else cores.place(d) for d in (target_device, sidecar_device))
    t_dev, s_dev = models.default_devices(*(None if w is None else w.device for w in (t_where, s_where)))
    t_where, s_where = (cores.Place(dev, None if w is None else w.cores)
                        for dev, w in ((t_dev, t_where), (s_dev, s_where)))
    if target_device is None and sidecar_device is None:  # where auto finds a split faster, a split
        t_where, s_where = auto_layout(sidecar, t_where, kw) or (t_where, s_where)
    cores.check_split(t_where, s_where)
    return t_where, s_where


def load_sidecar(ref, where: cores.Place, dtype, sidecar_kw: dict):
    """A model reference is loaded; an object is taken as the sidecar itself (checked by `Engine`)."""
    if ref is None or not isinstance(ref, (str, os.PathLike)):
        return ref
    from .sidecar.load import load_sidecar as load
    return load(ref, device=str(where), dtype=dtype, **sidecar_kw)


def auto_layout(sidecar, target: cores.Place, kw: dict) -> tuple[cores.Place, cores.Place] | None:
    """Core sets for the target and the sidecar when `sidecar_placement="auto"` on a CPU finds a split
    faster than sharing every core (sidecar/layout.py); None keeps both on every core."""
    if sidecar is False or not isinstance(sidecar, (str, os.PathLike, type(None))) or target.device.type != "cpu":
        return None
    if kw.get("sidecar_placement", "auto") != "auto":
        return None
    return layout.auto_places()

