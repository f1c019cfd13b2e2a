"""LoRA training with peft: prompt ids + target ids, loss on the target only.

Each example is (ids, n_target): the last `n_target` ids are the answer the loss is taken on, and
everything before them is the prompt. Because the answer is always a suffix, the forward asks the
model for only the last `n_target + 1` logits (`logits_to_keep`), which skips most of the lm_head
work on long tool prompts. Batches are gradient accumulation over single examples: no padding, so
a batch of any size gives the same gradient as one padded forward would.

Deterministic under `seed`: the example order, LoRA init and dropout all come from seeded RNGs,
and a checkpoint stores every RNG state so a resumed run continues the same trajectory.
"""
from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .data import TrainDataError

log = logging.getLogger(__name__)

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfigArgs:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    lr: float = 3e-4
    epochs: float = 1.0
    batch_size: int = 8
    seed: int = 0
    warmup: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    target_modules: tuple = DEFAULT_TARGETS
    log_every: int = 10
    checkpoint_every: int = 25
    max_steps: int | None = None   # stop after this many optimizer steps (smoke tests)
    threads: int | None = None
    autocast: str | None = "auto"  # "bf16" | None | "auto" (bf16 when the CPU has native bf16)
    #: packed sidecar examples: weigh each by its rows, so that the batch loss is the mean over all its
    #: rows and every row counts alike. Off (each example weighs alike, its rows sharing its weight), a
    #: "no call" example's one function row (null) weighs as much as all the rows of a call example,
    #: and the function row learns to decline (docs/training.md, run 20i).
    weigh_rows: bool = False


@dataclass
class TrainResult:
    steps: int
    examples_seen: int
    losses: list = field(default_factory=list)   # (step, mean loss over the last log window)
    seconds: float = 0.0
    resumed_from: int | None = None
    total_steps: int = 0                          # the run's planned steps (`stop_after` may end it sooner)


def example_weight(ex, cfg: LoraConfigArgs) -> float:
    """An example's share of its batch's loss, before normalising: 1, or its rows (`cfg.weigh_rows`,
    packed sidecar examples only)."""
    return float(len(ex.rows)) if cfg.weigh_rows and not isinstance(ex, tuple) else 1.0


