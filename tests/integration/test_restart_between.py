"""gpuwarden itself restarted between a kill and the engine's return (an upgrade, a crash, a reload that
failed): the real daemon kills a stalled fake engine and pages a critical-only pager; it is stopped and started
again on the same store; only then does the engine come back. The second daemon knows the engine was down (its
engine_down condition, kept open in the store), so the return is an engine_back that ends the incident, and its
alert is a follow-up on the first page that reaches the same pager, said once. A reload (SIGHUP), whose new
engine watch starts afresh, is the same gap."""

import re
import signal

import pytest
from helpers import wait_for

from gpuwarden.store.sqlite import Store


def pager(receiver) -> str:
    """The alerts: a critical-only pager on the test receiver."""
    return (f'[alerts]\nhostname = "vm"\ngroup_window = "300ms"\n[[alerts.target]]\nname = "pager"\n'
            f'url = "json://127.0.0.1:{receiver.port}/pager"\nmin_severity = "critical"\n')


def alerted_only(engine) -> str:
    """The engine, its stall alerted only (on_stall = "alert"), no canary."""
    return (f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
            'min_stall = "2s"\non_stall = "alert"\ncanary = "off"\n')


def incident_of(page):
    return re.search(r"incidents/([^`/ ]+)", page["message"]).group(1)


def kinds(d):
    return [e["kind"] for e in d.events()]


@pytest.mark.parametrize("gap", ["restart", "reload"])
def test_the_engine_back_after_a_restart_of_gpuwarden_closes_the_page_it_opened(daemon_factory, fake_engine,
                                                                                 receiver, gap):
    engine = fake_engine("progress")
    config = (f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
              'min_stall = "2s"\nkill_grace = "1s"\ncanary_timeout = "3s"\n' + pager(receiver))
    d = daemon_factory(config).start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: "engine_killed" in kinds(d), 30, interval=0.2, what="the kill")
    wait_for(lambda: any("killed" in b["title"] for b in receiver.json_bodies("/pager")), 20, what="the page")
    pages = len(receiver.json_bodies("/pager"))
    if gap == "restart":
        assert d.stop() == 0
        d.start()  # the same state folder: the same store
        d.wait_serving()
    else:
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log("reloaded")
    back = fake_engine("progress", port=engine.port)  # its supervisor starts it again, on the same port
    found = wait_for(lambda: [e for e in d.events() if e["kind"] == "engine_back"], 60, interval=0.5,
                     what="the engine back")
    wait_for(lambda: len(receiver.json_bodies("/pager")) > pages, 20, what="the follow-up on the pager")
    assert d.stop() == 0
    back.kill()

    [event] = found
    killed = next(e for e in d.events() if e["kind"] == "engine_killed")
    assert event["evidence"]["incident"] == killed["evidence"]["incident"]  # the same incident, not a new one
    assert event["evidence"]["seconds_since_kill"] > 0  # timed from the kill the first daemon made
    *_, last = receiver.json_bodies("/pager")
    assert last["title"] == f"vm: engine fake back — first completion {event['evidence']['seconds_since_kill']:.0f}" \
                            " s after the kill", last["title"]
    assert last["type"] == "success" and "**Update on**: engine fake killed" in last["message"], last["message"]
    assert len(receiver.json_bodies("/pager")) == pages + 1  # said once: nothing of the first page again
    store = Store(d.state / "gpuwarden.db")
    assert store.open_conditions() == []  # the engine is up: nothing left open
    store.close()


