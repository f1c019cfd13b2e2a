"""MCP tools (#65): annotations decide which tools start early, only for trusted servers; the runner on a
real MCP server (oospec_agents/mcp/server.py, FastMCP) over stdio and streamable HTTP.

The agent-framework tests (LangChain's MultiServerMCPClient, LlamaIndex's McpToolSpec) are in
integrations/*/tests/*mcp*; the MCP agent bench in tests/test_mcp_bench.py.
"""
from __future__ import annotations

import asyncio
import time

import pytest
from mcp.types import Tool, ToolAnnotations

from mcp_testing import calls, cancelled, write_spec
from oospec_agents.errors import ToolSchemaError
from oospec_agents.mcp import ServerTool, annotations_of, declares_read_only, early_tools, listed, openai_tool
from oospec_agents.mcp.session import HttpServer, McpSession, server_command, text_of
from oospec_agents.speculative import SpeculativeTools


# -- what the annotations say ---------------------------------------------------------------------

@pytest.mark.parametrize("annotations, read_only", [
    ({"readOnlyHint": True}, True),
    ({"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": True}, True),
    ({"readOnlyHint": True, "destructiveHint": True}, False),       # contradictory: the write wins
    ({"readOnlyHint": False, "idempotentHint": True}, False),        # idempotent writes are still writes
    ({"destructiveHint": False}, False),                             # says nothing about reading only
    ({"readOnlyHint": "true"}, False),                               # malformed: no declaration
    ({}, False), (None, False), ("readOnly", False),
])
def test_declared_read_only_is_read_only_true_and_not_destructive(annotations, read_only):
    assert declares_read_only(annotations_of({"name": "t", "annotations": annotations})) is read_only


def test_annotations_are_read_from_sdk_tools_dicts_and_langchain_metadata():
    sdk = Tool(name="t", inputSchema={"type": "object"}, annotations=ToolAnnotations(readOnlyHint=True))
    assert annotations_of(sdk)["readOnlyHint"] is True
    assert annotations_of(ToolAnnotations(readOnlyHint=True, destructiveHint=False))["destructiveHint"] is False
    assert annotations_of({"readOnlyHint": True, "title": None})["readOnlyHint"] is True  # a LangChain tool's metadata
    assert annotations_of(Tool(name="t", inputSchema={"type": "object"})) is None
    assert annotations_of(ToolAnnotations()) is None            # every hint absent: nothing declared
    assert annotations_of({"name": "t", "annotations": {"readOnlyHint": 1}}) is None


def tools_of(server: str, **annotations) -> list[ServerTool]:
    return [ServerTool(server, name, a) for name, a in annotations.items()]


def test_only_trusted_servers_annotations_start_tools_early():
    travel = tools_of("travel", weather={"readOnlyHint": True}, book={"readOnlyHint": False, "destructiveHint": True},
                      notes=None)
    mail = tools_of("mail", search_mail={"readOnlyHint": True})
    assert early_tools(travel + mail) == []                      # nothing is trusted by default
    assert early_tools(travel + mail, trust=["travel"]) == ["weather"]
    assert early_tools(travel + mail, trust=["travel", "mail"]) == ["weather", "search_mail"]


def test_overrides_decide_before_the_annotations():
    travel = tools_of("travel", weather={"readOnlyHint": True}, web={"readOnlyHint": True, "openWorldHint": True})
    mail = tools_of("mail", search_mail={"readOnlyHint": True})
    assert early_tools(travel + mail, trust=["travel"], overrides={"web": False, "search_mail": True}) == [
        "weather", "search_mail"]
    assert early_tools(travel, overrides={"my_python_tool": True}) == ["my_python_tool"]  # not MCP: the user's word


def test_a_name_two_servers_list_is_early_only_if_every_listing_is():
    both = tools_of("travel", search={"readOnlyHint": True}) + tools_of("mail", search={"readOnlyHint": True})
    assert early_tools(both, trust=["travel"]) == []             # the call could reach the untrusted one
    assert early_tools(both, trust=["travel", "mail"]) == ["search"]