def example_loss(model, ids, n_target: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of the last n_target ids given everything before them.

    `ids` may instead be a packed sidecar example (`train.rows.PackedExample`).
    """
    if n_target is None:
        from .rows import packed_loss
        return packed_loss(model, ids)
    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    out = model(input_ids=x, logits_to_keep=n_target + 1)
    logits = out.logits[0, :-1].float()          # positions L-n-1 .. L-2 predict ids L-n .. L-1
    labels = x[0, -n_target:]
    return torch.nn.functional.cross_entropy(logits, labels)


def _autocast(cfg: LoraConfigArgs, device_type: str = "cpu"):
    mode = cfg.autocast
    if mode == "auto":
        from ..models import cpu_supports_bf16
        mode = "bf16" if device_type == "cpu" and cpu_supports_bf16() else None
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=mode == "bf16")


def add_lora(model, cfg: LoraConfigArgs):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(cfg.seed)
    pcfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                      target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, pcfg)


def _order(n: int, epochs: float, seed: int) -> list[int]:
    order, ep = [], 0
    total = max(1, int(round(n * epochs)))
    while len(order) < total:
        idx = list(range(n))
        random.Random(seed * 1000 + ep).shuffle(idx)
        order += idx
        ep += 1
    return order[:total]


def _lr_at(step: int, total: int, cfg: LoraConfigArgs) -> float:
    warm = max(1, int(total * cfg.warmup))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def _save_checkpoint(peft_model, opt, step, result, ckpt_dir: Path, cfg: LoraConfigArgs):
    tmp = ckpt_dir.with_name(ckpt_dir.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(tmp))
    torch.save({"step": step, "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "result": asdict(result), "config": asdict(cfg)}, tmp / "trainer_state.pt")
    if ckpt_dir.exists():
        import shutil
        shutil.rmtree(ckpt_dir)
    tmp.rename(ckpt_dir)


def _resumed(peft_model, opt, ckpt_dir: Path) -> tuple[int, TrainResult]:
    """The step to go on from and the result so far: the checkpoint in `ckpt_dir` loaded into the model,
    the optimizer and torch's RNG; step 0 and a fresh result where there is none."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights
    if not (ckpt_dir / "trainer_state.pt").exists():
        log.warning("no checkpoint at %s; starting from scratch", ckpt_dir)
        return 0, TrainResult(steps=0, examples_seen=0)
    state = torch.load(ckpt_dir / "trainer_state.pt", weights_only=False)
    set_peft_model_state_dict(peft_model, load_peft_weights(str(ckpt_dir)))
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    result = TrainResult(**state["result"])
    result.resumed_from = state["step"]
    log.warning("resumed from %s at step %d", ckpt_dir, state["step"])
    return state["step"], result


def _train_step(peft_model, opt, params, batch: list, cfg: LoraConfigArgs, device_type: str) -> float:
    """One optimizer step over `batch` (each example's loss weighed by `example_weight`, the weights summing
    to 1); returns the batch's loss."""
    opt.zero_grad(set_to_none=True)
    batch_loss = 0.0
    weights = [example_weight(ex, cfg) for ex in batch]
    for ex, w in zip(batch, weights):
        with _autocast(cfg, device_type):
            loss = (example_loss(peft_model, *ex) if isinstance(ex, tuple)
                    else example_loss(peft_model, ex)) * (w / sum(weights))
        loss.backward()
        batch_loss += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    opt.step()
    return batch_loss


def train_lora(model, examples: list[tuple[list[int], int]], out_dir, cfg: LoraConfigArgs, *,
               checkpoint_dir=None, resume: bool = False, progress: bool = True, log_file=None,
               stop_after: int | None = None, init_adapter=None):
    """Train a LoRA on `examples`; save the adapter to `out_dir`. Returns (peft_model, TrainResult).

    The checkpoint (adapter, optimizer, RNG state, loss history) goes to `checkpoint_dir` (default:
    OUT-checkpoint next to OUT) every `cfg.checkpoint_every` steps; `resume=True` continues from it
    on the same trajectory. `stop_after` ends the run after that many steps with a checkpoint, as an
    interruption would (the schedule still spans the whole run).
    """
    from tqdm.auto import tqdm

    if not examples:
        raise TrainDataError("the training set is empty: no usable examples were built from the data")
    if cfg.threads:
        from ..sidecar.cores import set_threads  # every thread count is set in one place
        set_threads(cfg.threads)
    out_dir = Path(out_dir)
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else out_dir.with_name(out_dir.name + "-checkpoint")
    # Continue from a trained adapter (a second stage) unless a checkpoint is resumed; its r and targets
    # must match `cfg`.
    resuming = resume and (ckpt_dir / "trainer_state.pt").exists()
    peft_model = _trainable(model, cfg, None if resuming else init_adapter)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    order = _order(len(examples), cfg.epochs, cfg.seed)
    total_steps = math.ceil(len(order) / cfg.batch_size)
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    torch.manual_seed(cfg.seed)
    start, result = _resumed(peft_model, opt, ckpt_dir) if resume else (0, TrainResult(steps=0, examples_seen=0))

    losses = _LossLog(result, total_steps, cfg.log_every, log_file, progress)
    t0 = time.perf_counter()
    result.total_steps = total_steps
    bar = tqdm(total=total_steps, initial=start, disable=not progress, desc="train", unit="step")
    for step in range(start, total_steps):
        batch = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, total_steps, cfg)
        batch_loss = _train_step(peft_model, opt, params, [examples[i] for i in batch], cfg, model.device.type)
        result.steps = step + 1
        result.examples_seen += len(batch)
        bar.update(1)
        bar.set_postfix(loss=f"{batch_loss:.4f}")
        losses.add(step + 1, batch_loss, opt.param_groups[0]["lr"], result.seconds + time.perf_counter() - t0)
        stopping = stop_after is not None and step + 1 >= stop_after and step + 1 < total_steps
        if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < total_steps) or stopping:
            result.seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            _save_checkpoint(peft_model, opt, step + 1, result, ckpt_dir, cfg)
        if stopping:
            break
    bar.close()
    result.seconds += time.perf_counter() - t0
    losses.close()
    peft_model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir))
    return peft_model, result


def _trainable(model, cfg: LoraConfigArgs, init_adapter=None):
    """`model` with a fresh LoRA (`cfg`'s shape) in training mode; its weights `init_adapter`'s where given."""
    peft_model = add_lora(model, cfg)
    if init_adapter is not None:
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights
        set_peft_model_state_dict(peft_model, load_peft_weights(str(init_adapter)))
    peft_model.train()
    return peft_model


class _LossLog:
    """The loss curve of a run: the mean loss over each `log_every` steps (and the last) goes to
    `result.losses`, to `log_file` where given, and to the log where no progress bar shows."""

    def __init__(self, result: TrainResult, total_steps: int, log_every: int, log_file, progress: bool):
        self.result, self.total_steps, self.log_every, self.progress = result, total_steps, log_every, progress
        self.file = open(log_file, "a") if log_file else None
        self.window: list[float] = []

    def add(self, step: int, loss: float, lr: float, elapsed: float) -> None:
        """Step `step` (counted from 1) ended with `loss` at learning rate `lr`, `elapsed` seconds into the run."""
        self.window.append(loss)
        if step % self.log_every and step != self.total_steps:
            return
        mean = sum(self.window) / len(self.window)
        self.result.losses.append((step, round(mean, 5)))
        line = f"step {step}/{self.total_steps} loss {mean:.4f} lr {lr:.2e} elapsed {elapsed:.0f}s"
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
        if not self.progress:
            log.warning(line)
        self.window = []

    def close(self) -> None:
        if self.file:
            self.file.close()
