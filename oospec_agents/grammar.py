"""Strict tool calls: the grammar a reply must follow, compiled by llguidance, and its token masks.

The grammar is the target format's call markup around a call of an offered tool (the named one under
a named `tool_choice`), whose arguments follow that tool's JSON Schema; under `auto`, free text may
come first. The prompt already ends with the opener that `tool_choice` forces (`Prepared.prefix`),
so the grammar starts right after it. Objects are closed, as in OpenAI's strict mode: no keys beyond
`properties` unless `additionalProperties` is itself a schema.

A template that reasons (formats/reasoning.py) gets its reasoning block first, free text up to the
closing marker; the grammar above constrains what follows it. There a forced call cannot be in the
prompt: it comes after the reasoning, so even without strict a forced `tool_choice` is a grammar,
the opener after the block and free text after the opener (`Grammars.guide`).

A harmony reply (gpt-oss, formats/harmony.py) always may reason first, in analysis messages; its own
grammar (`Grammars.harmony_lark`) leaves them free and constrains the messages after them: a forced
call (its markup always; its arguments under strict), strict calls, a JSON `final` message. Harmony's
markers are special tokens, which the grammar names as tokens (`<|call|>`).

Lossless under a grammar means: the reply equals greedy decoding of the target whose logits are
masked by the same grammar (`StrictLogitsProcessor` is that reference for `transformers.generate`).
llguidance decides what is allowed; the schema drafter only drafts.

The same machinery constrains a reply to OpenAI's `response_format` (JSON mode, or a JSON Schema):
`response_schema` reads it, and `Grammars.json_guide` compiles the reply's grammar.
"""
from __future__ import annotations

import copy
import json
import logging
import re
import threading
import warnings
from collections import OrderedDict

import numpy as np
import torch
from transformers import LogitsProcessor

from .errors import OoOSpecError, ResponseFormatError
from .formats import Reasoning, ToolFormat
from .formats import harmony as hm
from .sampling import greedy
from .tools import Tool

log = logging.getLogger(__name__)

#: the JSON the formats render (json.dumps' defaults): no free whitespace for a random model to loop in
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_OBJECT = {"type": "object", "additionalProperties": {}}  # open: `closed` keeps it open
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMAS = ("items", "not", "if", "then", "else", "contains", "additionalItems")


class StrictFallbackWarning(UserWarning):
    """A tool's schema, or the target's format, is beyond the grammar: that part decodes non-strict."""


