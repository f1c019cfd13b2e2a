"""Tool schemas: normalise what agents pass in, check it, and validate calls against it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

import jsonschema

from .errors import ToolSchemaError, UnknownToolError

_EMPTY_PARAMS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    _validator: Any = field(repr=False, compare=False, default=None)
    strict: bool = False  # OpenAI's per-function "strict": calls must follow the schema (grammar.py)

    def __post_init__(self):
        if self._validator is None:  # built by hand: check the schema and build its validator here
            object.__setattr__(self, "_validator", _validator(self.name, self.parameters))

    @property
    def properties(self) -> dict:
        return self.parameters.get("properties") or {}

    @property
    def required(self) -> list[str]:
        return [k for k in self.parameters.get("required") or [] if k in self.properties]

    def to_openai(self) -> dict:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": dict(fn, strict=True) if self.strict else fn}

    def validate(self, arguments: Any) -> str | None:
        """None when `arguments` satisfies the schema, else the validator's message."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{error.message}" + (f" (at '{where}')" if where else "")


def _tool_from_dict(spec: Any, position: int) -> Tool:
    if not isinstance(spec, dict):
        raise ToolSchemaError(f"tool #{position} must be a dict in OpenAI function format, got {type(spec).__name__}")
    # {"type": "function", "function": {...}} (Chat Completions) or the same keys flat (the Responses API)
    fn = spec.get("function", spec) if spec.get("type", "function") == "function" else None
    if fn is None:
        raise ToolSchemaError(f"tool #{position} has type {spec.get('type')!r}; only 'function' tools are supported")
    if not isinstance(fn, dict):
        raise ToolSchemaError(f"tool #{position}: 'function' must be a dict")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolSchemaError(f"tool #{position} is missing its 'name' (expected {{\"type\": \"function\", "
                              f"\"function\": {{\"name\": ...}}}} or the flat {{\"type\": \"function\", \"name\": ...}})")
    params = fn.get("parameters", _EMPTY_PARAMS)
    if params is None:
        params = _EMPTY_PARAMS
    if not isinstance(params, dict):
        raise ToolSchemaError(f"tool {name!r}: 'parameters' must be a JSON Schema object, got {type(params).__name__}")
    strict = fn.get("strict", False)
    if not isinstance(strict, bool) and strict is not None:
        raise ToolSchemaError(f"tool {name!r}: 'strict' must be true or false, got {strict!r}")
    return Tool(name=name, description=str(fn.get("description") or ""), parameters=params, strict=bool(strict))


def _validator(name: str, params: Any):
    if not isinstance(params, dict):
        raise ToolSchemaError(f"tool {name!r}: 'parameters' must be a JSON Schema object, got {type(params).__name__}")
    validator_cls = jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator)
    problems = schema_problems(validator_cls, params)
    if problems:
        listed = "; ".join(f"{path}: {message}" for path, message in problems)
        raise ToolSchemaError(f"tool {name!r} has an invalid JSON Schema ({len(problems)} problem"
                              f"{'s' * (len(problems) > 1)}; $ is its 'parameters'): {listed}")
    if params.get("type", "object") != "object":
        raise ToolSchemaError(f"tool {name!r}: parameters must have type 'object', got {params.get('type')!r}")
    return validator_cls(params)


def schema_problems(validator_cls, params: dict) -> list[tuple[str, str]]:
    """Every place where `params` breaks its draft's metaschema, as (JSON path, message), in schema order:
    each problem is named where it is (`$.properties.city.type`), not only the first one found."""
    meta = validator_cls.META_SCHEMA
    checker = jsonschema.validators.validator_for(meta, default=validator_cls)(meta)
    found = {(error.json_path, error.message): None for error in checker.iter_errors(params)}
    return list(found)


