# %% [markdown]
# # Speculative tools in a LangChain agent
#
# An agent spends much of its time waiting on tools. `SpeculativeToolsMiddleware` starts the tools
# you mark as safe (read-only lookups) as soon as the sidecar *predicts* the call, before the target
# model has finished writing it, and hands the result to the agent when the verified call is
# identical. The agent's transcript is the one it has without the middleware; only the wait is shorter.
# Which tools are safe to mark: `docs/speculative-tools.md`. It needs `pip install "langchain-oospec[agents]"`.

# %%
import time

from langchain.agents import create_agent

from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware

TOOL_SECONDS = 1.0


def get_current_weather(location: str) -> str:
    """Get the current weather in a given city."""
    time.sleep(TOOL_SECONDS)  # stands for an HTTP GET: slow, read-only, safe to start early
    return f"It is 22 degrees Celsius and sunny in {location}."


def send_email(to: str, body: str) -> str:
    """Send an email to someone."""
    return "sent"  # a side effect: never mark it speculative


# %% [markdown]
# Mark only the read-only tool. `tool_seconds` tells the engine how long a run takes until the runner
# has measured it, so the pay-back rule knows what a correct prediction hides. Put the middleware
# first in `middleware=[...]`.

# %%
speculative = SpeculativeToolsMiddleware(speculative=[get_current_weather],
                                         tool_seconds={"get_current_weather": TOOL_SECONDS})
model = ChatOoOSpec(model="embedded", max_tokens=48)
agent = create_agent(model, tools=[get_current_weather, send_email], middleware=[speculative])

# %% [markdown]
# Run the agent as usual. `recursion_limit` stops a small model that keeps calling tools.

# %%
try:
    start = time.perf_counter()
    result = agent.invoke({"messages": [{"role": "user", "content": "What is the current weather in Paris?"}]},
                          {"recursion_limit": 6})
    elapsed = time.perf_counter() - start
    for message in result["messages"]:
        message.pretty_print()
    print(f"\nagent run: {elapsed:.1f}s")
    print("speculative tools:", {k: speculative.stats[k] for k in ("predictions", "started", "hits", "wasted")})
finally:
    speculative.close()  # stops the runner's threads

# %% [markdown]
# `hits` counts the tool runs the agent took over from a prediction: each one hid up to
# `TOOL_SECONDS` of waiting. `wasted` counts runs whose prediction the target did not confirm; their
# results were dropped, and the agent ran nothing twice.
