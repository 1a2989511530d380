from gpuwarden.alert.messages import compose
from gpuwarden.alert.storm import Outgoing
from gpuwarden.alert.targets import Target, safe_name
from gpuwarden.model import Event, Severity


def test_message_has_what_happened_evidence_actions_runbook_and_id():
    lost = Event("device_lost", Severity.CRITICAL, "the GPU fell off the PCIe bus on 0000:03:00.0", 1.0,
                 gpu="0000:03:00.0", evidence={"line": "amdgpu 0000:03:00.0: amdgpu: device lost from bus!",
                                               "runbook": "device_lost"})
    killed = Event("engine_killed", Severity.WARNING, "killed vllm: 3 processes", 1.5, gpu="0000:03:00.0")
    out = Outgoing("GPU 0000:03:00.0", [lost, killed], [1, 2], repeats={"sq_intr:0000:03:00.0": (41, 0.5)},
                   severity=Severity.CRITICAL)
    m = compose(out, "box1", "gw-abc")
    assert m.title == "[CRITICAL] device_lost, engine_killed, sq_intr on box1: GPU 0000:03:00.0"
    assert "- **critical** `device_lost`: the GPU fell off the PCIe bus" in m.body
    assert "`sq_intr`: and 41 more since" in m.body
    assert "device lost from bus!" in m.body.split("**Evidence**")[1]
    assert "**What gpuwarden did**\n- killed vllm: 3 processes" in m.body
    assert "wait a full 10 minutes" in m.body and "switch the PSU off for 30-60 s" in m.body
    assert "Never unbind/bind" in m.body and "resource*_resize" in m.body
    assert m.body.endswith("alert id: gw-abc")
    assert {"device_lost", "0000:03:00.0"} <= m.tags


def test_resolved_message():
    m = compose(Outgoing("GPU 0000:03:00.0", resolved="junction back to 70 °C", severity=Severity.WARNING),
                "box1", "gw-1")
    assert m.resolved and m.title == "[RESOLVED] box1: GPU 0000:03:00.0"


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


def test_history_is_marked_and_says_nothing_was_done():
    old = Event("sq_intr", Severity.WARNING, "SQ interrupt on ffff:fe:1f.7", 1.0, gpu="ffff:fe:1f.7").as_history()
    m = compose(Outgoing("GPU ffff:fe:1f.7", [old], [1], severity=Severity.WARNING), "box1", "gw-h")
    assert "- **warning** `sq_intr` (history): SQ interrupt" in m.body
    assert "logged before gpuwarden started, and history never kills" in m.body.split("**What gpuwarden did**")[1]
