"""TEST HELPER: the sidecar tests' tools and request, and a sidecar aimed at a tool of the test's choice."""
from __future__ import annotations

from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest, SidecarBase
from oospec_agents.tools import normalize_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city. A second sentence nobody needs.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}, "hours": {"type": "array", "items": {"type": "integer"}}},
    "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
N = 24  # new tokens per request in the model tests: the call's name and first arguments


def hint_request(tool_choice=("required", None), fmt=None, messages=ASK, tools=(WEATHER, TIME)):
    return HintRequest(normalize_messages(messages), normalize_tools(list(tools)), fmt or HermesFormat(), tool_choice)


class Aimed(SidecarBase):
    """TEST DOUBLE: a sidecar whose hint for a request names `first` (or the named tool_choice's tool),
    with the call text `calls[name]`; every request is recorded. `fail_named` makes a named submit raise."""

    def __init__(self, calls: dict[str, str], first: str, fail_named: bool = False):
        self.calls, self.first, self.fail_named, self.requests = calls, first, fail_named, []

    def submit(self, request):
        from oospec_agents.sidecar.protocol import FixedHint
        self.requests.append(request)
        mode, name = request.tool_choice
        if mode == "named" and self.fail_named:
            raise RuntimeError("the follow-up wave broke")
        if mode != "named" and self.first is None:
            return _Declined()
        return FixedHint(self.calls[name if mode == "named" else self.first]).submit(request)


class _Declined:
    error, declined = None, True

    def poll(self):
        return None

    def cancel(self):
        pass
