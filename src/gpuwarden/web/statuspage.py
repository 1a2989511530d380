"""The status page, pure: a snapshot (snapshot.gather's dict) in, one HTML document out.

Everything that comes from outside (an engine's name, a kernel message, a GPU's model) is escaped. The page holds
its own small style sheet, no script and no asset from elsewhere (it is served from a box that may have no way
out); it reloads itself every REFRESH seconds and reads on a phone (cards that wrap, no wide tables).
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any

REFRESH = 5  # seconds between reloads of the page

_STYLE = """
:root{color-scheme:light dark;--ok:#1a7f37;--warn:#b35900;--bad:#c62828;--dim:#777;--line:#8884}
body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:70em;padding:.8em}
h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.1em;margin:1.2em 0 .4em;border-bottom:1px solid var(--line)}
.sub{color:var(--dim);font-size:.9em}.grid{display:flex;flex-wrap:wrap;gap:.6em}
.card{border:1px solid var(--line);border-radius:.4em;padding:.5em .7em;flex:1 1 18em;min-width:0}
.card h3{font-size:1em;margin:0 0 .3em;overflow-wrap:anywhere}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em .8em;margin:0}dt{color:var(--dim)}
dd{margin:0;overflow-wrap:anywhere}.pill{border-radius:1em;padding:0 .5em;color:#fff;font-size:.85em;white-space:nowrap}
.ok{background:var(--ok)}.warn{background:var(--warn)}.bad{background:var(--bad)}.none{background:var(--dim)}
.critical{border-left:.3em solid var(--bad)}img{max-width:100%;display:block;margin-top:.4em}
ul,ol{margin:.2em 0;padding-left:1.2em}.empty{color:var(--dim)}.wide{flex-basis:100%}
"""

_SEVERITY_TONE = {"critical": "bad", "warning": "warn", "info": "none"}
_ENGINE_TONE = {"running": "ok", "idle": "ok", "starting": "none", "unknown": "none", "stalled": "bad",
                "unresponsive": "bad", "restart failed": "bad", "down": "bad", "not answering": "warn"}


def render(snap: dict[str, Any]) -> str:
    now = snap["time"]
    paged = snap.get("paged", {})
    # green once an incident's all-clear went out: the incident itself closes a minute or two later
    incidents = [i for i in snap["incidents"] if not (paged.get(i["id"]) or {}).get("all_clear")]
    past = [(k, v) for k, v in reversed(paged.items()) if v.get("all_clear") or k not in
            {i["id"] for i in incidents}]
    title = f"gpuwarden on {snap['host']}"
    headline = (f"{len(incidents)} open incident{'s' if len(incidents) != 1 else ''}" if incidents
                else "no open incident")
    return "".join((
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"refresh\" content=\"{REFRESH}\">",
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">",
        f"<title>{escape(title)} — {escape(headline)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)} {_pill(headline, 'bad' if incidents else 'ok')}</h1>",
        f"<div class=\"sub\">gpuwarden {escape(snap['version'])}, pid {snap['pid']}, "
        f"up {duration(now - snap['started'])}"
        f"; as of {escape(_clock(now))}, reloads every {REFRESH} s. "
        "<a href=\"/metrics\">metrics</a> · <a href=\"/status.json\">json</a></div>",
        f"<p>{escape(snap['summary'])}</p>",
        _section("Open incidents", [_incident(i, paged.get(i["id"]), now) for i in incidents], "no open incident"),
        _section("Engines", [_engine(e, now) for e in snap["engines"]], "no engine watched"),
        _section("GPUs", [_gpu(g, now) for g in snap["gpus"]], "no GPU found"),
        _section("Recent incidents", [_past(k, v, now) for k, v in past], "none since gpuwarden started"),
        _section("Alert targets", [_target(t, now) for t in snap.get("targets", [])], "no alert target configured"),
        _section("Recent events", [_events(snap.get("recent_events", []), now)] if snap.get("recent_events") else [],
                 "none since gpuwarden started"),
        _section("Sources and components", [_sources(snap, now)], ""),
        "</body></html>\n",
    ))


def unavailable(why: str) -> str:
    """The page when the daemon could not give a snapshot (its event loop did not answer in time)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"refresh\" content=\"{REFRESH}\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>gpuwarden — no answer</title><style>{_STYLE}</style></head><body>"
            f"<h1>gpuwarden {_pill('no answer', 'bad')}</h1><p>{escape(why)}</p></body></html>\n")


def _section(title: str, cards: list[str], empty: str) -> str:
    body = f"<div class=\"grid\">{''.join(cards)}</div>" if cards else f"<p class=\"empty\">{escape(empty)}</p>"
    return f"<h2>{escape(title)}</h2>{body}"


def _card(title: str, pill: str, rows: list[tuple[str, str]], extra: str = "", cls: str = "card") -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in rows)
    return f"<div class=\"{cls}\"><h3>{escape(title)} {pill}</h3><dl>{items}</dl>{extra}</div>"


