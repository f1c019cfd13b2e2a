"""Sidecar training rows: `sidecar.rows.expand_rows` labelled from a trace, packed into one sequence.

Row layout and tokenization come from `oospec_agents.sidecar.rows` (the one definition shared with
the runtime wave). Training adds two things:
- **labels for every row**: the function row's target is the called tool's name; the called tool's
  slot rows get their value or null; every slot row of a tool that was *not* called gets null;
- **packing**: the shared prefix once, then each row's suffix + target + eos, under an attention
  mask where a row sees the prefix and itself only -- exactly what the wave computes with its
  fanned-out KV cache, so no row sees another row's answer, and the prefix costs one forward.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from ..chat import normalize_messages
from ..sidecar.rows import Row, expand_rows
from ..tools import normalize_tools

NULL = " null"


def training_rows(messages, tools, call: dict | None, options=None) -> tuple[str, list[Row]]:
    """(prefix, rows) with every row labelled; uncalled tools' slot rows get null. `options`: the
    adapter's `RowOptions` (None: today's rows).

    `call=None` is a "no call" record (no offered tool fits): its one row is the function row,
    labelled null, which is what the wave's function row answers under tool_choice="auto" to decline.
    Its slot rows have no answer to learn, so they are left out."""
    msgs = normalize_messages(messages)
    tool_list = tools if tools and not isinstance(tools[0], dict) else normalize_tools(tools)
    if call is None:
        prefix, rows = expand_rows(msgs, tool_list, options=options)
        return prefix, [replace(r, target=NULL) for r in rows if r.kind == "function"]
    if call["name"] not in {t.name for t in tool_list}:
        raise ValueError(f"the trace calls {call['name']!r}, which is not among the offered tools")
    prefix, rows = expand_rows(msgs, tool_list, call, options)
    return prefix, [r if r.target is not None else replace(r, target=NULL) for r in rows]


@dataclass
class PackedExample:
    ids: list[int]
    prefix_len: int
    rows: list[tuple[int, int, int]]   # (start, n_suffix, n_target) of each row in `ids`
    kinds: list[str]

    def __len__(self):
        return len(self.ids)

    def positions(self) -> torch.Tensor:
        pos = list(range(self.prefix_len))
        for start, ns, nt in self.rows:
            pos += list(range(self.prefix_len, self.prefix_len + ns + nt))
        return torch.tensor([pos])

    def allowed(self) -> torch.Tensor:
        """[N, N] bool: causal over the prefix; a row's tokens see the prefix and their own row."""
        n, p = len(self.ids), self.prefix_len
        allowed = torch.zeros(n, n, dtype=torch.bool)
        allowed[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        for start, ns, nt in self.rows:
            m = ns + nt
            allowed[start:start + m, :p] = True
            allowed[start:start + m, start:start + m] = torch.ones(m, m, dtype=torch.bool).tril()
        return allowed

    def label_positions(self) -> tuple[list[int], list[int], list[int]]:
        """(positions whose logits predict a label, the labels, the row index of each)."""
        pos, lab, row = [], [], []
        for k, (start, ns, nt) in enumerate(self.rows):
            for j in range(nt):
                pos.append(start + ns - 1 + j)
                lab.append(self.ids[start + ns + j])
                row.append(k)
        return pos, lab, row


def pack(tokenizer, prefix: str, rows: list[Row], *, max_null_rows: int | None = None,
         rng: random.Random | None = None) -> PackedExample:
    """Pack labelled rows; keep at most `max_null_rows` of the uncalled tools' null rows (seeded)."""
    eos = tokenizer.eos_token_id
    called = next((r.target.strip() for r in rows if r.kind == "function"), None)
    keep = list(rows)
    if max_null_rows is not None:
        import json
        name = json.loads(called) if called else None
        other = [i for i, r in enumerate(rows) if r.kind == "slot" and r.tool != name]
        if len(other) > max_null_rows:
            drop = set((rng or random.Random(0)).sample(other, len(other) - max_null_rows))
            keep = [r for i, r in enumerate(rows) if i not in drop]
    ids = tokenizer.encode(prefix, add_special_tokens=False)
    p = len(ids)
    spans, kinds = [], []
    for r in keep:
        s = tokenizer.encode(r.suffix, add_special_tokens=False)
        t = tokenizer.encode(r.target, add_special_tokens=False) + [eos]
        spans.append((len(ids), len(s), len(t)))
        kinds.append(r.kind)
        ids += s + t
    return PackedExample(ids, p, spans, kinds)


def packed_loss(model, ex: PackedExample) -> torch.Tensor:
    """Mean over rows of each row's mean target cross-entropy, in one forward."""
    dev = model.device  # the CPU, or the GPU a model trains on
    x = torch.tensor([ex.ids], device=dev)
    pos, lab, row = ex.label_positions()
    out = model(input_ids=x, position_ids=ex.positions().to(dev), attention_mask=ex.allowed()[None, None].to(dev),
                logits_to_keep=torch.tensor(pos, device=dev))
    ce = torch.nn.functional.cross_entropy(out.logits[0].float(), torch.tensor(lab, device=dev), reduction="none")
    row_t = torch.tensor(row, device=dev)
    n_rows = len(ex.rows)
    per_row = torch.zeros(n_rows, device=dev).index_add(0, row_t, ce) / \
        torch.bincount(row_t, minlength=n_rows).clamp(min=1)
    return per_row.mean()