def normalize_tools(tools: Iterable[Any] | None) -> list[Tool]:
    """Tool dicts to checked `Tool`s. Each is OpenAI's Chat Completions form
    `{"type": "function", "function": {"name", "description", "parameters", "strict"}}` or the flat form
    the Responses API writes, `{"type": "function", "name", "description", "parameters", "strict"}`
    (`"type"` may be left out of either); both give the same `Tool`."""
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, dict)):
        raise ToolSchemaError("tools must be a list of tool dicts")
    out: list[Tool] = []
    seen: set[str] = set()
    for i, spec in enumerate(tools):
        tool = spec if isinstance(spec, Tool) else _tool_from_dict(spec, i)
        if tool.name in seen:
            raise ToolSchemaError(f"duplicate tool name {tool.name!r}: tool names must be unique")
        seen.add(tool.name)
        out.append(tool)
    return out


def resolve_tool_choice(tool_choice: Any, tools: list[Tool]) -> tuple[str, str | None]:
    """Normalise tool_choice to (mode, name): mode is "auto", "none", "required" or "named".

    "required" (or "any") with a single tool offered is "named" for that tool."""
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if not name:
            raise UnknownToolError(f"tool_choice dict must name a function, got {tool_choice!r}")
        tool_choice = name
    if not isinstance(tool_choice, str):
        raise UnknownToolError(f"tool_choice must be a string or a dict, got {type(tool_choice).__name__}")
    if tool_choice in ("auto", "none"):
        return tool_choice, None
    if tool_choice in ("required", "any"):
        if not tools:
            raise UnknownToolError(f"tool_choice={tool_choice!r} but no tools were offered")
        # one tool on offer: requiring a call names it, so its name is forced rather than decoded
        return ("named", tools[0].name) if len(tools) == 1 else ("required", None)
    names = [t.name for t in tools]
    if tool_choice not in names:
        raise UnknownToolError(f"tool_choice names unknown tool {tool_choice!r}; offered tools: {names}")
    return "named", tool_choice


class CheckedCalls(NamedTuple):
    """A reply's calls, classed as OpenAI (and ChatOpenAI, ChatOllama) class them.

    - `tool_calls`: {"id", "name", "arguments": dict}, every call whose arguments parse as a JSON object,
      even one that misfits its tool's schema or names a tool that was not offered;
    - `invalid_tool_calls`: {"id", "name", "arguments": str, "error"}, the calls that cannot be read:
      arguments that do not parse, or that are no object, or a call cut off before its end;
    - `tool_call_problems`: {"id", "name", "error"}, beside the tool call of that id, for each one that
      misfits its schema (the validator's message) or names a tool not offered. `strict` is what makes
      calls fit their schemas; without it a problem is reported, not turned into an invalid call.
    """
    tool_calls: list[dict]
    invalid_tool_calls: list[dict]
    tool_call_problems: list[dict]

    @property
    def all_fit(self) -> bool:
        """Every call parses and fits its offered tool's schema."""
        return not self.invalid_tool_calls and not self.tool_call_problems


def check_calls(calls: list[dict], tools: list[Tool], id_prefix: str = "call") -> CheckedCalls:
    """Class parsed calls (`CheckedCalls`), validating each that parses against its tool's schema.

    Each parsed call is {"name", "arguments": dict | str, "error"?} (a format's `parse`); call `i` gets
    the id `f"{id_prefix}_{i}"` (the reply's order, which `frontend.call_problems` reads back), and
    nothing is dropped.
    """
    by_name = {t.name: t for t in tools}
    valid, invalid, problems = [], [], []
    for i, call in enumerate(calls):
        call_id = f"{id_prefix}_{i}"
        name, args, error = call.get("name"), call.get("arguments"), call.get("error")
        if error is None and not isinstance(args, dict):
            error = f"arguments must be a JSON object, got {type(args).__name__}"
        if error is not None:
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            invalid.append({"id": call_id, "name": name, "arguments": text, "error": error})
            continue
        valid.append({"id": call_id, "name": name, "arguments": args})
        problem = (f"unknown tool {name!r}; offered tools: {sorted(by_name)}" if name not in by_name
                   else by_name[name].validate(args))
        if problem is not None:
            problems.append({"id": call_id, "name": name, "error": problem})
    return CheckedCalls(valid, invalid, problems)
