"""TEST HELPER: gpt-oss's harmony format on tiny models. A test copy of gpt-oss's chat template, SmolLM2's
tokenizer with harmony's special tokens, a tiny random `gpt_oss`; the replies and tools the harmony tests
share (their fixtures are in conftest.py).
"""
from __future__ import annotations

import json

import torch

from oospec_agents import ReasoningDelta, TextDelta, ToolCallDelta
from oospec_agents.formats import HarmonyFormat, HarmonyReasoning

#: harmony's special tokens, as gpt-oss's tokenizer holds them
HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"]

# A test copy of the structure of gpt-oss's chat template: harmony's system message (knowledge cutoff,
# `Reasoning: <effort>`, the valid channels), the tools in the developer message's `namespace functions`,
# the system message's text as the developer's `# Instructions`, an earlier call's analysis (`thinking`)
# kept only while no final answer follows it, calls as `<|start|>assistant to=functions.NAME<|channel|>
# commentary <|constrain|>json<|message|>ARGS<|call|>`, results from `functions.NAME`, and the generation
# prompt `<|start|>assistant`. tests/test_harmony_prompt.py checks it against openai-harmony's own renderer.
HARMONY_TEMPLATE = "".join([
    "{%- macro ts_type(p) -%}",
    "{%- if p.enum is defined -%}{%- for e in p.enum -%}{{ e | tojson }}{%- if not loop.last %} | {% endif -%}"
    "{%- endfor -%}",
    "{%- elif p.type == 'string' -%}string{%- elif p.type in ['integer', 'number'] -%}number",
    "{%- elif p.type == 'boolean' -%}boolean{%- elif p.type == 'array' -%}any[]{%- else -%}any{%- endif -%}",
    "{%- endmacro -%}",
    "{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}{%- endif %}",
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n"
    "Knowledge cutoff: 2024-06\\n\\nReasoning: ' + reasoning_effort + '\\n\\n# Valid channels: analysis, "
    "commentary, final. Channel must be included for every message.' }}",
    "{%- if tools %}{{- \"\\nCalls to these tools must go to the commentary channel: 'functions'.\" }}{%- endif %}",
    "{{- '<|end|>' }}",
    "{%- set instructions = messages[0].content if messages[0].role == 'system' else none %}",
    "{%- if instructions or tools %}{{- '<|start|>developer<|message|>' }}",
    "{%- if instructions %}{{- '# Instructions\\n\\n' + instructions }}{%- if tools %}{{- '\\n\\n' }}{%- endif %}"
    "{%- endif %}",
    "{%- if tools %}{{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' }}",
    "{%- for tool in tools %}{%- set f = tool.function %}",
    "{%- if f.description %}{{- '// ' + f.description + '\\n' }}{%- endif %}",
    "{%- if f.parameters %}{{- 'type ' + f.name + ' = (_: {\\n' }}",
    "{%- for key, p in (f.parameters.properties or {}).items() %}",
    "{%- if p.description %}{{- '// ' + p.description + '\\n' }}{%- endif %}",
    "{{- key + ('' if key in (f.parameters.required or []) else '?') + ': ' + ts_type(p) + ',\\n' }}",
    "{%- endfor %}{{- '}) => any;\\n\\n' }}",
    "{%- else %}{{- 'type ' + f.name + ' = () => any;\\n\\n' }}{%- endif %}",
    "{%- endfor %}{{- '} // namespace functions' }}{%- endif %}",
    "{{- '<|end|>' }}{%- endif %}",
    "{%- set last_call = namespace(name=none) %}",
    "{%- for message in messages %}",
    "{%- if message.role == 'system' %}",
    "{%- elif message.role == 'user' %}{{- '<|start|>user<|message|>' + message.content + '<|end|>' }}",
    "{%- elif message.role == 'assistant' and message.tool_calls %}",
    "{%- set later_final = namespace(found=false) %}",
    "{%- for m in messages[loop.index:] %}{%- if m.role == 'assistant' and not m.tool_calls %}"
    "{%- set later_final.found = true %}{%- endif %}{%- endfor %}",
    "{%- if message.thinking and not later_final.found %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}{%- endif %}",
    "{%- for c in message.tool_calls %}",
    "{{- '<|start|>assistant to=functions.' + c.function.name + '<|channel|>commentary <|constrain|>json<|message|>' "
    "+ (c.function.arguments | tojson) + '<|call|>' }}{%- set last_call.name = c.function.name %}",
    "{%- endfor %}",
    "{%- elif message.role == 'assistant' %}",
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}",
    "{%- elif message.role == 'tool' %}",
    "{{- '<|start|>functions.' + last_call.name + ' to=assistant<|channel|>commentary<|message|>' + "
    "message.content + '<|end|>' }}",
    "{%- endif %}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}",
])


