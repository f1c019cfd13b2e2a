"""`oospec average-adapters`: one LoRA adapter whose weight update is the mean of several.

Runs of one recipe that differ in seed, data mix or length land close to each other, and the mean
of their weight updates often generalises better than any one of them (a "model soup", Wortsman et
al., 2022). With LoRA the update of a layer is `scale * B @ A` (scale = lora_alpha / r), and the
mean of products is not the product of means, so this averages the updates exactly and factors the
mean back into rank r with an SVD: `B = U sqrt(S)`, `A = sqrt(S) V^T`, largest r singular values.
`metrics.json` records, per input, the sha256 of its weights, and the largest and mean share of a
layer's mean update that the rank cut dropped (`svd_tail`, relative Frobenius norm: 0 means exact).

    oospec average-adapters --out DIR ADAPTER_DIR ADAPTER_DIR [...]

The inputs must be adapters of the same base model on the same layers. The output keeps the first
input's `adapter_config.json` (its r and lora_alpha unless `--r` changes the rank), so it loads
wherever that one does: `PeftModel.from_pretrained`, `Engine.from_pretrained(..., adapter=)`.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from .data import TrainDataError

WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"


def _read(path: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file
    if not path.is_dir():
        raise TrainDataError(f"adapter {path}: no such directory")
    for f in (CONFIG, WEIGHTS):
        if not (path / f).is_file():
            raise TrainDataError(f"adapter {path}: missing {f} (not a PEFT LoRA adapter directory)")
    cfg = json.loads((path / CONFIG).read_text())
    if cfg.get("peft_type") != "LORA":
        raise TrainDataError(f"adapter {path}: peft_type is {cfg.get('peft_type')!r}, only LORA can be averaged")
    return cfg, load_file(str(path / WEIGHTS))


def _pairs(path: Path, weights: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{layer prefix: (A, B)}; anything else in the file (biases, saved modules) is refused."""
    pairs, other = {}, []
    for k in weights:
        if ".lora_A." in k:
            kb = k.replace(".lora_A.", ".lora_B.")
            if kb not in weights:
                raise TrainDataError(f"adapter {path}: {k} has no matching lora_B weight")
            pairs[k.replace(".lora_A.", ".lora_{}.")] = (weights[k], weights[kb])
        elif ".lora_B." not in k:
            other.append(k)
    if other:
        raise TrainDataError(f"adapter {path}: weights other than LoRA A/B cannot be averaged: {other[:3]}")
    if not pairs:
        raise TrainDataError(f"adapter {path}: no LoRA weights in {WEIGHTS}")
    return pairs


def average_adapters(adapters: list, out, *, r: int | None = None) -> dict:
    """Write the adapter whose update is the mean of `adapters`' updates to `out`; return its metrics."""
    from safetensors.torch import save_file
    paths = [Path(a) for a in adapters]
    if len(paths) < 2:
        raise TrainDataError(f"average-adapters needs at least two adapters, got {len(paths)}")
    read = [_read(p) for p in paths]
    cfg0 = read[0][0]
    for p, (cfg, _) in zip(paths[1:], read[1:]):
        if cfg.get("base_model_name_or_path") != cfg0.get("base_model_name_or_path"):
            raise TrainDataError(f"adapter {p}: base model {cfg.get('base_model_name_or_path')!r} differs from "
                                 f"{paths[0]}'s {cfg0.get('base_model_name_or_path')!r}")
    pairs = [_pairs(p, w) for p, (_, w) in zip(paths, read)]
    for p, pr in zip(paths[1:], pairs[1:]):
        if pr.keys() != pairs[0].keys():
            diff = sorted(pr.keys() ^ pairs[0].keys())
            raise TrainDataError(f"adapter {p}: adapts other layers than {paths[0]}: {diff[0].format('*')}")
    rank = cfg0["r"] if r is None else r
    if rank < 1:
        raise TrainDataError(f"rank must be at least 1, got {rank}")
    scale_out = cfg0["lora_alpha"] / rank
    scales = [c["lora_alpha"] / c["r"] for c, _ in read]
    weights, tail = {}, []
    for key in pairs[0]:
        mean = sum(s * (b.double() @ a.double()) for s, pr in zip(scales, pairs) for a, b in [pr[key]]) / len(paths)
        u, sv, vh = torch.linalg.svd(mean, full_matrices=False)
        k = min(rank, sv.numel())
        tail.append(float(sv[k:].norm() / sv.norm().clamp_min(1e-30)))
        root = (sv[:k] / scale_out).sqrt()
        a, b = root[:, None] * vh[:k], u[:, :k] * root
        if k < rank:  # a layer narrower than the rank: pad with zero rows / columns
            a = torch.cat([a, a.new_zeros(rank - k, a.shape[1])])
            b = torch.cat([b, b.new_zeros(b.shape[0], rank - k)], dim=1)
        dtype = pairs[0][key][0].dtype
        weights[key.format("A")] = a.to(dtype).contiguous()
        weights[key.format("B")] = b.to(dtype).contiguous()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(cfg0 | {"r": rank}, indent=2) + "\n")
    metrics = {
        "kind": "average",
        "averaged": [{"path": str(p), "sha256": hashlib.sha256((p / WEIGHTS).read_bytes()).hexdigest(),
                      "metrics": _metrics(p)} for p in paths],
        "config": {"r": rank, "lora_alpha": cfg0["lora_alpha"], "target_modules": cfg0.get("target_modules")},
        "svd_tail": {"max": round(max(tail), 6), "mean": round(sum(tail) / len(tail), 6)},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _metrics(path: Path) -> dict | None:
    """The parts of an input's own metrics.json that say how it was trained."""
    f = path / "metrics.json"
    if not f.is_file():
        return None
    m = json.loads(f.read_text())
    keep = ("kind", "train", "examples", "augment", "init_adapter", "config", "steps", "train_seconds")
    return {k: m[k] for k in keep if k in m}


def add_parser(sub, name):
    import argparse
    p = sub.add_parser(name, help="average LoRA adapters of one base into one (exact mean update, SVD to rank r)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("adapters", nargs="+", help="two or more PEFT LoRA adapter directories")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--r", type=int, default=None, help="rank of the result (default: the first adapter's r)")
    p.set_defaults(run=_run)


def _run(args):
    from ..cli import print_json
    print_json(average_adapters(args.adapters, args.out, r=args.r))
