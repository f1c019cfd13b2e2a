"""`oospec demo`: one request on the embedded default pair, with the speculation stats."""
from __future__ import annotations

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}


def add_parser(sub, name):
    p = sub.add_parser(name, help="run one tool-call request on the embedded models and print the stats")
    p.add_argument("--model", default="embedded")
    p.add_argument("--method", default="oospec", choices=["ar", "toolspec", "oospec"])
    p.add_argument("--tool-choice", default="required")
    p.add_argument("--prompt", default="What is the weather like in Paris today, in celsius?")
    p.set_defaults(run=run)


def run(args):
    from .cli import print_json
    from .engine import Engine
    engine = Engine.from_pretrained(args.model)
    messages = [{"role": "user", "content": args.prompt}]
    for method in dict.fromkeys(["ar", args.method]):
        engine.clear_prefix_cache()  # each method from a cold start, so their stats compare
        gen = engine.generate(messages, [WEATHER_TOOL], tool_choice=args.tool_choice, max_new_tokens=64,
                              method=method)
        print(f"--- method={method}")
        print(gen.text)
        print_json({"tool_calls": gen.tool_calls, "invalid_tool_calls": gen.invalid_tool_calls,
                    "stats": gen.stats.to_dict()})
