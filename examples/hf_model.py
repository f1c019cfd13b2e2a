# %% [markdown]
# # Your own Hugging Face model: by id or by local path
#
# `Engine.from_pretrained` takes a Hugging Face id (`"Qwen/Qwen2.5-1.5B-Instruct"`), a local
# directory in Hugging Face format (what `save_pretrained` writes), or a `.gguf` file. The embedded
# sidecar serves any target, across tokenizers. Set `OOSPEC_MODEL` to your model's id or directory;
# left unset, this notebook first writes a local directory from the embedded weights, so it runs
# offline on a laptop CPU.

# %%
import os
from pathlib import Path

from oospec_agents import Engine

MODEL = os.environ.get("OOSPEC_MODEL")  # e.g. "Qwen/Qwen2.5-1.5B-Instruct" or "/models/my-finetune"
if MODEL is None:
    MODEL = "my-model"
    if not (Path(MODEL) / "config.json").exists():
        with Engine.from_pretrained("embedded", sidecar=False) as source:
            source.target.save_pretrained(MODEL)  # any transformers causal LM saved this way will do
            source.tokenizer.save_pretrained(MODEL)
print(sorted(p.name for p in Path(MODEL).iterdir()) if Path(MODEL).is_dir() else MODEL)

# %% [markdown]
# Load it as the target. With two GPUs the target goes on `cuda:0` and the sidecar on `cuda:1`; with
# one, both share it; on a CPU they share its cores. `dtype` and the devices can be given:
# `Engine.from_pretrained(MODEL, target_device="cuda:0", sidecar_device="cuda:1", dtype="bfloat16")`.
# A tokenizer without a chat template needs `chat_template=` (docs/troubleshooting.md).

# %%
engine = Engine.from_pretrained(MODEL)
tools = [{"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}]
messages = [{"role": "user", "content": "What is the weather in Paris today, in celsius?"}]

# %% [markdown]
# The same call three ways. The tokens are identical (the target alone decides each one); only the
# number of target forwards changes.

# %%
for method in ["ar", "toolspec", "oospec"]:
    gen = engine.generate(messages, tools, tool_choice="required", max_new_tokens=32, method=method)
    print(f"{method:>8}: {gen.stats['target_forwards']:3d} target forwards -> {gen.tool_calls}")

# %% [markdown]
# The front-ends take the same reference (`ChatOoOSpec(model=MODEL)`, `OoOSpec(model=MODEL)`,
# `oospec serve --model MODEL`), or share this engine:

# %%
from langchain_oospec import ChatOoOSpec

reply = ChatOoOSpec(engine=engine, max_tokens=32).bind_tools(tools, tool_choice="required").invoke(messages[0]["content"])
print(reply.tool_calls)
engine.close()
