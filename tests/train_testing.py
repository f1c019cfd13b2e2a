"""TEST HELPER: the training tests' record: a call whose value is not in the request, beside a second tool."""
from __future__ import annotations

from oospec_testing import WEATHER

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}, "fmt": {"type": "string"}}}}}
# The value is not in the request, so any row that saw it would have been shown another row's answer.
TRACE = {"messages": [{"role": "user", "content": "How warm is it in the French capital? Use celsius."}],
         "tools": [WEATHER, TIME],
         "expected": [{"name": "get_current_weather", "arguments": {"city": "Paris"}}]}
