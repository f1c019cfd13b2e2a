"""`oospec train-target` and `oospec train-sidecar`: LoRA adapters for the embedded pair (or any base).

    oospec train-target  --base smollm2 --train ../shared/data/toolcalls/train.jsonl --out DIR
    oospec train-sidecar --base smollm2 --train ../shared/data/toolcalls/train.jsonl --dev ... --out DIR
"""
from __future__ import annotations

import argparse


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def _share(text: str) -> float:
    share = float(text)
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {share}")
    return share


def add_parser(sub, name):
    kind = "target" if name == "train-target" else "sidecar"
    help_ = ("train the tool-calling LoRA of a target (hermes calls, text after results, plain text)"
             if kind == "target" else "train the sidecar's slot-prediction LoRA on expanded wave rows")
    p = sub.add_parser(name, help=help_, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base", default="smollm2", help='base model: HF id, path, GGUF file; "smollm2" = embedded')
    p.add_argument("--train", required=True, nargs="+", action="extend", metavar="FILE_OR_GLOB",
                   help="training JSONL in the shared tool-call format: several files or globs (repeatable); "
                        "the records per source are reported")
    p.add_argument("--exclude-sources", default=None, metavar="A,B",
                   help="hold these whole sources out of training (an unseen-tools dev set, e.g. tooltalk,nestful)")
    p.add_argument("--dev", default=None, nargs="+", action="extend", metavar="FILE_OR_GLOB",
                   help="dev JSONL for the metrics file (several files or globs)")
    p.add_argument("--out", required=True, help="output directory for the adapter and metrics.json")
    p.add_argument("--teacher", default=None, help="teacher model; its greedy valid calls replace the ground truth")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.05)
    add_loop_options(p)
    p.add_argument("--limit", type=int, default=None, help="use only the first N training records")
    p.add_argument("--subsample", type=int, default=None, help="train on N examples drawn (seeded) from all")
    p.add_argument("--dev-limit", type=int, default=None, help="evaluate on at most N dev records per source")
    p.add_argument("--init-adapter", default=None, help="start from this trained adapter (a second stage)")
    if kind == "target":
        p.add_argument("--thinking", action="store_true",
                       help="a thinking target: smollm2-think's template, a <think> sentence before each answer")
        p.add_argument("--trim-tools", action="store_true",
                       help="a call example too long for --max-len keeps its called tools and as many others as fit")
        p.add_argument("--revalue", type=_count, default=0, metavar="N",
                       help="N extra call examples per record with the values its request spells out swapped")
        p.add_argument("--distract", type=_count, default=0, metavar="N",
                       help="N extra call examples per record offered fewer than 4 tools, with unrelated tools added")
    if kind == "sidecar":
        p.add_argument("--max-null-rows", type=int, default=6,
                       help="at most this many null rows of uncalled tools per record (seeded sample)")
        p.add_argument("--max-no-call-share", type=_share, default=None, metavar="F",
                       help='keep "no call" examples (meta.no_call) at most this share of all examples (seeded '
                            "sample); default: all of them")
        p.add_argument("--param-docs", action="store_true",
                       help="each slot row begins with its parameter's description, default and examples ("
                            "kept in the adapter's rows.json, so the runtime writes its rows alike)")
        p.add_argument("--weigh-rows", action="store_true",
                       help="every wave row weighs alike in the loss (an example weighs its rows), so that a "
                            '"no call" example\'s one null row does not weigh as much as a whole call example')
    p.set_defaults(run=lambda args: _run(args, kind))


def add_loop_options(p, *, epochs: float = 1.0) -> None:
    """The training loop's options (`train.lora`), shared by train-target, train-sidecar and adapt."""
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--epochs", type=float, default=epochs)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-len", type=int, default=1024, help="drop examples longer than this many tokens")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--dtype", default="float32", help="training dtype of the base weights")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--autocast", default="auto", choices=["auto", "bf16", "none"],
                   help="bf16 autocast for the forward (auto: when the CPU has native bf16)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop after this many steps with a checkpoint (the schedule still spans the whole run)")
    p.add_argument("--resume", action="store_true", help="continue from OUT-checkpoint if present")
    p.add_argument("--no-progress", action="store_true")


def loop_config(args, **lora):
    """`LoraConfigArgs` from `add_loop_options`' arguments; `lora`: r, alpha, dropout and the rest."""
    from .lora import LoraConfigArgs
    return LoraConfigArgs(lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
                          max_steps=args.max_steps, threads=args.threads,
                          autocast=None if args.autocast == "none" else args.autocast,
                          log_every=args.log_every, checkpoint_every=args.checkpoint_every, **lora)


def _run(args, kind):
    from ..cli import print_json
    cfg = loop_config(args, r=args.r, alpha=args.alpha, dropout=args.dropout,
                      weigh_rows=getattr(args, "weigh_rows", False))
    common = dict(base=args.base, train=args.train, dev=args.dev, out=args.out, teacher=args.teacher, cfg=cfg,
                  max_len=args.max_len, limit=args.limit, subsample=args.subsample, dev_limit=args.dev_limit,
                  dtype=args.dtype, resume=args.resume, progress=not args.no_progress, init_adapter=args.init_adapter,
                  stop_after=args.stop_after,
                  exclude_sources=args.exclude_sources.split(",") if args.exclude_sources else None)
    if kind == "sidecar":
        common.update(max_null_rows=args.max_null_rows, max_no_call_share=args.max_no_call_share,
                      param_docs=args.param_docs)
    if kind == "target":
        from .run import train_target
        common.update(trim_tools=args.trim_tools, revalue=args.revalue, distract=args.distract,
                      thinking=args.thinking)
        metrics = train_target(**common)
    else:
        from .sidecar_train import train_sidecar
        metrics = train_sidecar(**common)
    print_json(metrics)
