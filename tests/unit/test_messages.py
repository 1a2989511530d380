from datetime import UTC

import apprise

from gpuwarden.alert.apprise_channel import AppriseChannel
from gpuwarden.alert.context import Context
from gpuwarden.alert.messages import compose
from gpuwarden.alert.storm import Outgoing
from gpuwarden.alert.targets import Target, safe_name
from gpuwarden.core.model import Event, Severity

CTX = Context("box1", {"0000:03:00.0": (0, "Radeon AI PRO R9700")}, {"vllm": frozenset({"0000:03:00.0"})}, UTC)


def test_message_has_what_happened_evidence_actions_runbook_and_id():
    lost = Event("device_lost", Severity.CRITICAL, "the GPU fell off the PCIe bus on 0000:03:00.0", 1.0,
                 gpu="0000:03:00.0", evidence={"line": "amdgpu 0000:03:00.0: amdgpu: device lost from bus!",
                                               "runbook": "device_lost"})
    killed = Event("engine_killed", Severity.WARNING, "killed vllm: 3 processes", 1.5, gpu="0000:03:00.0",
                   engine="vllm")
    out = Outgoing("GPU 0000:03:00.0", [lost, killed], [1, 2], repeats={"sq_intr:0000:03:00.0": (41, 0.5)},
                   severity=Severity.CRITICAL)
    m = compose(out, CTX, "gw-abc")
    assert m.title == ("box1: GPU 0 (0000:03:00.0, Radeon AI PRO R9700) fell off the bus — reboot needed; "
                       "on it: engine vllm (killed)")
    assert "the GPU fell off the PCIe bus" in m.body
    assert "`sq_intr` since" in m.body and "41 more" in m.body
    assert "device lost from bus!" in m.body.split("**Evidence**")[1]
    assert "**What gpuwarden did**\n- 00:00:01 UTC  killed vllm: 3 processes" in m.body
    steps = m.body.split("**What to do**")[1]
    assert steps.startswith("\n1. Reboot, then wait a full 10 minutes")  # first, not third
    assert "Never unbind/bind" in steps and "resource\\*\\_resize" in steps and "Start vllm again" not in steps
    assert "resource*_resize" in m.text
    assert m.body.endswith("alert id: gw-abc")
    assert {"device_lost", "0000:03:00.0", "vllm"} <= m.tags


def test_plain_text_has_no_markdown():
    event = Event("ring_timeout", Severity.CRITICAL, "a GPU ring timed out on 0000:03:00.0", 1.0,
                  gpu="0000:03:00.0", evidence={"line": "amdgpu 0000:03:00.0: ring gfx timeout", "decision": [
                      {"action": "kill", "engine": "vllm", "reason": "kernel reported ring_timeout", "by_hand": False,
                       "dry_run": False}]})
    m = compose(Outgoing("GPU 0000:03:00.0", [event], [1], severity=Severity.CRITICAL), CTX, "gw-t")
    assert "**" in m.body and "```" in m.body
    assert not any(mark in m.text for mark in ("**", "```", "`"))
    assert "Decision:\n  - kill vllm: kernel reported ring_timeout." in m.text
    assert "    amdgpu 0000:03:00.0: ring gfx timeout" in m.text
    assert m.title == "box1: killing engine vllm — GPU 0 (0000:03:00.0, Radeon AI PRO R9700) ring timeout"


def test_no_action_says_why_and_never_hedges():
    stall = Event("engine_stall", Severity.CRITICAL, "vllm: stalled", 1.0, engine="vllm", evidence={
        "figures": {"stalled_seconds": 90.0, "running": 2}, "decision": [
            {"action": "alert_only", "engine": "vllm", "reason": 'on_stall = "alert"', "by_hand": False,
             "dry_run": False}]})
    m = compose(Outgoing("engine vllm", [stall], [1], severity=Severity.CRITICAL), CTX, "gw-n")
    assert m.title == "box1: engine vllm stalled 90 s with 2 requests running — not acted on"
    assert 'no action on vllm: on_stall = "alert".' in m.text
    assert 'Restart vllm now. gpuwarden left it running (on_stall = "alert")' in m.text
    assert "or, with" not in m.text


def test_history_says_when_its_line_was_logged_and_when_it_was_read():
    """An event read at start from an older line: its `time` is the reading's. The page's When is the line's own
    time where the log said it (a new user found every old fault stamped with the start), else says it cannot."""
    ring = Event("ring_timeout", Severity.WARNING, "a GPU ring timed out on 0000:03:00.0", 7200.0, gpu="0000:03:00.0")
    logged = compose(Outgoing("GPU 0000:03:00.0", [ring.as_history(5400.0)], [1], severity=Severity.WARNING), CTX,
                     "gw-h")
    assert "When: 1970-01-01 01:30:00 UTC, logged before gpuwarden started (read at 02:00:00 UTC)" in logged.text
    unknown = compose(Outgoing("GPU 0000:03:00.0", [ring.as_history()], [1], severity=Severity.WARNING), CTX, "gw-u")
    assert ("When: logged before gpuwarden started, at a time its log does not say (read 1970-01-01 02:00:00 UTC)"
            in unknown.text)
    live = compose(Outgoing("GPU 0000:03:00.0", [ring], [1], severity=Severity.WARNING), CTX, "gw-l")
    assert "When: 1970-01-01 02:00:00 UTC\n" in live.text


