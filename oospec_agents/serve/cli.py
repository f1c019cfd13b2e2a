"""`oospec serve`: the OpenAI-compatible server, on this machine (uvicorn) or as Ray Serve replicas."""
from __future__ import annotations

import logging
import os

from ..batching import DEFAULT_MAX_BATCH
from ..chat import read_chat_template
from ..engine import METHODS
from ..models import read_adapter
from ..sidecar.load import PLACEMENTS
from .app import DEFAULT_MAX_BODY_BYTES


def add_parser(sub, name):
    p = sub.add_parser(name, help="serve OpenAI Chat Completions and Responses (tools, streaming) over the engine",
                       description=__doc__)
    p.add_argument("--model", default="embedded", help="the target: HF id, local dir, GGUF file, or 'embedded'")
    side = p.add_mutually_exclusive_group()
    side.add_argument("--sidecar", default=None, help="sidecar model (default: the embedded one, for every target)")
    side.add_argument("--no-sidecar", action="store_true",
                      help="load no sidecar: method 'oospec' decodes as 'toolspec'")
    p.add_argument("--served-model-name", default=None,
                   help="the id clients pass as `model` (default: the --model value)")
    p.add_argument("--sidecar-adapter", default=None, metavar="DIR",
                   help="the sidecar's LoRA adapter (default: the embedded sidecar's own), e.g. from `oospec adapt`")
    p.add_argument("--adapter-root", default=None, metavar="DIR",
                   help="allow POST /v1/oospec/sidecar-adapter to swap in adapter directories under DIR at run "
                        "time (needs --api-key; docs/server.md)")
    p.add_argument("--target-device", default=None)
    p.add_argument("--sidecar-device", default=None)
    p.add_argument("--sidecar-placement", default=None, choices=PLACEMENTS,
                   help="where the sidecar's waves run: a thread, a worker process of its own, a Ray actor of "
                        "its own (with --ray: on a GPU of its own), or auto (a process for a CUDA sidecar, a "
                        "thread on the CPU; the default)")
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: bf16 where supported)")
    p.add_argument("--prefix-cache-tokens", type=int, default=None,
                   help="KV of recent prompts kept for reuse, in tokens (0 turns it off; default: the engine's)")
    p.add_argument("--deterministic", action="store_true",
                   help="the same request gives the same tokens whatever the method, draft tree and concurrency, "
                        "in bf16 too (Engine(deterministic=True); docs/deterministic.md)")
    p.add_argument("--call-log", default=None, metavar="PATH",
                   help="append every reply whose calls all fit their schemas to this JSONL file, as training "
                        "records for the sidecar (it stores prompts; created 0600; docs/call-log.md)")
    p.add_argument("--call-log-max-mb", type=float, default=None, help="the call log's bound (oldest records dropped)")
    p.add_argument("--call-log-tool-results", action="store_true",
                   help="keep tool results in the call log (left out by default)")
    p.add_argument("--chat-template", default=None, metavar="PATH_OR_STRING",
                   help="a Jinja chat template, or a file holding one, replacing the target tokenizer's own "
                        "(needed when it has none, e.g. Gemma 3 270M: oospec_agents/templates/gemma3.jinja)")
    p.add_argument("--method", default="oospec", choices=METHODS,
                   help="decoding method when a request names none (all give the same tokens)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at startup)")
    p.add_argument("--api-key", default=os.environ.get("OOSPEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/ (default: $OOSPEC_API_KEY, else none)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait behind those being decoded; more get 429 (default 64)")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help="requests decoded at once, their verify forwards shared (the engine's batched rounds; "
                        f"default {DEFAULT_MAX_BATCH}; 1: one at a time)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"larger request bodies get 413 (default {DEFAULT_MAX_BODY_BYTES})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    ray = p.add_argument_group("Ray Serve (beyond one process or machine)")
    ray.add_argument("--ray", action="store_true", help="run as a Ray Serve application, one engine per replica")
    scale = ray.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=int, default=None, help="a fixed number of replicas (default 1)")
    scale.add_argument("--autoscale", metavar="MIN,MAX", default=None, help="autoscale between MIN and MAX replicas")
    ray.add_argument("--ray-address", default=None,
                     help="cluster to join (default: $RAY_ADDRESS, a local `ray start` cluster, or a new one)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.set_defaults(run=run)


def run(args):
    if args.max_queue < 0:
        raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if (args.replicas is not None or args.autoscale is not None) and not args.ray:
        raise ValueError("--replicas and --autoscale need --ray")
    load = {"target": args.model, "sidecar": False if args.no_sidecar else args.sidecar,
            "target_device": args.target_device,
            "sidecar_device": args.sidecar_device, "dtype": args.dtype, "max_batch": args.max_batch}
    if args.prefix_cache_tokens is not None:
        load["prefix_cache_tokens"] = args.prefix_cache_tokens
    if args.sidecar_adapter is not None:
        if args.no_sidecar:
            raise ValueError("--sidecar-adapter needs a sidecar; drop --no-sidecar")
        read_adapter(args.sidecar_adapter, base=args.sidecar or "embedded")  # a bad one fails before the server starts
        load["sidecar_adapter"] = os.path.abspath(args.sidecar_adapter)  # a Ray replica's working directory differs
    if args.adapter_root is not None:
        if not args.api_key:
            raise ValueError("--adapter-root needs --api-key: the admin call that swaps the sidecar's adapter "
                             "is served only with a key")
        if not os.path.isdir(args.adapter_root):
            raise ValueError(f"--adapter-root {args.adapter_root!r} is not a directory")
    if args.sidecar_placement is not None:
        load["sidecar_placement"] = args.sidecar_placement
    if args.deterministic:  # every engine the server builds (a Ray replica's too) gets it
        load["deterministic"] = True
    if args.call_log is not None:  # every engine the server builds appends to it (flock-shared)
        load["call_log"] = args.call_log
        if args.call_log_max_mb is not None:
            load["call_log_max_mb"] = args.call_log_max_mb
        if args.call_log_tool_results:
            load["call_log_tool_results"] = True
    elif args.call_log_max_mb is not None or args.call_log_tool_results:
        raise ValueError("--call-log-max-mb and --call-log-tool-results need --call-log PATH")
    if args.chat_template is not None:
        text = read_chat_template(args.chat_template)  # a bad path fails before the server starts
        # Ray replicas may run where this machine's files are not: they get the text itself
        load["chat_template"] = text if args.ray else args.chat_template
    options = {"model": args.served_model_name or args.model, "api_key": args.api_key, "max_queue": args.max_queue,
               "max_batch": args.max_batch,
               "max_body_bytes": args.max_body_bytes, "method": args.method,
               "adapter_root": args.adapter_root and os.path.abspath(args.adapter_root)}
    if args.ray:
        autoscale = parse_autoscale(args.autoscale)
        from .ray_app import serve_forever
        return serve_forever(load, options, host=args.host, port=args.port, replicas=args.replicas,
                             autoscale=autoscale, address=args.ray_address, cpus_per_replica=args.cpus_per_replica)
    import uvicorn

    from ..engine import Engine
    from .app import create_app
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(name)s: %(message)s")
    app = create_app(loader=lambda: Engine.from_pretrained(**load), **options)
    # The engine loads on a thread after startup; until then requests get 503.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10)
    return 0


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--autoscale takes MIN,MAX (two integers), got {text!r}") from None
    if not 0 <= lo <= hi or hi < 1:
        raise ValueError(f"--autoscale MIN,MAX needs 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return lo, hi
