"""Turn OpenAI-style messages and tools into the exact prompt text the target sees.

Templates that render `tools=` natively (Qwen2.5/3, Llama 3.1) get the tools and the tool-call
history as they expect them. Templates that silently drop tools (SmolLM2's ChatML) get the format's
own system prompt, and tool calls / results rendered as text in the format.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import ChatFormatError, TemplateArgumentError
from .formats import ToolFormat
from .tools import Tool

ROLES = ("system", "user", "assistant", "tool")
#: the text parts of one message are concatenated as they are, as OpenAI and LangChain's `.text` do
TEXT_PART_SEPARATOR = ""


def join_text_parts(parts) -> str:
    """The one policy every front-end uses to make a message's text from its text parts."""
    return TEXT_PART_SEPARATOR.join(parts)


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise ChatFormatError(f"{where}: only text content parts are supported, got {part!r:.80}")
        return join_text_parts(parts)
    raise ChatFormatError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def _call(tc: Any, where: str) -> dict:
    if not isinstance(tc, dict):
        raise ChatFormatError(f"{where}: each tool call must be a dict, got {type(tc).__name__}")
    fn = tc.get("function", tc)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise ChatFormatError(f"{where}: tool call has no function name")
    args = fn.get("arguments", fn.get("args", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ChatFormatError(f"{where}: tool call {name!r} has arguments that are not valid JSON: {e}") from None
    if not isinstance(args, dict):
        raise ChatFormatError(f"{where}: tool call {name!r} arguments must be a JSON object")
    return {"id": tc.get("id"), "name": name, "arguments": args}


def normalize_messages(messages: Any) -> list[dict]:
    """Check the chat and return it as {"role", "content", "tool_calls"?, "tool_call_id"?} dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatFormatError("messages must be a non-empty list of chat dicts")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatFormatError(f"{where} must be a dict with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if role == "developer":  # OpenAI's successor of the system role: instructions to the model
            role = "system"
        if role not in ROLES:
            raise ChatFormatError(f"{where} has role {role!r}; expected one of {ROLES + ('developer',)}")
        msg = {"role": role, "content": _text(m.get("content"), where)}
        thought = m.get("reasoning_content")
        if thought is not None and (role != "assistant" or not isinstance(thought, str)):
            raise ChatFormatError(f"{where}: reasoning_content must be a string on an assistant message, "
                                  f"got {type(thought).__name__} on a {role} message")
        if thought:
            msg["reasoning_content"] = thought
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_call(tc, where) for tc in m["tool_calls"]]
        elif m.get("tool_calls"):
            raise ChatFormatError(f"{where}: only assistant messages may carry tool_calls")
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
            if m.get("name"):
                msg["name"] = m["name"]
        out.append(msg)
    if all(m["role"] == "system" for m in out):
        raise ChatFormatError("messages hold only system messages; add a user message")
    return out


MISSING_TEMPLATE_FIX = ("pass chat_template= (a Jinja string, or the path of a file holding one; "
                        "`oospec serve --chat-template`); oospec_agents/templates/gemma3.jinja serves Gemma 3")


def read_chat_template(template: str | os.PathLike) -> str:
    """A `chat_template=` value as template text: the Jinja string itself, or the file it names.

    Text holding `{{` or `{%` is a template; anything else must be the path of an existing file."""
    if isinstance(template, str) and ("{{" in template or "{%" in template):
        return template
    if not isinstance(template, (str, os.PathLike)):
        raise ChatFormatError(f"chat_template must be a Jinja string or a file path, got {type(template).__name__}")
    path = Path(template).expanduser()
    try:
        found = path.is_file()
    except OSError:  # e.g. a name too long to be a path
        found = False
    if not found:
        shown = str(template) if len(str(template)) <= 200 else str(template)[:200] + "..."
        raise ChatFormatError(f"chat template file {shown!r} does not exist (and the value is no Jinja "
                              "template: it holds no '{{' or '{%')")
    return path.read_text(encoding="utf-8")


def set_chat_template(tokenizer, template: str | os.PathLike) -> None:
    """Give `tokenizer` the chat template `template` (see `read_chat_template`), checked now by
    rendering a one-message chat, so a broken template fails at load time, naming itself."""
    import jinja2
    text = read_chat_template(template)
    name = "given as a string" if text is template else repr(str(template))
    previous, tokenizer.chat_template = tokenizer.chat_template, text
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as e:
        tokenizer.chat_template = previous
        raise ChatFormatError(f"chat template {name} is not valid Jinja: {e.message} (line {e.lineno})") from None
    except Exception as e:
        tokenizer.chat_template = previous
        raise ChatFormatError(f"chat template {name} cannot render a one-message chat: "
                              f"{type(e).__name__}: {e}") from None


def require_chat_template(tokenizer) -> None:
    """Chats become prompts through the tokenizer's chat template: fail now, not at the first request."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ChatFormatError(f"the tokenizer of {name!r} has no chat template, so chats cannot be rendered "
                              f"into prompts: {MISSING_TEMPLATE_FIX}")


def template_renders_tools(tokenizer) -> bool:
    probe = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "zz_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}}}
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return "zz_probe_tool" in with_tools


#: what `apply_chat_template` itself takes or the engine sets: never a template argument of the caller's
ENGINE_TEMPLATE_ARGS = frozenset({"messages", "conversation", "tools", "documents", "chat_template",
                                  "add_generation_prompt", "continue_final_message", "tokenize", "padding",
                                  "truncation", "max_length", "return_tensors", "return_dict",
                                  "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens"})
REASONING_EFFORTS = ("low", "medium", "high")


def template_kwargs(template: str, chat_template_kwargs=None, reasoning_effort=None) -> dict:
    """The extra arguments a request passes to the chat template, checked against the template's text.

    Jinja ignores a variable it is given and never reads, so an argument the template does not
    reference (a misspelt `enable_thinkng`, `reasoning_effort` for a template without effort levels)
    would change nothing, silently: it is an error that names it. `reasoning_effort` is one of
    `REASONING_EFFORTS`, as an argument of its own or a key of `chat_template_kwargs`."""
    if chat_template_kwargs is None:
        chat_template_kwargs = {}
    if not isinstance(chat_template_kwargs, dict):
        raise TemplateArgumentError("chat_template_kwargs must be a dict of chat template arguments such as "
                                    f"{{\"enable_thinking\": false}}, got {type(chat_template_kwargs).__name__}",
                                    "chat_template_kwargs")
    kwargs = dict(chat_template_kwargs)
    if reasoning_effort is not None:
        if kwargs.get("reasoning_effort", reasoning_effort) != reasoning_effort:
            raise TemplateArgumentError(f"reasoning_effort={reasoning_effort!r} differs from chat_template_kwargs' "
                                        f"reasoning_effort={kwargs['reasoning_effort']!r}: give it once",
                                        "reasoning_effort")
        kwargs["reasoning_effort"] = reasoning_effort
    for key, value in kwargs.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise TemplateArgumentError(f"chat_template_kwargs key {key!r} is not a template variable name",
                                        "chat_template_kwargs")
        if key in ENGINE_TEMPLATE_ARGS:
            raise TemplateArgumentError(f"chat_template_kwargs key {key!r} is set by the engine, not by a request",
                                        "chat_template_kwargs")
        if key == "reasoning_effort" and value not in REASONING_EFFORTS:
            raise TemplateArgumentError(f"reasoning_effort must be one of {list(REASONING_EFFORTS)}, got {value!r}",
                                        "reasoning_effort")
        if not re.search(rf"\b{key}\b", template):
            if key == "reasoning_effort":
                raise TemplateArgumentError("this chat template takes no reasoning_effort (its text never reads "
                                            "it): leave reasoning_effort unset", "reasoning_effort")
            raise TemplateArgumentError(f"chat_template_kwargs key {key!r} is not an argument of this chat "
                                        "template (its text never reads it)", "chat_template_kwargs")
    return kwargs


def apply_template(tokenizer, msgs: list[dict], kwargs: dict, **fixed) -> str:
    """`apply_chat_template` with a request's template arguments. A template that raises on them (e.g.
    its own `raise_exception` on a bad value) and not without them is a TemplateArgumentError naming
    the argument (each is left out in turn to find it)."""
    try:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **fixed, **kwargs)
    except Exception as e:
        if not kwargs or not _renders(tokenizer, msgs, {}, fixed):
            raise
        culprits = [k for k in kwargs if _renders(tokenizer, msgs, {a: v for a, v in kwargs.items() if a != k}, fixed)]
        key = culprits[0] if len(culprits) == 1 else None
        named = {key: kwargs[key]} if key else kwargs
        what = ("the arguments " if len(named) > 1 else "") + ", ".join(f"{k}={v!r}" for k, v in named.items())
        param = "reasoning_effort" if key == "reasoning_effort" else "chat_template_kwargs"
        raise TemplateArgumentError(f"the chat template rejects {what}: {type(e).__name__}: {e}", param) from None


