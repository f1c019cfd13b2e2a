# %% [markdown]
# # Speculative tools in a LlamaIndex agent
#
# An agent spends much of its time waiting on tools. `OoOSpecSpeculativeTools` starts the tools you
# mark as safe (read-only lookups) as soon as the sidecar *predicts* the call, before the target model
# has finished writing it, and hands the result to the agent when the verified call is identical.
# The agent's answer is the one it gives without it; only the wait is shorter. Which tools are safe to
# mark: `docs/speculative-tools.md`.

# %%
import asyncio
import time

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.oospec import OoOSpec, OoOSpecSpeculativeTools

TOOL_SECONDS = 1.0


async def get_current_weather(location: str) -> str:
    """Get the current weather in a given city."""
    await asyncio.sleep(TOOL_SECONDS)  # stands for an async HTTP GET: slow, read-only, safe to start early
    return f"It is 22 degrees Celsius and sunny in {location}."


def send_email(to: str, body: str) -> str:
    """Send an email to someone."""
    return "sent"  # a side effect: never mark it speculative


# %% [markdown]
# Wrap the agent's tools and give the agent `spec.tools`. `speculative` names the tools that may run
# early; `tool_seconds` their expected seconds (the engine's pay-back rule weighs them until the runner
# has measured the tool); `llm=` follows only this LLM's replies. Leaving the `with` block stops the runner.

# %%
llm = OoOSpec(model="embedded", max_tokens=48)


async def ask(question: str):
    with OoOSpecSpeculativeTools([get_current_weather, send_email], speculative=["get_current_weather"],
                                 tool_seconds={"get_current_weather": TOOL_SECONDS},
                                 llm=llm) as spec:
        agent = FunctionAgent(tools=spec.tools, llm=llm)
        start = time.perf_counter()
        answer = await agent.run(question)
        return answer, time.perf_counter() - start, dict(spec.stats)


answer, elapsed, stats = asyncio.run(ask("What is the current weather in Paris?"))
print(answer)
print(f"\nagent run: {elapsed:.1f}s")
print("speculative tools:", {k: stats[k] for k in ("predictions", "started", "hits", "wasted")})

# %% [markdown]
# `hits` counts the tool runs the agent took over from a prediction: each one hid up to
# `TOOL_SECONDS` of waiting. `wasted` counts runs whose prediction the target did not confirm; their
# results were dropped, and the agent ran nothing twice.