@pytest.mark.parametrize("tools, kwargs, why", [
    ([], {}, r"the servers listed no tool"),
    ("both", {}, r"trust names no server \(the default trust=\(\)\), and a server's annotations count only for the "
                 r"servers named in trust \(here: \['mail', 'travel'\]\)"),
    ("both", {"trust": ["travel"], "overrides": {"weather": False}},
     r"of the tools of the trusted servers \['travel'\]: set False in overrides \['weather'\]; no annotations "
     r"\(or malformed ones\) \['notes'\]; annotations not readOnlyHint true with destructiveHint not true "
     r"\['book'\]; read-only, but an untrusted server lists the same name \['search'\] \(servers not trusted: "
     r"\['mail'\]\)"),
])
def test_when_no_tool_may_start_early_a_warning_says_why(tools, kwargs, why):
    from oospec_agents.speculative import NothingSpeculativeWarning
    if tools == "both":
        tools = tools_of("travel", weather={"readOnlyHint": True}, book={"readOnlyHint": False}, notes=None,
                         search={"readOnlyHint": True}) + tools_of("mail", search={"readOnlyHint": True})
    with pytest.warns(NothingSpeculativeWarning, match=r"^no MCP tool may start early: " + why + "; the agent runs "
                      "every tool when it runs the call, as without speculation$"):
        assert early_tools(tools, **kwargs) == []


@pytest.mark.parametrize("kwargs, error, match", [
    ({"trust": "travel"}, TypeError, r"trust must be a list of server names, got the string 'travel'"),
    ({"trust": ["trav"]}, ValueError, r"trust names \['trav'\], which listed no tool here \(servers: \['travel'\]\)"),
    ({"overrides": {"weather": "yes"}}, ValueError, r"overrides\['weather'\] must be True \(start early\) or False"),
])
def test_bad_trust_and_overrides_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        early_tools(tools_of("travel", weather={"readOnlyHint": True}), **kwargs)


def test_a_schema_the_normaliser_cannot_take_names_the_tool_and_the_server():
    bad = listed("travel", [{"name": "get_weather", "inputSchema": {"type": "array"}}])[0]
    with pytest.raises(ToolSchemaError, match=r"MCP server 'travel', tool 'get_weather': its input schema cannot be used"):
        openai_tool(bad)
    with pytest.raises(ValueError, match=r"MCP server 'travel' listed a tool without a name"):
        listed("travel", [{"inputSchema": {"type": "object"}}])
    good = listed("travel", [{"name": "t", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}}])
    assert openai_tool(good[0])["function"]["parameters"]["properties"] == {"q": {"type": "string"}}


# -- the runner on a real MCP server ------------------------------------------------------------------

@pytest.fixture(scope="module")
def travel(tmp_path_factory):
    return write_spec(tmp_path_factory.mktemp("mcp"), "travel")


@pytest.fixture(scope="module", params=["stdio", "http"])
def session(request, travel):
    spec, _ = travel
    if request.param == "http":
        with HttpServer(spec) as server, McpSession("travel", url=server.url) as s:
            yield s
    else:
        command, args = server_command(spec)
        with McpSession("travel", command=command, args=args) as s:
            yield s


def runner_for(session: McpSession, trust=("travel",), meta: dict | None = None) -> SpeculativeTools:
    """The runner of the tools the session's server declares read-only, each a real tools/call (with
    the request `_meta` given: {"oospec": {"latency": s}} sets the server's sleep)."""
    names = early_tools(listed(session.name, session.list_tools()), trust)

    def tool(name):
        async def run(arguments):
            return text_of(await session.acall(name, arguments, meta))
        return run
    return SpeculativeTools({name: tool(name) for name in names})


PARIS = {"location": "Paris"}


def wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.02)
    return condition()


def test_the_annotations_arrive_and_decide(session):
    assert early_tools(listed("travel", session.list_tools()), ["travel"]) == [
        "get_current_weather", "get_local_time", "flaky_lookup", "crash_lookup"]


