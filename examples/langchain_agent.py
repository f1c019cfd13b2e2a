# %% [markdown]
# # A LangChain agent on `ChatOoOSpec`
#
# An ordinary LangChain agent (`langchain.agents.create_agent` with a Python tool) where the only
# change is the chat model: `ChatOoOSpec` runs a local Hugging Face model and decodes its tool calls
# with lossless speculation. `model="embedded"` is the small SmolLM2-135M pair that ships with the
# package, so this runs on a laptop CPU with no download.

# %%
from langchain.agents import create_agent

from langchain_oospec import ChatOoOSpec


def get_current_weather(location: str) -> str:
    """Get the current weather in a given city."""
    return f"It is 22 degrees Celsius and sunny in {location}."


# was: model = ChatOpenAI(model="gpt-4o-mini")
model = ChatOoOSpec(model="embedded", max_tokens=48)
agent = create_agent(model, tools=[get_current_weather])

# %% [markdown]
# The agent loop: the model may call the tool, the agent runs it and feeds the result back, and the
# model answers. `recursion_limit` stops a small model that keeps calling tools early.

# %%
result = agent.invoke({"messages": [{"role": "user", "content": "What is the current weather in Paris?"}]},
                      {"recursion_limit": 6})
for message in result["messages"]:
    message.pretty_print()

# %% [markdown]
# Each AI message carries the speculation stats in `response_metadata`: how many target forwards the
# reply took and which drafter proposed the tokens that were accepted.

# %%
for message in result["messages"]:
    if message.type == "ai":
        meta = message.response_metadata
        print(f"{meta['method']}: {len(message.content)} chars, {len(message.tool_calls)} tool call(s), "
              f"{meta['target_forwards']} target forwards, accepted by source {meta['accepted_by_source']}")

# %% [markdown]
# The same tool call decoded three ways. The text is identical (the target alone decides every
# token); only the number of target forwards changes.

# %%
question = "What is the weather in Tokyo, in fahrenheit?"
for method in ["ar", "toolspec", "oospec"]:
    forced = ChatOoOSpec(model="embedded", max_tokens=48, method=method).bind_tools(
        [get_current_weather], tool_choice="required")
    reply = forced.invoke(question)
    print(f"{method:>8}: {reply.response_metadata['target_forwards']:3d} target forwards -> {reply.tool_calls}")