@pytest.mark.parametrize("gap", ["none", "restart", "reload"])
def test_a_stall_that_ended_while_gpuwarden_was_down_is_told_as_a_live_one_is(daemon_factory, fake_engine, receiver,
                                                                                gap):
    """An engine stalls (alerted only: on_stall = "alert"), the critical-only pager hears it; the engine works
    again, live or while gpuwarden is stopped. Either way the pager hears it end once, as a follow-up of the
    stall's page, and only once the started daemon has seen the engine progress (not because it restarted)."""
    engine = fake_engine("progress")
    config = alerted_only(engine) + pager(receiver)
    d = daemon_factory(config).start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: any("stall" in b["title"] for b in receiver.json_bodies("/pager")), 30, what="the page")
    pages = len(receiver.json_bodies("/pager"))
    if gap == "restart":
        assert d.stop() == 0
        engine.set_mode("progress")
        d.start()  # the same state folder: the same store
        d.wait_serving()
    elif gap == "reload":  # a new engine watch, whose lifecycles start afresh
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log("reloaded")
        engine.set_mode("progress")
    else:
        engine.set_mode("progress")
    wait_for(lambda: len(receiver.json_bodies("/pager")) > pages, 30, what="the follow-up on the pager")
    wait_for(lambda: not Store(d.state / "gpuwarden.db").open_conditions(), 10, what="nothing left open")
    assert d.stop() == 0

    first, *_, last = receiver.json_bodies("/pager")
    assert last["title"].startswith("vm: resolved: engine fake stalled"), last["title"]
    assert incident_of(last) == incident_of(first)  # a follow-up of the stall's page
    assert last["type"] == "success" and "fake is making progress again" in last["message"], last["message"]
    assert len(receiver.json_bodies("/pager")) == pages + 1  # said once
    ended = [c for c in Store(d.state / "gpuwarden.db").condition_changes() if not c["raised"]]
    assert [c["message"] for c in ended] == ["fake is making progress again"]


def test_a_stall_that_still_holds_after_a_restart_of_gpuwarden_is_no_resolution(daemon_factory, fake_engine,
                                                                                  receiver):
    """Restarting is not evidence: a stall still there when gpuwarden comes back is judged again (a stall event,
    which the policy acts on) and its page hears no "resolved"."""
    engine = fake_engine("progress")
    config = alerted_only(engine) + pager(receiver)
    d = daemon_factory(config).start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: any("stall" in b["title"] for b in receiver.json_bodies("/pager")), 30, what="the page")
    assert d.stop() == 0
    d.start()
    d.wait_serving()
    wait_for(lambda: len([e for e in d.events() if e["kind"] == "engine_stall"]) == 2, 30, interval=0.2,
             what="the stall judged again")
    assert d.stop() == 0
    assert not any("resolved" in b["title"] for b in receiver.json_bodies("/pager"))
    [still] = Store(d.state / "gpuwarden.db").open_conditions()
    assert still.key.kind == "engine_stalled" and not any(
        not c["raised"] for c in Store(d.state / "gpuwarden.db").condition_changes())


def test_a_stalled_engine_no_longer_configured_after_a_restart_is_said_ended_on_its_page(daemon_factory,
                                                                                          fake_engine, receiver):
    """Its stall's page hears that gpuwarden no longer watches it (as after a reload): the alerts take up the last
    run's pages before the start ends anything."""
    engine = fake_engine("progress")
    alerts = pager(receiver)
    d = daemon_factory(alerted_only(engine) + alerts).start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: any("stall" in b["title"] for b in receiver.json_bodies("/pager")), 30, what="the page")
    assert d.stop() == 0
    d.write_config(alerts)  # no [[engine]], no discovery
    d.start()
    d.wait_serving()
    # the engine's pages, each once: the stall's, then its end (the host's own pages, if any, are not this test's)
    about = lambda: [b for b in receiver.json_bodies("/pager") if "engine fake" in b["title"]]  # noqa: E731
    wait_for(lambda: any("resolved" in b["title"] for b in about()), 20, what="the follow-up")
    bodies = about()
    assert len(bodies) == 2, [b["title"] for b in receiver.json_bodies("/pager")]  # the page, then its end
    first, last = bodies
    assert d.stop() == 0
    assert last["title"].startswith("vm: resolved: engine fake stalled"), last["title"]
    assert "fake is no longer watched" in last["message"] and incident_of(last) == incident_of(first)
    assert Store(d.state / "gpuwarden.db").open_conditions() == []
