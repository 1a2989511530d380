"""The pure parts of the alert channels and the exporter's web config: Alertmanager URLs, labels and bodies;
what an Alertmanager target holds firing and sends again; a resolution carries the event whose alert it ends;
basic-auth headers."""

import base64

import bcrypt
import pytest

from gpuwarden.alert.alertmanager import Firing, endpoint, postable
from gpuwarden.alert.channel import Alert, identities
from gpuwarden.alert.storm import StormControl
from gpuwarden.config.web import WebConfig
from gpuwarden.core.model import Event, Severity


def test_alertmanager_urls():
    assert endpoint("alertmanager://127.0.0.1:9093") == ("http://127.0.0.1:9093/api/v2/alerts", None)
    assert endpoint("alertmanagers://u:p@am.example.org/am/") == ("https://am.example.org/am/api/v2/alerts",
                                                                  ("u", "p"))
    assert endpoint("alertmanager://[::1]:9093")[0] == "http://[::1]:9093/api/v2/alerts"
    for bad, said in [("alertmanager:///x", "needs a host"), ("alertmanager://h:port", "not a port number"),
                      ("alertmanager://h:9093/?x=1", "no query"), ("json://h", "not an Alertmanager URL")]:
        with pytest.raises(ValueError, match=said):
            endpoint(bad)


def test_labels_one_identity_per_distinct_set_and_ends_only_on_resolution():
    events = [Event("engine_stall", Severity.CRITICAL, "m", 100.0, engine="e", evidence={"incident": "i"}),
              Event("engine_stall", Severity.CRITICAL, "again", 130.0, engine="e", evidence={"incident": "i"}),
              Event("engine_killed", Severity.CRITICAL, "k", 131.0, gpu="ffff:fe:1f.7", engine="e")]
    found = identities(events, "box", "i")
    assert [i["labels"] for i in found] == [
        {"alertname": "engine_stall", "severity": "critical", "host": "box", "engine": "e", "incident": "i"},
        {"alertname": "engine_killed", "severity": "critical", "host": "box", "gpu": "ffff:fe:1f.7", "engine": "e",
         "incident": "i"}]
    assert found[0]["starts"] == 100.0  # the first event of the identity
    firing = postable(Alert("t", "b", "x", "failure", False, identities=found), 200.0)
    assert all("endsAt" not in a for a in firing) and firing[0]["startsAt"] == "1970-01-01T00:01:40.000Z"
    assert firing[0]["annotations"] == {"summary": "t", "description": "x"}
    ended = postable(Alert("t", "b", "x", "success", True, identities=found), 200.0)
    assert [a["endsAt"] for a in ended] == ["1970-01-01T00:03:20.000Z"] * 2


def test_firing_alerts_are_sent_again_until_their_all_clear_or_their_incident_closes():
    """Alertmanager forgets an alert not sent again within its resolve_timeout: the alerts of an open incident
    are sent again every interval, as last posted; one outside an incident is not (it expires there)."""
    stall = Event("engine_stall", Severity.CRITICAL, "m", 100.0, engine="e", evidence={"incident": "i"})
    other = Event("engine_stall", Severity.CRITICAL, "m", 100.0, engine="f", evidence={"incident": "j"})
    hot = Event("thermal", Severity.WARNING, "hot", 100.0, gpu="ffff:fe:1f.7", evidence={"condition": "thermal:x"})
    firing, is_open = Firing(60.0), {"i": True, "j": True}
    for alert in [Alert("stalled", "b", "x", "failure", False, identities=identities([stall], "box", "i")),
                  Alert("f stalled", "b", "x", "failure", False, identities=identities([other], "box", "j")),
                  Alert("hot", "b", "x", "warning", False, identities=identities([hot], "box", None))]:
        firing.posted(alert, postable(alert, 100.0), 100.0)
    assert firing.due(159.0, is_open.get) == []  # not yet
    again = firing.due(160.0, is_open.get)
    assert [a["labels"]["engine"] for a in again] == ["e", "f"]
    assert all("endsAt" not in a for a in again) and again[0]["annotations"]["summary"] == "stalled"
    firing.sent(again, 160.0)
    back = Alert("back", "b", "x", "success", True, identities=identities([stall], "box", "i"))
    firing.posted(back, postable(back, 170.0), 170.0)  # the all-clear of incident i
    is_open["j"] = False  # incident j closed without one (its engine no longer watched)
    [ended] = firing.due(220.0, is_open.get)
    assert (ended["labels"]["engine"], ended["endsAt"]) == ("f", "1970-01-01T00:03:40.000Z")
    firing.sent([ended], 220.0)
    assert firing.items == {} and firing.next is None and firing.due(1e9, is_open.get) == []


def test_a_resolution_without_incident_names_the_event_whose_alert_it_ends():
    storm = StormControl(cooldown=600, group_window=0)
    hot = Event("gpu_hot", Severity.WARNING, "hot", 1.0, gpu="ffff:fe:1f.7")
    assert storm.offer(hot, 1, 1.0)
    storm.due(2.0)
    out = storm.resolve(hot.dedupe_key, "cooled down")
    assert out.about == hot and identities([out.about], "box", None)[0]["labels"]["alertname"] == "gpu_hot"


def test_basic_auth_header():
    web = WebConfig(users={"prom": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))})

    def header(text):
        return "Basic " + base64.b64encode(text.encode()).decode()
    assert web.allows(header("prom:pw")) and web.allows(header("prom:pw"))  # the second from the cache
    assert not web.allows(header("prom:pW")) and not web.allows(header("other:pw"))
    assert not web.allows(None) and not web.allows("Bearer x") and not web.allows("Basic !!")
    assert not web.allows(header("prom"))  # no colon: no password
    assert WebConfig().allows(None)  # no users: open