def _renders(tokenizer, msgs: list[dict], kwargs: dict, fixed: dict) -> bool:
    try:
        tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **fixed, **kwargs)
    except Exception:
        return False
    return True


def render_prompt(tokenizer, fmt: ToolFormat, messages: list[dict], tools: list[Tool], native_tools: bool,
                  kwargs: dict | None = None) -> str:
    """Prompt text up to and including the assistant generation header. `kwargs`: the request's
    template arguments (`template_kwargs`). An earlier turn's `reasoning_content` goes to templates
    that read it (Qwen3's; gpt-oss's as `thinking`) and is dropped for the others. A harmony target's
    prompt is openai-harmony's rendering where it is installed (formats/harmony.py,
    `render_harmony_prompt`), else its chat template's."""
    kwargs = kwargs or {}
    if fmt.name == "harmony":
        from .formats.harmony import render_harmony_prompt
        text = render_harmony_prompt(messages, tools, kwargs, getattr(tokenizer, "chat_template", None))
        if text is not None:
            return text
    if native_tools:
        keeps_reasoning = "reasoning_content" in tokenizer.chat_template
        # gpt-oss's template reads an earlier turn's analysis as `thinking` (and keeps it only between a
        # call and its result, as harmony does)
        as_thinking = not keeps_reasoning and re.search(r"\bmessage\.thinking\b", tokenizer.chat_template)
        msgs = []
        for m in messages:
            m = dict(m)
            if as_thinking and "reasoning_content" in m:
                m["thinking"] = m.pop("reasoning_content")
            if not keeps_reasoning:
                m.pop("reasoning_content", None)
            if "tool_calls" in m:
                m["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}}
                                   for c in m["tool_calls"]]
            msgs.append(m)
        return apply_template(tokenizer, msgs, kwargs, tools=[t.to_openai() for t in tools] or None)
    msgs: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = fmt.render_calls(m["tool_calls"])
            msgs.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + calls})
        elif m["role"] == "tool":
            block = fmt.render_tool_result(m["content"])
            if msgs and msgs[-1].get("_tool"):
                msgs[-1]["content"] += "\n" + block
            else:
                msgs.append({"role": "user", "content": block, "_tool": True})
        else:
            msgs.append({"role": m["role"], "content": m["content"]})
    if tools:
        prompt = fmt.system_prompt(tools)
        if msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + prompt}
        else:
            msgs.insert(0, {"role": "system", "content": prompt})
    msgs = [{"role": m["role"], "content": m["content"]} for m in msgs]
    return apply_template(tokenizer, msgs, kwargs)