def _incident(i: dict[str, Any], page: dict[str, Any] | None, now: float) -> str:
    rows = [("opened", escape(ago(i["opened"], now))), ("what", escape(i["message"] or i["kind"]))]
    if page:
        rows.append(("paged", escape(f"{page['title']} ({ago(page['last_paged'], now)})")))
    if i["engines"] or i["gpus"]:
        rows.append(("about", escape(", ".join([*i["engines"], *i["gpus"]]))))
    if i["conditions"]:
        rows.append(("open conditions", escape(", ".join(i["conditions"]))))
    decisions = [_decision(d) for d in i["decisions"]]
    extra = (f"<div>decided:<ul>{''.join(decisions)}</ul></div>" if decisions
             else "<div class=\"empty\">no decision recorded</div>")
    if i["done"]:
        extra += f"<div>done:<ul>{''.join(f'<li>{escape(d)}</li>' for d in i['done'])}</ul></div>"
    if page and page.get("steps"):
        extra += f"<div>what to do:<ol>{''.join(f'<li>{escape(step)}</li>' for step in page['steps'])}</ol></div>"
    if i.get("picture"):  # a path of this server; drawn a few seconds after the incident opened
        extra += (f"<a href=\"{escape(i['picture'])}\"><img src=\"{escape(i['picture'])}\" loading=\"lazy\" "
                  "alt=\"the timeline picture (drawn a few seconds after the incident opens)\"></a>")
    return _card(i["id"], _pill(i["kind"], "bad"), rows, extra, "card critical wide")  # its picture readable


def _past(incident: str, page: dict[str, Any], now: float) -> str:
    ended = page.get("all_clear")
    rows = [("paged", escape(page["title"])), ("first paged", escape(ago(page["first_paged"], now))),
            ("all-clear", escape(ago(ended, now) if ended else "none sent: it closed without one"))]
    return _card(incident, _pill("all-clear sent" if ended else "closed", "ok" if ended else "none"), rows)


def _target(t: dict[str, Any], now: float) -> str:
    rows = [("last delivered", escape(f"{t['last_title']} ({ago(t['last_sent'], now)})" if t["last_sent"]
                                      else "nothing yet"))]
    if t["failures"]:
        rows.append(("failures", escape(f"{t['failures']} ({t['undeliverable']} given up); the last "
                                        f"{ago(t['last_failure'], now)}: {t['last_error']}")))
    rows.append(("waiting", escape(f"{t['pending']} alert{'s' if t['pending'] != 1 else ''}")))
    failing = t["last_failure"] is not None and (t["last_sent"] is None or t["last_failure"] > t["last_sent"])
    tone, word = ("bad", "failing") if failing else ("warn", "sending") if t["pending"] else ("ok", "ok")
    return _card(t["name"], _pill(word, tone), rows)


def _events(events: list[dict[str, Any]], now: float) -> str:
    items = "".join(
        f"<li>{escape(_clock(e['time']))} {_pill(e['severity'], _SEVERITY_TONE.get(e['severity'], 'none'))} "
        f"<b>{escape(e['kind'])}</b> {escape(e['message'])}{_history(e)}</li>" for e in events)
    return f"<div class=\"card wide\"><ul>{items}</ul></div>"


def _history(e: dict[str, Any]) -> str:
    """An event read at start from an older line says so, and when the line was logged where the log said."""
    if not e.get("history"):
        return ""
    logged = f"logged {_clock(e['logged_at'])}" if e.get("logged_at") else "logged before gpuwarden started"
    return f" <i>(history: {escape(logged)})</i>"


def _decision(d: dict[str, Any]) -> str:
    flags = [w for w, on in (("dry run", d.get("dry_run")), ("by hand", d.get("by_hand"))) if on]
    target = f" {d['engine']}" if d.get("engine") else ""
    flagged = f" ({', '.join(flags)})" if flags else ""
    return (f"<li><b>{escape(str(d.get('action')) + target)}</b>{escape(flagged)}"
            f": {escape(str(d.get('reason', '')))}</li>")


def _engine(e: dict[str, Any], now: float) -> str:
    tone = _ENGINE_TONE.get(e["state"], "none")
    rows = [("requests", escape(f"{_num(e['running'])} running, {_num(e['waiting'])} waiting")),
            ("last progress", escape(_progress(e, now))),
            ("stall after", escape(duration(e["stall_threshold_seconds"]))),
            ("last answer", escape(ago(e["last_answer"], now))),
            ("tokens", escape(_num(e["generated_tokens"]))),
            ("busiest CPU", escape(_ratio(e["cpu_ratio"]) + " of a core" if e["cpu_ratio"] is not None else "-")),
            ("processes", escape(f"{e['processes']}; GPUs {', '.join(e['gpus']) or 'unknown'}")),
            ("metrics", escape(e["url"]))]
    return _card(e["name"], _pill(e["state"], tone), rows)