def test_a_predicted_call_is_a_real_tools_call_and_the_verified_call_takes_its_result(session, travel):
    _, log = travel
    before = len(calls(log))
    with runner_for(session) as runner:
        runner.predicted([{"name": "get_current_weather", "arguments": PARIS},
                          {"name": "book_table", "arguments": {"restaurant": "Da Michele", "people": 2}}])
        assert wait_for(lambda: len(calls(log)) > before)
        assert [c["tool"] for c in calls(log)[before:]] == ["get_current_weather"]  # booking never started early
        runner.settle([{"name": "get_current_weather", "arguments": PARIS}])
        out = runner.run("get_current_weather", PARIS, lambda: pytest.fail("ran twice"))
        assert out == "It is 22 degrees Celsius and sunny."
        assert runner.stats["hits"] == 1 and runner.stats["not_speculative"] == 1
    assert len(calls(log)) == before + 1


def test_a_wasted_run_is_cancelled_on_the_server(session, travel):
    _, log = travel
    nowhere = {"location": "Nowhere"}
    # the log is the module's, shared by both transports: only this run's call counts (the stdio run
    # logged the same arguments before; waiting on that one dropped this run before its request was sent)
    before, sent = len(cancelled(log)), len(calls(log))
    with runner_for(session, meta={"oospec": {"latency": 20}}) as runner:  # still running when dropped
        runner.predicted([{"name": "get_local_time", "arguments": nowhere}])
        assert wait_for(lambda: any(c["arguments"] == nowhere for c in calls(log)[sent:]))  # the server runs it
        assert runner.settle([]) == 1
        assert wait_for(lambda: len(cancelled(log)) > before)   # notifications/cancelled stopped it there
    assert [c["arguments"] for c in cancelled(log)[before:]] == [nowhere]
    assert runner.stats["wasted"] == 1 and runner.stats["cancelled"] == 1


def test_an_error_answer_is_discarded_unless_the_verified_call_claims_it(session):
    with runner_for(session) as runner:
        runner.predicted([{"name": "flaky_lookup", "arguments": {"location": "Oslo"}}])
        runner.settle([])  # nobody claimed it: dropped, counted, never seen
        runner.predicted([{"name": "flaky_lookup", "arguments": PARIS}])
        result = runner.run("flaky_lookup", PARIS, lambda: pytest.fail("ran twice"))
        assert result.startswith("Error executing tool flaky_lookup") or "failed" in result
        assert runner.stats["wasted"] == 1 and runner.stats["hits"] == 1


def test_an_untrusted_server_starts_nothing_early(session, travel):
    _, log = travel
    before = len(calls(log))
    with runner_for(session, trust=()) as runner:
        assert runner.tools == ()
        runner.predicted([{"name": "get_current_weather", "arguments": PARIS}])
        assert runner.stats["not_speculative"] == 1
    assert len(calls(log)) == before


def crash(tmp_path, speculative: bool) -> BaseException:
    """What the agent's call of crash_lookup raises, its server dying mid-call; and the call log."""
    spec, log = write_spec(tmp_path / ("speculative" if speculative else "plain"), "travel")
    command, args = server_command(spec)
    with McpSession("travel", command=command, args=args) as s, runner_for(s, ("travel",) if speculative else ()) as runner:
        runner.predicted([{"name": "crash_lookup", "arguments": PARIS}])
        with pytest.raises(Exception) as raised:
            runner.run("crash_lookup", PARIS, lambda: s.call("crash_lookup", PARIS))
        assert runner.stats["hits"] == int(speculative)
    assert [c["tool"] for c in calls(log)] == ["crash_lookup"]  # one call reached the server, not two
    return raised.value


def test_a_server_that_dies_mid_call_gives_the_normal_error(tmp_path):
    early, normal = crash(tmp_path, speculative=True), crash(tmp_path, speculative=False)
    assert (type(early), str(early)) == (type(normal), str(normal))


def test_a_session_needs_a_command_or_a_url():
    with pytest.raises(ValueError, match=r"MCP server 'x': give either command \(stdio\) or url"):
        McpSession("x")
    with pytest.raises(RuntimeError, match=r"MCP server 'x': the session did not open"):
        McpSession("x", url="http://127.0.0.1:9/mcp", timeout=60)


def test_acall_can_be_awaited_from_another_loop(session):
    async def two():
        return await asyncio.gather(session.acall("get_current_weather", PARIS),
                                    session.acall("get_local_time", PARIS))
    weather, clock = asyncio.run(two())
    assert text_of(weather) == "It is 22 degrees Celsius and sunny." and "get_local_time" in text_of(clock)
