"""The sidecar wave's rows: the one definition shared by the runtime wave and LoRA training.

A request with tools T1..Tn becomes one shared prefix and a short suffix per row:

    prefix  = ChatML text: a compact tool list (names, types, enums, each description's first
              sentence clipped to 80 characters) as the system turn, the conversation, then the
              assistant header -- prefilled once per wave
    function row   suffix '<tool_call>\\n{"name":'                                target ' "get_weather"' | ' null'
    slot rows      suffix '<tool_call>\\n{"name": "get_weather", "arguments": {"city":'
                                                                                target ' "Paris"' | ' null'
                   (a required parameter's row, unless its schema allows null, is marked `required`:
                   the wave never lets it answer null)

A parameter whose schema allows one value alone (a `const`, an enum of one value: `forced_value`) gets
no row: the join writes that value into the call.

Every row's answer is one JSON value, so one parser (`parse_value`) and one stop rule (`value_end`)
serve all rows. The suffix starts the call the way a chat model writes it, so an instruct model
fills values out of the box. Suffixes end at the colon and targets start with the space, because BPE
tokenizers merge a space into the token after it (` "Paris`), so a prompt ending in a space is
off-distribution; the call layout is fixed here (hermes-like) whatever the target's format
is, because only the joined call crosses to the target, rendered in the target's format.

Row options (`RowOptions`, an adapter directory's `rows.json`, trained and served alike; absent: the
rows above exactly). With `param_docs`, a slot row whose parameter's schema documents it
begins with one line of that documentation before its call opener:

    # city: City and state, e.g. Berkeley, CA; default "Paris"; examples "Oslo", "Rome"
    <tool_call>\n{"name": "get_weather", "arguments": {"city":

so the row reads the schema's own conventions (formats, defaults) beside its key. Such a row shares no
opener with its tool's other rows, so the wave prefills more per row; an adapter must be trained on it.

Tokenization (runtime and training alike): ids = encode(prefix) + encode(suffix), each without
special tokens added, so every row shares the prefix's ids exactly. Training labels are
encode(target) followed by the tokenizer's eos token; the wave stops a row at eos or at the end of
its JSON value, whichever comes first.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..tools import Tool

CALL_OPEN = '<tool_call>\n{"name":'
#: an adapter directory's row options (`RowOptions`); a directory without one gets today's rows
ROWS_FILE = "rows.json"
#: a parameter's documentation line (`param_doc`) is clipped to this many characters
PARAM_DOC_CHARS = 160
MAX_CONTENT_CHARS = 400     # long tool results / system prompts are clipped: the prefix stays compact
SUMMARY_CHARS = 80          # a tool's description: its first sentence, clipped to this many characters


@dataclass(frozen=True)
class Row:
    kind: str                   # "function" | "slot"
    tool: str | None            # the slot's tool (None for the function row)
    param: str | None           # the slot's parameter (None for the function row)
    suffix: str                 # text after the shared prefix; the model continues with a JSON value
    target: str | None = None   # " " + JSON text of the answer; None = unlabelled (inference, or not trained)
    required: bool = False      # a required parameter that null does not satisfy: the wave never answers null


@dataclass(frozen=True)
class RowOptions:
    """How an adapter's rows are written, trained and served alike (the module's "Row options")."""
    #: each documented slot row begins with its parameter's description, default and examples
    param_docs: bool = False

    @classmethod
    def for_adapter(cls, adapter) -> "RowOptions":
        """The adapter directory's `ROWS_FILE`; today's rows where there is none (or no adapter). A file
        that does not read as options is a ValueError naming it."""
        from pathlib import Path
        path = None if adapter is None else Path(adapter) / ROWS_FILE
        if path is None or not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
            options = cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"cannot read the sidecar's row options {str(path)!r}: {e}") from None
        if not isinstance(options.param_docs, bool):
            raise ValueError(f"the sidecar's row options {str(path)!r}: param_docs must be true or false, got "
                             f"{options.param_docs!r}")
        return options

    def save(self, directory) -> None:
        """Write them into an adapter's directory (only where they differ from today's rows)."""
        from dataclasses import asdict
        from pathlib import Path
        if self != RowOptions():
            (Path(directory) / ROWS_FILE).write_text(json.dumps(asdict(self)) + "\n")


def param_doc(name: str, spec: Any) -> str:
    """`# name: description; default D; examples E1, E2` and a newline, clipped to PARAM_DOC_CHARS; ""
    for a parameter whose schema has none of the three."""
    if not isinstance(spec, dict):
        return ""
    parts = [" ".join(str(spec.get("description") or "").split())]
    if "default" in spec:
        parts.append("default " + json.dumps(spec["default"], ensure_ascii=False))
    examples = spec.get("examples")
    if isinstance(examples, list) and examples:
        parts.append("examples " + ", ".join(json.dumps(e, ensure_ascii=False) for e in examples[:3]))
    text = "; ".join(p for p in parts if p)
    if not text:
        return ""
    line = f"# {name}: {text}"
    return (line if len(line) <= PARAM_DOC_CHARS else line[:PARAM_DOC_CHARS - 3].rstrip() + "...") + "\n"


def expand_rows(messages: list[dict], tools: list[Tool], call: dict | None = None,
                options: RowOptions | None = None) -> tuple[str, list[Row]]:
    """The shared prefix and the rows: one function row, then one slot row per parameter of every tool.

    `messages` are normalised chat dicts (chat.normalize_messages). `call` is the ground truth for
    training, {"name", "arguments": dict}: the function row's target is the name, the called tool's
    slot rows get their value or `null`, other tools' slot rows stay unlabelled. `options`: the
    adapter's `RowOptions` (None: today's rows).
    """
    docs = options is not None and options.param_docs
    prefix = render_prefix(messages, tools)
    fn_target = None if call is None else " " + json.dumps(call["name"], ensure_ascii=False)
    rows = [Row("function", None, None, CALL_OPEN, fn_target)]
    args = (call or {}).get("arguments") or {}
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    for tool in tools:
        required = {p for p in tool.required if not nullable(tool.properties.get(p))}
        labelled = call is not None and tool.name == call["name"]
        for param in tool.properties:
            if forced_value(tool.properties[param]) is not None:
                continue  # the schema writes its whole value: the join fills it in (join.forced_arguments)
            suffix = CALL_OPEN + " " + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": {' + \
                json.dumps(param, ensure_ascii=False) + ":"
            if docs:
                suffix = param_doc(param, tool.properties[param]) + suffix
            target = " " + json.dumps(args.get(param), ensure_ascii=False) if labelled else None
            rows.append(Row("slot", tool.name, param, suffix, target, param in required))
    return prefix, rows


def forced_value(spec: Any) -> tuple[Any] | None:
    """`(value,)` where the schema allows this parameter one value alone (a `const`, an enum of one
    value), else None: the wave builds no row for it, whatever the sidecar would write there."""
    if not isinstance(spec, dict):
        return None
    if "const" in spec:
        return (spec["const"],)
    enum = spec.get("enum")
    if isinstance(enum, list) and len(enum) == 1:
        return (enum[0],)
    return None


def nullable(spec: Any) -> bool:
    """Whether this parameter's schema says outright that null is a value: type "null" (alone or in a
    list), an enum or const with null, a nullable anyOf / oneOf member, or OpenAPI's `nullable: true`.
    OpenAI's strict mode writes an optional parameter as required and nullable."""
    if not isinstance(spec, dict):
        return False
    kind = spec.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind) or spec.get("nullable") is True:
        return True
    if "enum" in spec and None in (spec["enum"] or []):
        return True
    if "const" in spec and spec["const"] is None:
        return True
    return any(nullable(s) for key in ("anyOf", "oneOf") for s in spec.get(key) or [])


