"""`oospec bench`: compare decoding methods on tool-call records and write results.json, report.md, speedup.png."""
from __future__ import annotations

import logging
from pathlib import Path

from . import alpha
from .agent import AGENT_METHODS
from .methods import METHODS

log = logging.getLogger(__name__)


def add_parser(sub, name):
    # allow_abbrev=False: a prefix of a flag is no flag (`--agent` was once taken for `--agent-loop`)
    p = sub.add_parser(name, help="benchmark ar / hf_generate / prompt_lookup / assisted / toolspec / oospec / oracle / suffix",
                       description=__doc__, allow_abbrev=False)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="FILE.jsonl",
                     help="your records, one JSON object a line (docs/own-model.md#records), e.g. a call log")
    src.add_argument("--bfcl", metavar="DIR", nargs="?", const="",
                     help="BFCL's own data dir (BFCL_v*_*.json plus possible_answer/); with no DIR, the bfcl-eval "
                          "package's (installed, else its wheel fetched once through pip without its dependencies)")
    p.add_argument("--sources", default=None, metavar="A,B",
                   help="bench only the records of these sources (e.g. the unseen-tools sources of train-extra.jsonl)")
    p.add_argument("--limit", type=int, default=None, help="take N records, spread round-robin over sources")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from {','.join(METHODS)} (ar always runs: it is the reference; default: "
                        f"all); with --agent from {','.join(AGENT_METHODS)} (default: all three)")
    p.add_argument("--out", default="bench-out", metavar="DIR")
    p.add_argument("--target", default="embedded",
                   help="HF id, local dir, GGUF file, 'embedded', or 'embedded-thinking' (see --thinking)")
    p.add_argument("--thinking", action="store_true",
                   help="bench the thinking target: --target embedded-thinking (it reasons in a <think> block "
                        "before it calls); the report adds the answer part, after the reasoning")
    p.add_argument("--sidecar", default=None,
                   help="sidecar model (default: the embedded one, for every target; 'none' loads none)")
    p.add_argument("--sidecar-adapter", default=None, metavar="DIR",
                   help="the sidecar's LoRA adapter (default: the embedded one for --sidecar embedded)")
    p.add_argument("--sidecar-prior-weight", type=float, default=None, metavar="W",
                   help="weight of the lexical prior over the tools in the sidecar's function row (default: the "
                        "engine's, sidecar/wave.py PRIOR_WEIGHT; 0: none)")
    p.add_argument("--assistant", default=None,
                   help="draft model for 'assisted' (default: the embedded base model for target=embedded, "
                        "else --sidecar)")
    p.add_argument("--target-device", default=None,
                   help="cuda:0, cpu, or with --layout split a core set (cpu:0-5; default: all cores but the last)")
    p.add_argument("--sidecar-device", default=None,
                   help="cuda:1, cpu, or with --layout split a core set (cpu:6-7; default: the last core)")
    p.add_argument("--layout", choices=("shared", "split", "both"), default="shared",
                   help="on a CPU: shared (the target on every core, the sidecar beside it, the pay-back rule "
                        "judging its wave), split (the target on one core set, the sidecar's worker process on "
                        "another: rows toolspec@split and oospec@split in place of toolspec and oospec), or both "
                        "(each row of the two layouts, side by side in one run; ar runs on every core)")
    p.add_argument("--sidecar-placement", default=None, choices=("auto", "thread", "process", "ray"),
                   help="where the sidecar's wave runs (default: the engine's, 'auto')")
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: bf16 where supported)")
    p.add_argument("--tool-choice", default=None,
                   help="required (default: every record expects a call, so the opener is forced alike for "
                        "every method), auto, or a tool name; --agent always asks with auto; with --backend vllm: "
                        "auto (default), required, named (each record's expected tool) or a tool name, held as "
                        "vLLM's server holds them (docs/vllm.md)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="per reply (default 256: the longest expected dev reply is about 180 tokens)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for prompt_lookup")
    p.add_argument("--wave-payback", type=_payback, default=None, metavar="SHARE|off",
                   help="the pay-back rule for a sidecar on the target's CPU: run its wave only when its expected "
                        "seconds are at most SHARE of the expected decode (default: the engine's, "
                        "sidecar/payback.py); 'off' always runs it and still records the estimates")
    p.add_argument("--hint-first", action="store_true",
                   help="a measuring aid: the target waits for the sidecar's wave before it decodes, so every hint "
                        "is in time: target forwards as with a sidecar always in time (its own accelerator), "
                        "whatever this machine's cores do; oospec's wall clock is then no speed figure")
    p.add_argument("--hint-follow-up", choices=("auto", "on", "off"), default="auto",
                   help="ask the sidecar again, for the function the target writes, when the hint calls another "
                        "(Engine(hint_follow_up=...); auto: only where the sidecar has cores of its own)")
    p.add_argument("--max-draft-nodes", type=_positive, default=None, metavar="N",
                   help="the most tree nodes (root included) a round verifies, for every method "
                        "(Engine(max_draft_nodes=...); default 48; docs/bench.md, \"The tree budget on a CPU\")")
    p.add_argument("--deterministic", action="store_true",
                   help="Engine(deterministic=True): the same tokens whatever the method (docs/deterministic.md)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads before loading")
    p.add_argument("--no-warmup", action="store_true")
    scenario = p.add_mutually_exclusive_group()
    scenario.add_argument("--warm-tools", dest="scenario", action="store_const", const="warm_tools",
                          help="before each measured request, serve one with the same tools and another user "
                               "message (prompt prefix cached, question not); report warm and cold side by side")
    scenario.add_argument("--agent-loop", dest="scenario", action="store_const", const="agent_loop",
                          help="measure turn 2 of each record: its expected call's tool result appended, "
                               "tool_choice=auto; report it with turn 1 cached (warm) and not (cold)")
    scenario.add_argument("--history", dest="scenario", action="store_const", const="history",
                          help="keep each method's retrieval memory across the records, in record order (each "
                               "method recalls its own replies to the earlier records, per tool set): "
                               "cross-request drafting, as a deployment's call memory sees it")
    agent = p.add_argument_group("agent episodes (docs/bench-agent.md)")
    agent.add_argument("--agent", action="store_true",
                       help="bench multi-step agent episodes with simulated tools instead of single replies: "
                            "methods toolspec, oospec, oospec+tools (speculative tool execution); results.json "
                            "has agent wall, model, tool and hidden seconds per episode")
    agent.add_argument("--tool-latency", type=_latency, default=None, metavar="S|lognormal:MEDIAN",
                       help="with --agent: each simulated tool call's seconds, fixed (0.25, 1, 2) or log-normal "
                            "with that median (lognormal:0.5; seeded per record, step and call, the same for "
                            "every method); default 1")
    agent.add_argument("--max-steps", type=_positive, default=4, metavar="N",
                       help="with --agent: an episode ends after N replies, or at a reply without calls (default 4)")
    agent.add_argument("--mcp", nargs="?", const="stdio", choices=("stdio", "http"), default=None,
                       help="with --agent: serve the tools from a real MCP server process (stdio, the default, or "
                            "streamable HTTP on 127.0.0.1), annotated read-only or destructive by name (docs/mcp.md); "
                            "only its read-only tools start early; results.json adds unsafe_early per method")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sample at temperature T (engine methods only: ar, toolspec, oospec); every method draws "
                        "with the same seed per record (--seed + the record's index), so where the target's "
                        "logits agree bit for bit the methods give the same tokens, and `lossless` checks it")
    p.add_argument("--seed", type=int, default=0, help="with --temperature: the first record's seed")
    p.add_argument("--strict", action="store_true",
                   help="also run each engine method in --methods (ar, toolspec, oospec) strict, under the grammar "
                        "of valid calls, as ar+strict, toolspec+strict, oospec+strict in the same interleaved "
                        "loop; they are checked against ar+strict (the masked reference), timed over ar, and "
                        "report.md sets each beside its non-strict run; with --backend vllm: every tool strict "
                        "under vLLM's hermes structural tag (VLLM_ENFORCE_STRICT_TOOL_CALLING)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no report on stdout")
    p.add_argument("--server", metavar="URL", default=None,
                   help="measure one engine method (--methods ar|toolspec|oospec) end to end through a running "
                        "`oospec serve` at URL instead of in process: median and p95 per request")
    p.add_argument("--api-key", default=None, help="with --server: the server's --api-key")
    p.add_argument("--concurrency", type=_levels, default=None, metavar="LEVELS",
                   help="a load bench instead (docs/bench-load.md): the same requests served one after another, "
                        "then by N client threads at once for each N of LEVELS (comma-separated, e.g. 1,2,4,8); "
                        "requests/s, tokens/s, p50/p95 latency, target forwards and batch per level; "
                        "--methods from ar,toolspec,oospec; --agent-loop measures turn 2 with turn 1 cached; "
                        "with --server, against that server; with --backend vllm: N requests kept in flight in "
                        "vLLM for each N (its own batching), steps and tokens/s per method")
    p.add_argument("--backend", choices=("engine", "vllm"), default="engine",
                   help="vllm: the records through vLLM (from .venv-vllm; docs/vllm.md), --methods from "
                        "vllm-ar,vllm-ngram,vllm-suffix,vllm-oospec")
    p.add_argument("--num-speculative-tokens", type=int, default=8, metavar="K", help="with --backend vllm: k")
    p.set_defaults(run=run, scenario="cold")
    global _PARSER
    _PARSER = p