def _progress(e: dict[str, Any], now: float) -> str:
    """When it last made progress; for an engine that is down or does not answer, that first."""
    if e["state"] == "idle":
        return "idle"
    last = f"the last {ago(e['last_progress'], now)}" if e["last_progress"] is not None else "none seen"
    if e["state"] in ("down", "restart failed", "not answering"):
        return f"none: it is {e['state']} ({last})"
    return last if e["last_progress"] is not None else "none seen yet"


def _gpu(g: dict[str, Any], now: float) -> str:
    s, lim = g["sensors"], g["limits"]
    rows = [("model", escape(f"{g['model'] or '-'} ({g['vendor']}, {g['driver'] or 'no driver'})"))]
    if "power_watts" in s:
        cap = f" of {lim['power_cap_watts']:.0f} W cap" if "power_cap_watts" in lim else ""
        rows.append(("power", escape(f"{s['power_watts']:.0f} W{cap}")))
    for key, value in s.items():
        if key.startswith("temperature_"):
            sensor = key.split("_")[1]
            warn = lim.get(f"temperature_{sensor}_warn_celsius")
            crit = lim.get(f"temperature_{sensor}_critical_celsius")
            limit = f" (warn {warn:.0f}, critical {crit:.0f})" if warn is not None and crit is not None else ""
            rows.append((f"{sensor} °C", escape(f"{value:.0f}{limit}")))
    if "fan" in s or "fan_rpm" in s:
        rows.append(("fan", escape(s.get("fan") or f"{s['fan_rpm']:.0f} rpm")))
    if "sclk_hz" in s:
        top = f" of {lim['sclk_max_hz'] / 1e6:.0f}" if "sclk_max_hz" in lim else ""
        rows.append(("shader clock", escape(f"{s['sclk_hz'] / 1e6:.0f}{top} MHz")))
    if "busy_ratio" in s:
        rows.append(("busy", escape(_ratio(s["busy_ratio"]))))
    if "vram_used_bytes" in s:
        total = f" of {lim['vram_total_bytes'] / 2**30:.1f}" if "vram_total_bytes" in lim else ""
        rows.append(("VRAM", escape(f"{s['vram_used_bytes'] / 2**30:.1f}{total} GiB")))
    if "pcie_speed_gts" in s:
        top = (f" (max {lim['pcie_max_speed_gts']:g} GT/s x{lim.get('pcie_max_width', '?')})"
               if "pcie_max_speed_gts" in lim else "")
        rows.append(("PCIe", escape(f"{s['pcie_speed_gts']:g} GT/s x{s.get('pcie_width', '?')}{top}")))
    if g["throttle"]:
        rows.append(("throttled", escape(", ".join(g["throttle"]))))
    if g["problems"]:
        rows.append(("unreadable", escape(", ".join(f"{k}: {v}" for k, v in g["problems"].items()))))
    rows.append(("read", escape(ago(g["read_at"], now))))
    name = f"GPU {g['index']} ({g['gpu']})" if g.get("index") is not None else g["gpu"]  # as the pages name it
    return _card(name, _pill(g["state"], "ok" if g["state"] == "ok" else "bad"), rows)


def _sources(snap: dict[str, Any], now: float) -> str:
    sources = []
    for s in snap["sources"]:
        last = f"; last read {ago(s['last_success'], now)}" if s["last_success"] else ""
        sources.append(f"<li>{escape(s['name'])} {_pill(_word(s['up'], 'up', 'down'), _tone(s['up']))} "
                       f"{escape(s['detail'] + last)}</li>")
    error = snap["store_error"]
    sources.append(f"<li>store {_pill('unwritable', 'bad')} {escape(error)}</li>" if error
                   else f"<li>store {_pill('writable', 'ok')}</li>")
    components = []
    for c in snap["components"]:
        restarts = f" ({c['restarts']} restarts)" if c["restarts"] else ""
        components.append(f"<li>{escape(c['name'])} {_pill(_word(c['up'], 'up', 'down'), _tone(c['up']))}"
                          f"{escape(restarts)}</li>")
    components.append(f"<li>event loop lag {snap['loop_lag_seconds']:.3f} s</li>")
    return (f"<div class=\"card\"><h3>sources</h3><ul>{''.join(sources)}</ul></div>"
            f"<div class=\"card\"><h3>components</h3><ul>{''.join(components)}</ul></div>")


def _pill(text: str, tone: str) -> str:
    return f"<span class=\"pill {tone}\">{escape(text)}</span>"


def _word(up: bool | None, yes: str, no: str) -> str:
    return "unknown" if up is None else yes if up else no


def _tone(up: bool | None) -> str:
    return "none" if up is None else "ok" if up else "bad"


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def ago(then: float | None, now: float) -> str:
    return "never" if then is None else f"{duration(now - then)} ago ({_clock(then)})"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