def test_resolved_message():
    m = compose(Outgoing("GPU 0000:03:00.0", resolved="junction back to 70 °C", severity=Severity.WARNING),
                CTX, "gw-1")
    assert m.resolved and m.title == "box1: resolved: GPU 0000:03:00.0"
    assert "junction back to 70 °C." in m.text


def test_safe_names_hold_no_secret():
    assert safe_name(1, "ntfys://tk_secret@ntfy.example.org/topic-secret?auth=token") == "1:ntfys://ntfy.example.org"
    assert safe_name(2, "json://user:pw@127.0.0.1:8080/hook") == "2:json://127.0.0.1:8080"
    assert safe_name(3, "tgram://123456:ABCDEF/987") == "3:tgram"
    assert safe_name(4, "ntfy://my-secret-topic") == "4:ntfy"  # on ntfy.sh the topic is the secret


def test_target_routing_by_severity_and_tags():
    t = Target("x", None, Severity.WARNING, frozenset({"device_lost"}))
    assert t.wants(Severity.CRITICAL, frozenset({"device_lost", "0000:03:00.0"}))
    assert not t.wants(Severity.CRITICAL, frozenset({"sq_intr"}))
    assert not Target("y", None, Severity.CRITICAL, frozenset()).wants(Severity.WARNING, frozenset({"x"}))


def test_markdown_only_where_apprise_says_the_service_renders_it():
    def target(url):
        obj = apprise.Apprise()
        assert obj.add(url)
        return AppriseChannel("t", obj)
    assert not target("ntfy://127.0.0.1/topic").markdown  # ntfy's plugin takes text only
    assert target("tgram://123456:ABCDEF/987").markdown  # Telegram renders it (as HTML, converted by apprise)
    assert not target("json://127.0.0.1/hook?format=text").markdown


def test_history_is_marked_and_says_nothing_was_done():
    old = Event("sq_intr", Severity.WARNING, "SQ interrupt on ffff:fe:1f.7", 1.0, gpu="ffff:fe:1f.7").as_history()
    m = compose(Outgoing("GPU ffff:fe:1f.7", [old], [1], severity=Severity.WARNING), CTX, "gw-h")
    assert "(logged before gpuwarden started; no action)" in m.title
    assert "Logged before gpuwarden started: history, never acted on." in m.body


def test_a_gpu_off_the_bus_is_never_told_to_reset_in_place():
    xid79 = Event("xid", Severity.CRITICAL, "Xid 79: GPU has fallen off the bus on 0000:03:00.0", 1.0,
                  gpu="0000:03:00.0", evidence={"xid": 79, "runbook": "xid", "decision": [
                      {"action": "kill", "engine": "vllm", "reason": "kernel reported xid", "by_hand": False,
                       "dry_run": False}]})
    m = compose(Outgoing("GPU 0000:03:00.0", [xid79], [1], severity=Severity.CRITICAL), CTX, "gw-x")
    steps = m.text.split("What to do:")[1]
    assert "nvidia-smi -r" not in steps and "Start vllm again" not in steps  # nothing runs there before a reboot
    assert steps.startswith("\n  1. Reboot, then wait a full 10 minutes")
    assert m.title.endswith("— reboot needed; on it: engine vllm")


def test_a_process_that_names_itself_in_markdown_is_shown_not_rendered():
    """Any local user can fault a shared GPU with a process of any name: in a chat it must read as text, never
    become a link, emphasis, or the end of the evidence's code block."""
    name = "[x](http://e.vil)"
    fault = Event("page_fault", Severity.CRITICAL, "a GPU page fault on 0000:03:00.0", 1.0, gpu="0000:03:00.0",
                  evidence={"lines": ["amdgpu 0000:03:00.0: page fault", f"Process {name} pid 4242 ```"],
                            "process": {"pid": 4242, "name": name}, "decision": [
                                {"action": "refuse", "engine": "vllm", "reason": f"the fault was raised by pid 4242 "
                                 f"({name}), not one of vllm's processes", "by_hand": False, "dry_run": False}]})
    m = compose(Outgoing("GPU 0000:03:00.0", [fault], [1], severity=Severity.CRITICAL), CTX, "gw-m")
    assert "(http://e.vil)" not in m.title and "by pid 4242 (?x?" in m.title
    outside = m.body.split("```")[0] + m.body.split("```")[2]
    assert "](http" not in outside.replace("\\](http", "") and "pid 4242 (\\[x\\](http://e.vil))" in outside
    assert "Process [x](http://e.vil) pid 4242 '''" in m.body.split("```")[1]  # inside the fence, which holds
    assert m.body.count("```") == 2
    assert f"pid 4242 ({name})" in m.text  # plain text shows it as it is
