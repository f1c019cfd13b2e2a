# %% [markdown]
# # A LlamaIndex `FunctionAgent` on `OoOSpec`
#
# An ordinary LlamaIndex `FunctionAgent` with a Python tool, where the only change is the LLM:
# `OoOSpec` runs a local Hugging Face model as a function-calling LLM and decodes its tool calls with
# lossless speculation. `model="embedded"` is the small SmolLM2-135M pair that ships with the package.

# %%
import asyncio

from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

from llama_index.llms.oospec import OoOSpec


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


# was: llm = OpenAI(model="gpt-4o-mini")
llm = OoOSpec(model="embedded", max_new_tokens=48)
agent = FunctionAgent(tools=[multiply], llm=llm)


async def ask(question: str):
    handler = agent.run(question, max_iterations=4)
    tool_results = [e for e in [event async for event in handler.stream_events()] if isinstance(e, ToolCallResult)]
    return await handler, tool_results


# %% [markdown]
# The agent loop: the LLM may call `multiply`, the agent runs it, and the LLM answers.

# %%
response, tool_results = asyncio.run(ask("What is 6 times 7?"))
for r in tool_results:
    print(f"tool {r.tool_name}({r.tool_kwargs}) -> {r.tool_output.content}")
print("answer:", response)

# %% [markdown]
# The speculation stats of a reply are in `ChatResponse.raw["stats"]`. The same forced call, decoded
# three ways: identical text, fewer target forwards.

# %%
from llama_index.core.tools import FunctionTool

tools = [FunctionTool.from_defaults(multiply)]
for method in ["ar", "toolspec", "oospec"]:
    reply = OoOSpec(model="embedded", max_new_tokens=48, method=method).chat_with_tools(
        tools, user_msg="What is 12 times 9?", tool_required=True)
    stats = reply.raw["stats"]
    print(f"{method:>8}: {stats['target_forwards']:3d} target forwards, "
          f"accepted by source {stats['accepted_by_source']} -> {reply.raw['text']!r}")