def run(args):
    if args.backend == "vllm":
        from .vllm_backend import run_cli
        return run_cli(args, _records(args))
    if args.concurrency is not None:
        return run_load(args)
    if args.agent:
        return run_agent(args)
    if args.tool_latency is not None or args.max_steps != 4:
        raise ValueError("--tool-latency and --max-steps set up agent episodes: add --agent")
    if args.mcp:
        raise ValueError("--mcp serves agent episodes' tools from an MCP server: add --agent")
    args.methods = args.methods or ",".join(METHODS)
    args.tool_choice = args.tool_choice or "required"
    if args.server:
        return run_server(args)
    from .report import write_all
    from .runner import BenchConfig, check_methods, run_bench

    methods = check_methods([m.strip() for m in args.methods.split(",") if m.strip()])
    records = _records(args)
    engine, split_engine, sidecar = _engines(args)
    methods = _with_layout(methods, args.layout)
    if "oospec" in methods:
        _check_sidecar(engine, sidecar)
    assistant, assistant_tok = _load_assistant(args, engine) if "assisted" in methods else (None, None)
    config = BenchConfig(tuple(methods), args.tool_choice, args.max_new_tokens, args.prompt_lookup_tokens,
                         warmup=not args.no_warmup, progress=not args.quiet, scenario=args.scenario,
                         strict=args.strict, temperature=args.temperature or None, seed=args.seed)
    results = run_bench(engine, records, config, assistant=assistant, assistant_tokenizer=assistant_tok,
                        data=_data_label(args) + (f" (sources {args.sources})" if args.sources else ""),
                        split_engine=split_engine)
    return _write(results, args, write_all)