def harmony_tokenizer(smollm2_tokenizer):
    """SmolLM2's tokenizer with harmony's special tokens added and the test copy of gpt-oss's template."""
    import copy
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS})
    tok.chat_template = HARMONY_TEMPLATE
    return tok


def tiny_gpt_oss(tokenizer, seed: int = 0):
    """A randomly initialised 2-layer gpt-oss (its mixture of experts, sinks and sliding window) whose
    replies end at `<|return|>` or `<|call|>`, as gpt-oss's generation config says."""
    from transformers import AutoModelForCausalLM, GptOssConfig
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    cfg = GptOssConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=32, max_position_embeddings=4096,
                       rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
                       eos_token_id=stops, pad_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = stops
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model


METHODS = ("ar", "toolspec", "oospec")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "The city"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
PING = {"type": "function", "function": {"name": "ping", "description": "Ping",
        "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"}]
FMT = HarmonyFormat()
H = HarmonyReasoning()

ANALYSIS = "<|channel|>analysis<|message|>The user wants Paris.<|end|>"
CALL = FMT.render_call("get_weather", {"city": "Paris"})
REPLIES = {  # name: (reply text, reasoning, content, calls)
    "think then call": (ANALYSIS + "<|start|>assistant" + CALL, "The user wants Paris.", "",
                        [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    "think then answer": (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
                          "The user wants Paris.", "It is sunny.", []),
    "call at once": (CALL, None, "", [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    "recipient in the role": ("<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions."
                              'get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Rome"}<|call|>',
                              "Look it up.", "", [{"name": "get_weather", "arguments": {"city": "Rome"}}]),
    "preamble then call": (ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                           "<|start|>assistant" + CALL, "The user wants Paris.", "Checking.",
                           [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    "a call written in the analysis": ("<|channel|>analysis<|message|>I'd write to=functions.get_weather "
                                       '{"city": 1}.<|end|><|start|>assistant<|channel|>final<|message|>No.<|return|>',
                                       'I\'d write to=functions.get_weather {"city": 1}.', "No.", []),
}


OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
ROLE = "<|start|>assistant"
FINAL_JSON = '<|channel|>final<|message|>{"ok": true}<|return|>'
STRICT_WEATHER = dict(WEATHER, function=dict(WEATHER["function"], strict=True))


# ---------------------------------------------------------------- a reply, read whole

def read(text: str):
    """(reasoning, content, calls) as the engine reads a whole reply."""
    thought, answer = H.split(text, final=True)
    content, calls = FMT.parse(answer)
    return thought, content, calls


def joined(events) -> tuple[str, str, list]:
    """What a reply's events say, joined: its reasoning, its content, each call's arguments parsed."""
    streamed: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            streamed[e.index] = streamed.get(e.index, "") + e.arguments
    return ("".join(e.text for e in events if isinstance(e, ReasoningDelta)),
            "".join(e.text for e in events if isinstance(e, TextDelta)),
            [json.loads(a) for a in streamed.values()])
