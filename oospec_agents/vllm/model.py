"""The embedded target as a plain HF directory vLLM can load: the SmolLM2 weights (converted from the
shipped GGUF) with the target's LoRA adapter merged, and a chat template that offers tools the way
the engine's prompt does (the hermes system prompt), so `vllm serve` renders what `Engine.prompt_ids`
renders. Written once under the cache; nothing is downloaded."""
from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock

#: the directory's name under the cache; bump it when what is written changes
NAME = "smollm2-target-merged-v1"


def embedded_target_dir(cache: str | os.PathLike | None = None) -> Path:
    """The embedded target's merged HF directory (written on first use, in float32)."""
    import torch

    from .. import models
    root = Path(cache) if cache is not None else Path(os.environ.get("OOSPEC_CACHE", Path.home() / ".cache" / "oospec"))
    out = root / "vllm" / NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "config.json").exists():
            return out
        model, tok = models.load_model("embedded", device=torch.device("cpu"), dtype=torch.float32,
                                       adapter=models.EMBEDDED_TARGET_ADAPTER)
        tok.chat_template = TOOLS_TEMPLATE
        tmp = out.with_name(out.name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(out)
    return out


# The SmolLM2 template with tools: when `tools` is given (and no system message overrides it), the
# system turn is the hermes format's tool prompt (formats/hermes.py, `system_prompt`), one tool's JSON a
# line; assistant tool calls are written as `<tool_call>` blocks and tool results as `<tool_response>`.
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- 'You are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. "
    "You may call one or more functions to assist with the user query. Don\\'t make assumptions about what values to plug "
    "into functions. Here are the available tools: <tools>\\n' }}"
    "{%- for tool in tools %}{{- (tool | tojson) }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}{%- endfor %}"
    "{{- '\\n</tools>\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{%- if not tools %}"
    "{{- '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if message['content'] %}{{- message['content'] + '\\n' }}{%- endif %}"
    "{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' "
    "+ (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}\\n</tool_call>' }}"
    "{%- if not loop.last %}{{- '\\n' }}{%- endif %}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