def _write(results: dict, args, write_all) -> int:
    """Save a run's files (`write_all`: the decode bench's or the agent bench's), show the report unless --quiet."""
    results["config"]["hint_first"] = args.hint_first
    paths = write_all(results, args.out)
    if drawn := alpha.plot(results, Path(args.out) / "alpha.png"):
        paths["alpha_plot"] = drawn  # the hint's α per source (alpha.py), where matplotlib is installed
    if not args.quiet:
        print(paths["report"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _records(args) -> list[dict]:
    """The records to bench: --data or --bfcl, only --sources' (a source with none is an error naming
    it), --limit of them spread over the sources."""
    from ..data import only_sources
    from .bfcl import bfcl_data, read_bfcl
    from .records import load_records, spread
    where = args.data if args.bfcl is None else args.bfcl or bfcl_data()
    records = load_records(where) if args.bfcl is None else read_bfcl(where)
    return spread(only_sources(records, args.sources, where) if args.sources else records, args.limit)


def _data_label(args) -> str:
    """Where the records came from, as results.json and the report name it."""
    if args.bfcl is None:
        return args.data
    from .bfcl import BFCL_WHEEL
    return args.bfcl or f"{BFCL_WHEEL.requirement} (the package's data)"


def _engines(args):
    """(engine, split engine or None, the --sidecar asked for) as the flags say: the target and sidecar
    loaded once, the split layout's engine on the same target model, --hint-first wrapping each sidecar."""
    from ..engine import Engine
    if args.thinking:
        if args.target not in ("embedded", "embedded-thinking"):
            raise ValueError(f"--thinking benches the embedded thinking target; drop it with --target {args.target!r}")
        args.target = "embedded-thinking"
    if args.threads:
        from ..sidecar.cores import set_threads  # every thread count is set in one place
        set_threads(args.threads)
    options = {} if args.wave_payback is None else {"wave_payback": args.wave_payback}
    if args.sidecar_placement:
        options["sidecar_placement"] = args.sidecar_placement
    if args.sidecar_adapter:
        options["sidecar_adapter"] = args.sidecar_adapter
    if args.sidecar_prior_weight is not None:
        options["sidecar_prior_weight"] = args.sidecar_prior_weight
    if args.hint_follow_up != "auto":
        options["hint_follow_up"] = args.hint_follow_up == "on"
    if args.max_draft_nodes is not None:
        options["max_draft_nodes"] = args.max_draft_nodes
    if args.deterministic:
        options["deterministic"] = True
    sidecar = False if isinstance(args.sidecar, str) and args.sidecar.lower() == "none" else args.sidecar
    shared = args.layout == "shared"
    engine = Engine.from_pretrained(args.target, sidecar, target_device=args.target_device if shared else None,
                                    sidecar_device=args.sidecar_device if shared else None, dtype=args.dtype, **options)
    split_engine = None if shared else _split_engine(engine, args, sidecar, options)
    if args.hint_first:
        from ..sidecar.protocol import HintFirst
        engine, split_engine = (e.with_parts(sidecar=HintFirst(e.sidecar)) if e is not None and e.sidecar is not None
                                else e for e in (engine, split_engine))
    return engine, split_engine, sidecar


def _check_sidecar(engine, sidecar) -> None:
    """Method `oospec` was asked for: the sidecar must have loaded, unless --sidecar none said it need not."""
    if sidecar is not False and engine.sidecar is None:
        # Without a sidecar `oospec` decodes as `toolspec`: a bench that compares them would say nothing.
        raise RuntimeError("method 'oospec' needs a sidecar, and none was loaded (see the warning above: is the "
                           "'embedded' extra, with peft, installed?); pass --sidecar none to bench oospec without one")


def run_agent(args):
    """`--agent`: multi-step episodes with simulated tools (agent.py), written by agent_report.py."""
    from ..data import load_records as load_all
    from .agent import AgentConfig, check_methods, engine_method, run_agent_bench
    from .agent_report import write_all
    from .agent_tools import Latency, recorded_results

    if args.scenario != "cold" or args.server or args.strict or args.temperature or args.bfcl is not None:
        raise ValueError("--agent runs its own episodes in process, greedy, on --data records: drop --warm-tools, "
                         "--agent-loop, --history, --server, --strict, --temperature and --bfcl")
    if args.tool_choice not in (None, "auto"):
        raise ValueError(f"--agent asks every step with tool_choice=auto, as an agent loop does; drop --tool-choice "
                         f"{args.tool_choice}")
    names = [m.strip() for m in (args.methods or ",".join(AGENT_METHODS)).split(",") if m.strip()]
    methods = check_methods(names, args.layout)
    records = _records(args)
    engine, split_engine, sidecar = _engines(args)
    if any(engine_method(m) == "oospec" for m in methods):
        _check_sidecar(engine, sidecar)
    latency = args.tool_latency or Latency(1.0)
    config = AgentConfig(tuple(methods), latency, args.max_steps, args.max_new_tokens, warmup=not args.no_warmup,
                         progress=not args.quiet, mcp=args.mcp)
    data = args.data + (f" (sources {args.sources})" if args.sources else "")
    results = run_agent_bench(engine, records, config, results=recorded_results(load_all(args.data)),
                              split_engine=split_engine, data=data)
    return _write(results, args, write_all)


def _latency(text: str):
    """--tool-latency: seconds >= 0, or lognormal:MEDIAN[:SIGMA] (agent_tools.Latency.parse)."""
    from .agent_tools import Latency
    try:
        return Latency.parse(text)
    except ValueError as e:
        import argparse
        raise argparse.ArgumentTypeError(str(e).removeprefix("--tool-latency: ")) from None


def _with_layout(methods: list[str], layout: str) -> list[str]:
    """`--layout split` runs `toolspec` and `oospec` as their `@split` rows; `both` runs each twice."""
    from .methods import SPLIT, SPLIT_SUFFIX
    if layout == "shared":
        return methods
    out = []
    for m in methods:
        if layout == "both" or m + SPLIT_SUFFIX not in SPLIT:
            out.append(m)
        if m + SPLIT_SUFFIX in SPLIT:
            out.append(m + SPLIT_SUFFIX)
    return out


def _split_engine(engine, args, sidecar, options: dict):
    """The same target model on a core set of its own (pinned while it decodes), and the sidecar in a
    worker process pinned to another core set."""
    from ..engine import Engine
    from ..sidecar.cores import split_cores
    from ..sidecar.load import load_sidecar
    target, side_cores = split_cores(args.target_device, args.sidecar_device)
    sidecar_kw = {k: v for k, v in options.items() if k.startswith("sidecar_") and k != "sidecar_placement"}
    engine_kw = {k: v for k, v in options.items() if not k.startswith("sidecar_")}
    side = None if sidecar is False else load_sidecar(sidecar or "embedded", device=str(side_cores),
                                                      dtype=engine.target.dtype, sidecar_placement="process",
                                                      **sidecar_kw)
    return Engine(engine.target, engine.tokenizer, side, model_name=engine.model_name, target_cores=target.cores,
                  **engine_kw)


def _positive(text: str) -> int:
    """--max-draft-nodes: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        import argparse
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n


def _payback(text: str) -> float:
    """--wave-payback: a ratio > 0, or 'off' (an infinite ratio: never skip, still estimate)."""
    if text == "off":
        return float("inf")
    try:
        ratio = float(text)
    except ValueError:
        ratio = 0.0
    if not ratio > 0:
        import argparse
        raise argparse.ArgumentTypeError(f"expected a ratio > 0 or 'off', got {text!r}")
    return ratio


def _load_assistant(args, engine):
    """The draft model for `assisted`, on the target's device; its tokenizer only if the vocabularies differ."""
    from .. import models
    ref = args.assistant or ("embedded" if args.target == "embedded" else args.sidecar)
    if not isinstance(ref, str) or ref.lower() == "none":
        raise ValueError("method 'assisted' needs a draft model that shares the target's tokenizer: "
                         "pass --assistant MODEL (or drop 'assisted' from --methods)")
    device = next(engine.target.parameters()).device
    # For target=embedded this is a second load of the embedded SmolLM2 without the target's adapter:
    # the sidecar's base model.
    model, tok = models.load_model(ref, device=device, dtype=engine.target.dtype)
    same_vocab = tok.get_vocab() == engine.tokenizer.get_vocab()
    if not same_vocab:
        log.warning("assistant %s has another vocabulary; using transformers' universal assisted decoding", ref)
    return model, (None if same_vocab else tok)


def run_server(args):
    from ..engine import METHODS as ENGINE_METHODS
    from .server import run_server_bench, write

    if args.scenario != "cold":
        raise ValueError("--warm-tools and --agent-loop measure in process; drop them with --server")
    if args.strict:
        raise ValueError("--strict measures in process; drop it with --server")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if len(methods) != 1 or methods[0] not in ENGINE_METHODS:
        raise ValueError(f"--server measures one engine method: pass --methods with one of {list(ENGINE_METHODS)}, "
                         f"got {args.methods!r}")
    records = _records(args)
    results = run_server_bench(args.server, records, method=methods[0], tool_choice=args.tool_choice,
                               max_new_tokens=args.max_new_tokens, api_key=args.api_key,
                               warmup=not args.no_warmup, progress=not args.quiet, data=_data_label(args))
    paths = write(results, args.out)
    if not args.quiet:
        print(paths["report"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


# ------------------------------------------------------------------ the load bench (--concurrency)

_PARSER = None  # the bench's parser, once add_parser made it: the report's command is rebuilt from it


def _levels(text: str) -> list[int]:
    """--concurrency: comma-separated integers >= 1 (1,2,4,8), in increasing order, each once."""
    import argparse
    try:
        levels = [int(t) for t in text.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (e.g. 1,2,4,8), got {text!r}")
    return sorted(set(levels))


def run_load(args):
    """`--concurrency LEVELS`: the load bench (load.py), in process or against `--server`."""
    from .load import LOAD_METHODS, LoadConfig, ServerClient, run_load_bench, write_all
    from .records import spread

    command = _command(args)
    conflicts = [flag for flag, on in (("--agent", args.agent), ("--strict", args.strict),
                                       ("--temperature", args.temperature is not None),
                                       (f"--layout {args.layout}", args.layout != "shared"),
                                       ("--warm-tools", args.scenario == "warm_tools"),
                                       ("--history", args.scenario == "history"),
                                       ("--tool-latency", args.tool_latency is not None),
                                       ("--max-steps", args.max_steps != 4)) if on]
    if conflicts:
        raise ValueError(f"--concurrency runs the load bench (greedy single replies, shared layout, the cold or "
                         f"--agent-loop scenario): it cannot be combined with {', '.join(conflicts)}")
    methods = [m.strip() for m in (args.methods or ",".join(LOAD_METHODS)).split(",") if m.strip()]
    if not methods or (unknown := [m for m in methods if m not in LOAD_METHODS]):
        raise ValueError(f"--concurrency serves the engine's methods: pass --methods from {','.join(LOAD_METHODS)}, "
                         f"got {args.methods!r}")
    records = _records(args)
    if args.limit is None:  # the largest level's worth, spread over the sources
        records = spread(records, max(args.concurrency))
    config = LoadConfig(tuple(methods), tuple(args.concurrency), args.tool_choice or "required", args.max_new_tokens,
                        scenario=args.scenario, warmup=not args.no_warmup, progress=not args.quiet,
                        command=command)
    data = _data_label(args) + (f" (sources {args.sources})" if args.sources else "")
    if args.server:
        client = ServerClient(args.server, args.max_new_tokens, args.api_key)
        results = run_load_bench(None, records, config, data=data, client=client)
    else:
        engine, _, sidecar = _engines(args)
        if "oospec" in methods:
            _check_sidecar(engine, sidecar)
        results = run_load_bench(engine, records, config, data=data)
    return _write(results, args, write_all)


def _command(args) -> str:
    """The command line for the report: as typed when this process is the `oospec` script, else rebuilt
    from the flags that differ from their defaults (tests call `main([...])`). --api-key's value is hidden."""
    import argparse
    import os
    import sys
    from .load import command_line
    argv = sys.argv
    if argv and os.path.basename(argv[0]) == "oospec" and argv[1:2] == ["bench"]:
        exe = os.path.relpath(argv[0]) if os.path.abspath(argv[0]).startswith(os.getcwd() + os.sep) else "oospec"
        return command_line([exe, *argv[1:]])
    out = ["oospec", "bench"]
    for action in getattr(_PARSER, "_actions", []):
        if not action.option_strings or action.dest in ("help", "run"):
            continue
        value, flag = getattr(args, action.dest, None), action.option_strings[-1]
        if isinstance(action, argparse._StoreConstAction) and not isinstance(action, argparse._StoreTrueAction):
            if value == action.const and value != action.default:
                out.append(flag)
        elif isinstance(action, argparse._StoreTrueAction):
            if value:
                out.append(flag)
        elif value is not None and value != action.default:
            if action.dest == "concurrency":
                value = ",".join(map(str, value))
            elif value == float("inf"):
                value = "off"
            out += [flag, str(value)]
    return command_line(out)
