"""Follow-up waves: a second wave for the function the target wrote, when the first hint named another."""
from __future__ import annotations

import torch

from sidecar_testing import Aimed, hint_request
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar.hosts.thread import WaveSidecar


def _session(sidecar, follow_up=True):
    """A session and the outcome it keeps (the engine copies it into the reply's stats)."""
    from oospec_agents.sidecar.cores import Place
    from oospec_agents.sidecar.session import HintSession
    hints = HintSession.open(sidecar, hint_request(), target=Place(torch.device("cpu")), faults=set(),
                             lend_cores=False, follow_up=follow_up)
    return hints, hints.outcome


WEATHER_CALL = HermesFormat().render_call("get_weather", {"city": "Paris"})
TIME_CALL = HermesFormat().render_call("get_time", {"tz": "Europe/Paris"})


def test_a_follow_up_wave_asks_for_the_function_the_target_wrote():
    side = Aimed({"get_weather": WEATHER_CALL, "get_time": TIME_CALL}, first="get_weather")
    hints, outcome = _session(side)
    assert hints.poll("") == WEATHER_CALL and hints.name == "get_weather"
    assert hints.poll('<tool_call>\n{"name": "get_ti') is None  # the name is not written in full yet
    assert hints.poll('<tool_call>\n{"name": "get_weather", "ar') is None  # the hint's own function
    assert len(side.requests) == 1 and outcome.follow_ups == 0
    reply = '<tool_call>\n{"name": "get_time", "'
    assert hints.poll(reply) == TIME_CALL  # asked now, and read in the same round: this sidecar is ready at once
    assert side.requests[-1].tool_choice == ("named", "get_time") and outcome.follow_ups == 1
    assert hints.name == "get_time"
    assert hints.poll(reply) is None and hints.poll(reply + 'arguments": {') is None
    assert len(side.requests) == 2  # each name once
    hints.close()
    assert outcome.error is None


def test_a_declining_wave_is_still_followed_up_when_the_target_writes_a_call():
    side = Aimed({"get_time": TIME_CALL}, first=None)
    hints, outcome = _session(side)
    assert hints.poll("") is None and hints.declined
    reply = '<tool_call>\n{"name": "get_time", "'
    assert hints.poll(reply) == TIME_CALL and hints.poll(reply) is None
    hints.close()
    assert outcome.declined and outcome.follow_ups == 1 and outcome.error is None


def test_no_follow_up_for_a_name_not_offered_nor_when_it_is_off():
    side = Aimed({"get_weather": WEATHER_CALL, "get_time": TIME_CALL}, first="get_weather")
    hints, outcome = _session(side)
    hints.poll("")
    assert hints.poll('<tool_call>\n{"name": "get_news", "') is None and len(side.requests) == 1
    hints, outcome = _session(side, follow_up=False)
    assert hints.poll("") == WEATHER_CALL
    assert hints.poll('<tool_call>\n{"name": "get_time", "') is None and outcome.follow_ups == 0
    assert hints.poll('<tool_call>\n{"name": "get_time", "') is None


def test_a_follow_up_that_fails_is_a_fault_and_no_hint():
    side = Aimed({"get_weather": WEATHER_CALL}, first="get_weather", fail_named=True)
    hints, outcome = _session(side)
    hints.poll("")
    assert hints.poll('<tool_call>\n{"name": "get_time", "') is None
    assert outcome.error.startswith("sidecar submit failed") and hints.text == WEATHER_CALL


def test_follow_ups_are_on_by_default_only_where_the_sidecar_has_cores_of_its_own():
    from oospec_agents.sidecar.cores import Place, shares_cpu
    from oospec_agents.sidecar.session import follows_up
    cpu, gpu = Place(torch.device("cpu")), Place(torch.device("cuda", 0))
    on_cpu = WaveSidecar(lambda *a: [], device="cpu")

    def shares(side, target):
        return shares_cpu(side.device, side.cores, target)
    assert not follows_up(None, shares(on_cpu, cpu)) and follows_up(True, shares(on_cpu, cpu))
    assert follows_up(None, shares(on_cpu, gpu)) and not follows_up(False, shares(on_cpu, gpu))
    assert follows_up(None, shares(Aimed({}, first=""), cpu))  # no CPU device of its own: a remote sidecar
    split = Place(torch.device("cpu"), frozenset({0}))
    assert follows_up(None, shares_cpu(torch.device("cpu"), frozenset({1}), split))  # a core set of its own