def closed(schema):
    """A copy of `schema` whose objects take no keys beyond `properties` (OpenAI's strict rule),
    unless their `additionalProperties` is itself a schema."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    is_object = out.get("type") == "object" or (isinstance(out.get("type"), list) and "object" in out["type"]) \
        or "properties" in out
    if is_object and not isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = False
    elif isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed(out["additionalProperties"])
    for k in _SUBSCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [closed(s) for s in out[k]]
    for k in _SUBSCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: closed(s) for name, s in out[k].items()}
    for k in _SUBSCHEMAS:
        if isinstance(out.get(k), dict):
            out[k] = closed(out[k])
    return out


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a valid Lark string literal


class Grammars:
    """One target's grammars: llguidance's view of its tokenizer (built on first use, about 1 s) and
    the compiled grammar of every recent (format, tool_choice, tool set), so a request that offers
    the same tools compiles nothing."""

    def __init__(self, tokenizer, fmt: ToolFormat, eos_ids: set[int], vocab_size: int, cache_size: int = 64):
        self.tokenizer, self.fmt, self.eos_ids = tokenizer, fmt, sorted(eos_ids)
        self.vocab_size = max(vocab_size, len(tokenizer))
        self.cache_size = cache_size
        self.compiles = 0  # grammars compiled so far (the cache's misses)
        self._lltok = None
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def guide(self, tools: list[Tool], mode: str, name: str | None, strict: bool = True,
              reply: dict | None = None, reasoning: Reasoning | None = None) -> "Guide | None":
        """A fresh matcher for one reply, or None when nothing is constrained (no tools offered,
        `tool_choice="none"`, or a format the grammar does not cover: that warns). `strict` makes
        every tool strict; otherwise only tools flagged `"strict": true` are, and the arguments of
        the others are any JSON object (their calls still follow the format's markup).

        `reply`, a `response_format`'s schema (`response_schema`), is what a reply that calls no tool
        must be under `auto`: that JSON value instead of free text (and a reply that calls writes no
        text before its calls). A forced call has no such reply.

        `reasoning`: the reply's reasoning block comes first, unconstrained; a forced call's opener
        follows it (without strict, only the opener is constrained: `opener_lark`)."""
        if mode == "none" or not tools:
            return None
        if mode != "auto":
            reply = None
        harmony = self.fmt.name == "harmony"  # its reply always may reason first (analysis messages)
        after_reasoning = (reasoning is not None or harmony) and mode != "auto"  # the opener is no prompt prefix
        if reply is None and not (strict or any(t.strict for t in tools)):
            if not after_reasoning:
                return None
            return self._harmony_guide(tools, mode, name, None, free_arguments=True) if harmony \
                else self._opener_guide(mode, name, reasoning)
        if not strict:
            tools = [t if t.strict else Tool(t.name, t.description, _ANY_OBJECT) for t in tools]
        if harmony:
            return self._harmony_guide(tools, mode, name, reply)
        if reply is not None and (self.fmt.calls_in_one_list or not self.fmt.call_start.strip()):
            why = ("the grammar does not cover its calls" if self.fmt.calls_in_one_list
                   else "it writes calls as bare JSON, which a JSON reply could not be told from")
            raise ResponseFormatError(f"a JSON response_format beside tools is not served for the target's format "
                                      f"{self.fmt.name!r} ({why}): offer no tools, or pass tool_choice=\"none\"")
        if self.fmt.calls_in_one_list:
            warnings.warn(f"strict decoding covers the hermes and llama3_json formats; the target's format "
                          f"{self.fmt.name!r} decodes non-strict", StrictFallbackWarning, stacklevel=3)
            return self._opener_guide(mode, name, reasoning) if after_reasoning else None
        key = (mode, name, tuple((t.name, json.dumps(t.parameters, sort_keys=True)) for t in tools),
               json.dumps(reply, sort_keys=True), reasoning)
        return self._cached(key, lambda: self._compile(self.lark(
            tools, mode, name, None if reply is None else self._reply_schema(reply), reasoning)))

    def _harmony_guide(self, tools: list[Tool], mode: str, name: str | None, reply: dict | None,
                       free_arguments: bool = False) -> "Guide":
        _check_harmony_tokens(self.tokenizer)
        key = ("harmony", mode, name, tuple((t.name, json.dumps(t.parameters, sort_keys=True)) for t in tools),
               json.dumps(reply, sort_keys=True), free_arguments)
        return self._cached(key, lambda: self._compile(self.harmony_lark(
            tools, mode, name, None if reply is None else self._reply_schema(reply), free_arguments)))

    def harmony_lark(self, tools: list[Tool], mode: str, name: str | None, reply: dict | None = None,
                     free_arguments: bool = False) -> str:
        """A harmony reply's grammar (formats/harmony.py), from right after the prompt's `<|start|>assistant`:
        an analysis message first, or none (the reasoning: free text, ended by `<|end|>` and the next
        message's `<|start|>assistant`; one, as one `<think>` block: a masked model cannot put off the
        answer by opening another), then the answer:

        - a forced choice (`required`, `named`): one call, `<|channel|>commentary to=functions.NAME
          <|constrain|>json<|message|>ARGUMENTS<|call|>` (the named tool's, or any offered tool's);
        - `auto` with `reply` (a response_format's schema): the `final` message whose body is that JSON
          value, ended by `<|return|>`, or a call (no preamble before it, as OpenAI's);
        - `auto`: commentary preambles (`<|channel|>commentary<|message|>TEXT<|end|><|start|>assistant`),
          then a `final` message of free text or a call.

        A call's arguments follow its tool's schema (`_arguments`; `guide` has made the non-strict
        tools' any JSON object); with `free_arguments` (a forced call without strict) they are free text.
        Harmony's markers are special tokens: the grammar names them as tokens (`<|call|>`), and free
        text (a body, the reasoning) is text of the other tokens. `<|call|>` and `<|return|>` end the reply
        (they are EOS tokens): one call a reply. No tools and a `reply`: the final JSON message only
        (`json_guide`)."""
        allowed = [t for t in tools if mode != "named" or t.name == name]
        schemas = []
        for tool in allowed:
            schemas.append(None if free_arguments else self._arguments(tool))
        return _harmony_rules(allowed, schemas, mode, reply)

    def _opener_guide(self, mode: str, name: str | None, reasoning: Reasoning) -> "Guide":
        opener = self.fmt.forced_prefix(name if mode == "named" else None)
        return self._cached(("opener", opener, reasoning), lambda: self._compile(self.opener_lark(opener, reasoning)))

    def opener_lark(self, opener: str, reasoning: Reasoning) -> str:
        """A forced call without strict, after the reasoning: the opener the prompt would have ended
        with (`ToolFormat.forced_prefix`), then anything."""
        rules = [f"forced: {_lit(opener)} REST?", "REST: /(?s:.+)/", *_reasoning_rules(reasoning, "forced")]
        return "\n".join(rules) + "\n"

    def json_guide(self, schema: dict, reasoning: Reasoning | None = None) -> "Guide":
        """A fresh matcher for a reply that is one JSON value valid against `schema` (a
        `response_format`'s, see `response_schema`), then EOS; after the reasoning block, where
        `reasoning` is given. A schema beyond llguidance is a ResponseFormatError naming its keyword:
        a structured reply is never decoded unconstrained."""
        import llguidance
        if self.fmt.name == "harmony":  # the final channel's message, after the analysis
            return self._harmony_guide([], "auto", None, schema)
        key = ("json", json.dumps(schema, sort_keys=True), reasoning)
        if reasoning is None:
            return self._cached(key, lambda: self._compile_matcher(
                llguidance.LLMatcher.grammar_from_json_schema(self._reply_schema(schema))))
        return self._cached(key, lambda: self._compile("\n".join([
            f"reply: %json {json.dumps(self._reply_schema(schema), ensure_ascii=False)}",
            *_reasoning_rules(reasoning, "reply")]) + "\n"))

    def _cached(self, key: tuple, compile_it) -> "Guide":
        """A fresh matcher of the grammar cached under `key`, compiled (and checked) on a miss only."""
        with self._lock:
            matcher = self._cache.get(key)
            if matcher is None:
                matcher = compile_it()
                self._cache[key] = matcher
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
            return Guide(matcher.deep_copy(), self.vocab_size)

    def _reply_schema(self, schema: dict) -> dict:
        """A response_format's schema in the calls' JSON style, or a ResponseFormatError naming the
        keyword llguidance cannot express."""
        styled = dict(schema, **{"x-guidance": JSON_STYLE})
        error = self._schema_error(styled)
        if error is not None:
            keyword = self._culprit(styled)
            raise ResponseFormatError(f"response_format's JSON Schema cannot be decoded under a grammar"
                                      f"{f' (its {keyword!r} keyword)' if keyword else ''}: {error.splitlines()[0]}")
        return styled

    def lark(self, tools: list[Tool], mode: str, name: str | None, reply: dict | None = None,
             reasoning: Reasoning | None = None) -> str:
        """The reply's grammar in llguidance's Lark dialect, starting after the forced prefix (after the
        reasoning block, with `reasoning`: then no prefix is forced in the prompt); under `auto`, a
        reply is free text (and calls after it), or, where `reply` is given, its JSON value or calls."""
        fmt = self.fmt
        if fmt.name == "harmony":
            return self.harmony_lark(tools, mode, name, reply)
        allowed = [t for t in tools if mode != "named" or t.name == name]
        forced = mode in ("required", "named") and reasoning is None
        prefix = fmt.forced_prefix(name if mode == "named" else None) if forced else ""
        # text may not open a block the grammar reads as reasoning (it would be two readings of one reply)
        no_block = "" if reasoning is None or reasoning.starts_open else f" & ~{_block_regex(reasoning)}"
        rules, bodies, firsts = [], [], []
        for i, tool in enumerate(allowed):
            head = '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + f', "{fmt.args_key}": '
            rules.append(f"args_{i}: %json {json.dumps(self._arguments(tool), ensure_ascii=False)}")
            bodies.append(f"{_lit(head)} args_{i} {_lit('}' + fmt.call_end)}")
            if (fmt.call_start + head).startswith(prefix):
                firsts.append(f"{_lit((fmt.call_start + head)[len(prefix):])} args_{i} {_lit('}' + fmt.call_end)}")
        rules += ["body: " + " | ".join(bodies), f"more: ({_lit(fmt.call_sep)} call)*",
                  f"call: {_lit(fmt.call_start)} body" if fmt.call_start else "call: body"]
        if mode == "auto":
            tag = fmt.call_start.strip()
            if reply is not None:  # the response_format's JSON, or calls (no text before them, as OpenAI's)
                rules += ["answer: reply | call more", f"reply: %json {json.dumps(reply, ensure_ascii=False)}"]
            elif tag:
                # Text that never opens a call; or text up to the first call's opener (a lazy lexeme:
                # it ends at the opener), then calls. A greedy text lexeme could not give back "<tool_call".
                rules += ["answer: TEXT? | opener body more",
                          f"TEXT: /(?s:.+)/ & ~/(?s:.*){_regex_escape(tag)}(?s:.*)/{no_block}",
                          f"opener[lazy]: /(?s:.*){_regex_escape(fmt.call_start)}/{no_block}"]
            else:  # the whole reply is calls or text (llama3_json): text never starts like a call
                rules += ["answer: TEXT? | call more", r"TEXT: /(?s:.+)/ & ~/\s*\{(?s:.*)/" + no_block]
        else:
            rules += ["first: " + " | ".join(firsts), "answer: first more"]
        rules += _reasoning_rules(reasoning, "answer") if reasoning is not None else ["start: answer"]
        return "\n".join(rules) + "\n"

    def _arguments(self, tool: Tool) -> dict:
        """The tool's closed arguments schema; any JSON object (with a warning naming the keyword)
        where llguidance cannot express it."""
        schema = dict(closed(tool.parameters), **{"x-guidance": JSON_STYLE})
        error = self._schema_error(schema)
        if error is None:
            return schema
        keyword = self._culprit(schema) or "?"
        warnings.warn(f"tool {tool.name!r}: strict decoding cannot express its schema's {keyword!r} "
                      f"({error.splitlines()[0]}); its arguments decode non-strict (any JSON object)",
                      StrictFallbackWarning, stacklevel=4)
        return dict(_ANY_OBJECT, **{"x-guidance": JSON_STYLE})

    def _schema_error(self, schema: dict) -> str | None:
        import llguidance
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            llguidance.LLMatcher.grammar_from_json_schema(schema), self.lltok)
        return messages[0] if is_error else None

    def _culprit(self, schema: dict) -> str | None:
        """The first keyword whose removal lets the schema compile (a failure is rare; this is cheap)."""
        for path, key in _keywords(schema):
            trial = copy.deepcopy(schema)
            node = trial
            for step in path:
                node = node[step]
            del node[key]
            if self._schema_error(trial) is None:
                return key
        return None

    @property
    def lltok(self):
        if self._lltok is None:
            import llguidance.hf
            self._lltok = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size,
                                                       eos_token=self.eos_ids)
        return self._lltok

    def _compile(self, lark: str):
        import llguidance
        return self._compile_matcher(llguidance.LLMatcher.grammar_from_lark(lark))

    def _compile_matcher(self, grammar: str):
        import llguidance
        matcher = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
        if matcher.is_error():
            raise OoOSpecError(f"the strict grammar did not compile: {matcher.get_error()}")
        self.compiles += 1
        return matcher


def _harmony_rules(allowed: list[Tool], schemas: list[dict | None], mode: str, reply: dict | None) -> str:
    """`Grammars.harmony_lark`'s grammar: a call of each allowed tool, its arguments that tool's schema
    (None: free text), after an optional analysis message; the answer as `mode` and `reply` ask."""
    rules = ["start: analysis? answer",
             f"analysis: {_harmony_seq(hm.CHANNEL + 'analysis' + hm.MESSAGE)} TEXT? "
             f"{_harmony_seq(hm.END + hm.ROLE)}",
             "TEXT: /(?s:.+)/"]
    calls = []
    for i, (tool, schema) in enumerate(zip(allowed, schemas)):
        if schema is None:
            arguments = "TEXT?"
        else:
            arguments = f"args_{i}"
            rules.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
        calls.append(f"{_harmony_seq(hm.CALL_HEADER + tool.name + hm.CALL_TYPE)} {arguments} "
                     f"{_harmony_seq(hm.CALL)}")
    if calls:
        rules.append("call: " + " | ".join(calls))
    final = _harmony_seq(hm.CHANNEL + "final" + hm.MESSAGE)
    if mode != "auto":
        rules.append("answer: call")
    elif reply is not None:
        rules += ["answer: final" + (" | call" if calls else ""),
                  f"final: {final} reply {_harmony_seq(hm.RETURN)}",
                  f"reply: %json {json.dumps(reply, ensure_ascii=False)}"]
    else:
        rules += ["answer: preamble* (final | call)",
                  f"preamble: {_harmony_seq(hm.CHANNEL + 'commentary' + hm.MESSAGE)} TEXT? "
                  f"{_harmony_seq(hm.END + hm.ROLE)}",
                  f"final: {final} TEXT? {_harmony_seq(hm.RETURN)}"]
    return "\n".join(rules) + "\n"


def _check_harmony_tokens(tokenizer) -> None:
    """Harmony's grammar names its markers as special tokens: a tokenizer without them is a clear error."""
    specials = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    missing = [m for m in hm.HarmonyFormat.markers if m not in specials]
    if missing:
        raise OoOSpecError(f"a harmony reply is constrained (a forced tool_choice, strict, a JSON response_format) "
                           f"only where harmony's markers are special tokens of the tokenizer, as in gpt-oss's; "
                           f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not")


#: the response_format types, as OpenAI's Chat Completions API names them
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def response_schema(response_format) -> dict | None:
    """The JSON Schema a reply must follow under OpenAI's `response_format`, or None for plain text.

    - `{"type": "text"}` (or None): no constraint.
    - `{"type": "json_object"}`: any JSON object (JSON mode).
    - `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": bool}}`: a value
      of that schema; with `"strict": true` its objects are closed as in strict tool calls (`closed`).
      Without a schema, any JSON object.
    Bad input is a ResponseFormatError that names the field."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ResponseFormatError(f"response_format must be an object such as {{\"type\": \"json_schema\", "
                                  f"\"json_schema\": {{...}}}}, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise ResponseFormatError(f"response_format.type is {kind!r}; expected one of {list(RESPONSE_FORMATS)}")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ResponseFormatError("response_format.json_schema must be an object with a \"name\" and a "
                                  f"\"schema\", got {type(spec).__name__}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ResponseFormatError(f"response_format.json_schema.name must be a non-empty string, got {name!r}")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise ResponseFormatError(f"response_format.json_schema.schema must be a JSON Schema object, "
                                  f"got {type(schema).__name__}")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ResponseFormatError(f"response_format.json_schema.strict must be a boolean, got {strict!r}")
    return closed(schema) if strict else schema


def _keywords(schema, path=()):
    """(path to a subschema, keyword) for every keyword of every subschema, innermost first."""
    if not isinstance(schema, dict):
        return
    for k in _SUBSCHEMA_LISTS:
        for j, s in enumerate(schema.get(k) or [] if isinstance(schema.get(k), list) else []):
            yield from _keywords(s, path + (k, j))
    for k in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(k), dict):
            for name, s in schema[k].items():
                yield from _keywords(s, path + (k, name))
    for k in _SUBSCHEMAS + ("additionalProperties",):
        if isinstance(schema.get(k), dict):
            yield from _keywords(schema[k], path + (k,))
    for k in schema:
        if k not in ("type", "x-guidance"):
            yield path, k


#: whitespace around a reasoning block ("</think>\n\n"): bounded, so that a masked model cannot loop in it
_GAP = "[ \\t\\r\\n]{0,4}"


def _harmony_seq(text: str) -> str:
    """Harmony text as a Lark sequence: its markers as special tokens (`<|message|>`), the rest as strings."""
    parts = re.split("(" + "|".join(re.escape(m) for m in hm.HarmonyFormat.markers) + ")", text)
    return " ".join(p if p in hm.HarmonyFormat.markers else _lit(p) for p in parts if p)


def _reasoning_rules(reasoning: Reasoning, answer: str) -> list[str]:
    """The reply's start: its reasoning block (free text up to the closing marker, and the whitespace
    after it), then the rule `answer`; where the prompt has not opened the block, the reply may skip it."""
    close = _regex_escape(reasoning.close)
    once = f"~/(?s:.*){close}(?s:.*){close}(?s:.*)/"  # the block ends at its first closing marker
    if reasoning.starts_open:
        return [f"start: THINK {answer}", f"THINK: /(?s:.*){close}{_GAP}/ & {once}"]
    return [f"start: THINK {answer} | {answer}",
            f"THINK: /{_GAP}{_regex_escape(reasoning.open)}(?s:.*){close}{_GAP}/ & {once}"]


def _block_regex(reasoning: Reasoning) -> str:
    """Text that opens a reasoning block."""
    return f"/[ \\t\\r\\n]*{_regex_escape(reasoning.open)}(?s:.*)/"


def _regex_escape(text: str) -> str:
    return "".join("\\n" if c == "\n" else "\\" + c if c in r"\.+*?()|[]{}^$/-" else c for c in text)


class Guide:
    """One reply's grammar state: which tokens may come next, and the tokens committed so far."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        # the grammar's bitmask, bit t % 32 of word t // 32 for token t; written by the matcher, read as bytes
        self._bits = np.zeros((vocab_size + 31) // 32, dtype="<u4")

    def _compute(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self.matcher.is_error():
            raise OoOSpecError(f"strict grammar: {self.matcher.get_error()}")

    def allowed(self) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar allows next."""
        self._compute()
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab_size]
        return torch.from_numpy(bits.view(np.bool_))

    def allows(self, token: int) -> bool:
        """Whether the grammar allows `token` next."""
        if not 0 <= token < self.vocab_size:
            return False
        self._compute()
        return bool(int(self._bits[token >> 5]) >> (token & 31) & 1)

    def masked(self, scores: torch.Tensor) -> torch.Tensor:
        """`scores` [..., vocab] with every token the grammar forbids at -inf (a new tensor)."""
        allowed = self.allowed().to(scores.device)
        n = scores.shape[-1]
        if n > self.vocab_size:
            allowed = torch.cat([allowed, allowed.new_zeros(n - self.vocab_size)])
        return scores.masked_fill(~allowed[:n], float("-inf"))

    def choose(self, logits: torch.Tensor) -> int:
        """The target's greedy token under the grammar, committed to the grammar's state: the plain argmax
        where the grammar allows it (the first largest logit of all is then the first largest of those
        allowed, so the masked argmax is the same token), else the argmax of the masked row."""
        token = greedy(logits)
        if not self.allows(token):
            token = greedy(self.masked(logits))
        self.consume([token])
        return token

    def forced(self, limit: int) -> list[int]:
        """Jump-forward: the run of next tokens that the grammar forces, each the only token its mask
        allows, consumed (at most `limit`; it ends after EOS). The masked argmax of any logits is that
        token, so the target need not choose it. A byte string the grammar forces is not enough: the
        model might tokenise it differently, so a mask with two tokens allowed ends the run."""
        run: list[int] = []
        while len(run) < limit and not self.matcher.is_stopped():
            allowed = self.allowed().nonzero()
            if len(allowed) != 1:
                break
            run.append(int(allowed[0]))
            self.consume(run[-1:])
        return run

    def consume(self, tokens: list[int]) -> None:
        if self.matcher.is_stopped() and not self.matcher.is_error():
            return  # the grammar has ended (at EOS): the reply ends there, whatever a draft held beyond it
        if tokens and not self.matcher.consume_tokens(tokens):
            raise OoOSpecError(f"strict grammar rejected tokens {tokens}: {self.matcher.get_error()}")


class StrictLogitsProcessor(LogitsProcessor):
    """The masked reference: `target.generate(prompt_ids, logits_processor=[this], do_sample=False)`
    is greedy decoding of the target under the request's grammar. One sequence, one generate call."""

    def __init__(self, guide: Guide | None, n_prompt: int):
        self.guide, self.n_prompt, self.seen = guide, n_prompt, 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.guide is None:
            return scores
        if input_ids.shape[0] != 1:
            raise OoOSpecError(f"StrictLogitsProcessor masks one sequence; got a batch of {input_ids.shape[0]}")
        new = input_ids[0, self.n_prompt + self.seen:].tolist()
        self.guide.consume(new)
        self.seen += len(new)
        return self.guide.masked(scores)