def render_prefix(messages: list[dict], tools: list[Tool]) -> str:
    """ChatML text up to the assistant header. ChatML is the embedded sidecar's (SmolLM2) own chat
    format; for a sidecar with another tokenizer it is just text."""
    system = "Call one of these tools. Reply with the call as JSON.\n" + "\n".join(compact_tool(t) for t in tools)
    turns = [("system", system)]
    for m in messages:
        content = _clip(m.get("content") or "")
        if m["role"] == "system":
            turns[0] = ("system", system + "\n" + content)
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(CALL_OPEN + " " + json.dumps(c["name"], ensure_ascii=False) + ', "arguments": ' +
                              json.dumps(c["arguments"], ensure_ascii=False, separators=(",", ":")) + "}"
                              for c in m["tool_calls"])
            turns.append(("assistant", (content + "\n" if content else "") + calls))
        elif m["role"] == "tool":
            turns.append(("user", "Tool result: " + content))
        else:
            turns.append((m["role"], content))
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns) + "<|im_start|>assistant\n"


def compact_tool(tool: Tool) -> str:
    """`- get_weather(city: string, unit?: "c"|"f"): Get the weather`: names, types and enums (`?` marks
    optional), then the description's first sentence. Sibling tools (`math.triangle_area_heron`,
    `math.triangle_area_base_height`) are told apart by that sentence more than by their names."""
    required = set(tool.required)
    params = ", ".join(f"{name}{'' if name in required else '?'}: {_type(spec)}"
                       for name, spec in tool.properties.items())
    summary = summarize(tool.description)
    return f"- {tool.name}({params})" + (f": {summary}" if summary else "")


def summarize(description: str) -> str:
    """The first sentence (or line) of a description, without its full stop, clipped to SUMMARY_CHARS."""
    first = re.split(r"(?<=\.)\s|\n", (description or "").strip(), maxsplit=1)[0].strip().rstrip(".")
    return first if len(first) <= SUMMARY_CHARS else first[:SUMMARY_CHARS - 3].rstrip() + "..."


def _type(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "any"
    if "enum" in spec:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in spec["enum"])
    kind = spec.get("type", "any")
    if isinstance(kind, list):
        return "|".join(map(str, kind))
    if kind == "array":
        return f"array<{_type(spec.get('items', {}))}>"
    return str(kind)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CONTENT_CHARS else text[:MAX_CONTENT_CHARS] + "..."


# --------------------------------------------------------------------------- reading a row's answer

_DECODER = json.JSONDecoder()
_NUMBER_GOES_ON = ("", *"0123456789.eE+-")


def value_end(text: str) -> int | None:
    """Index just past the first complete JSON value in `text`, or None while it is incomplete.

    A number is complete only once something that cannot continue it follows ("10" may still
    become "100" or "10.5").
    """
    body = text.lstrip()
    try:
        value, end = _DECODER.raw_decode(body)
    except json.JSONDecodeError:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and body[end:end + 1] in _NUMBER_GOES_ON:
        return None
    return len(text) - len(body) + end


def parse_value(text: str, *, final: bool = True) -> Any:
    """The first complete JSON value in a row's output; garbage (or nothing) reads as None.

    With `final` (the row has stopped), a trailing number counts as complete.
    """
    end = value_end(text)
    if end is None and final:
        end = len(text)
    if end is None:
        return None
    try:
        return _DECODER.raw_decode(text.lstrip())[0]
    except json.JSONDecodeError:
        return None
