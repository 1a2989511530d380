"""Issue 38, "secrets never leave": `kill_refused` reasons carried the first 120 characters of the refused
processes' command lines (`--api-key` values included) into events, pages and /status.json; a basic-auth
password over 72 bytes made bcrypt raise (the exporter answered 500)."""

import base64
import json
import subprocess
import sys
import time

import pytest
from helpers import GPUWARDEN, Receiver, wait_for

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"
SECRETS = ("sk-root-0123456789", "hf_rootsecret", "hunter2", "tok-rootsecret")


def test_a_refused_kill_names_the_processes_without_their_secrets(lone_attacker, daemon_factory, root_process,
                                                                  tmp_path):
    """A root pidfile that names a root process (with secrets on its command line) for the user's engine, which
    stalls: the refusal describes that process in events, the page and the status, its secrets masked."""
    victim = root_process(sys.executable, "-c", "import time; time.sleep(600)", "--api-key", SECRETS[0],
                          "HF_TOKEN=" + SECRETS[1], "--db", f"postgres://app:{SECRETS[2]}@db/x",
                          f"--auth-token={SECRETS[3]}")
    engine = lone_attacker.start_engine()
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text(f"{victim.pid}\n")
    receiver = Receiver().start()
    try:
        d = daemon_factory(f'[alerts]\nurls = ["json://127.0.0.1:{receiver.port}/"]\n'
                           f'[[engine]]\nname = "victim"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
                           f'min_stall = "2s"\nkill_grace = "1s"\n[engine.target]\nkind = "pidfile"\n'
                           f'pidfile = "{pidfile}"\n')
        d.start()
        d.wait_serving()
        time.sleep(1.5)
        engine.set_mode("stall")
        refused = wait_for(lambda: [e for e in d.events() if e["kind"] == "kill_refused"], 30,
                           what="kill_refused")[0]
        # the process is still named, and what is not a secret still shows
        assert f"{victim.pid} root " in json.dumps(refused) and "--api-key ***" in json.dumps(refused), refused
        wait_for(lambda: any("victim" in r["body"] for r in receiver.received), 30, what="the page")
        status = subprocess.run([*GPUWARDEN, "--config", str(d.config_path), "status", "--json"],
                                capture_output=True, text=True, timeout=60).stdout
        page = "".join(r["body"] for r in receiver.received)
        status_json = subprocess.run(["curl", "-s", f"http://127.0.0.1:{d.port}/status.json"], capture_output=True,
                                     text=True, timeout=30).stdout
        stored = json.dumps(d.events())
        for secret in SECRETS:
            for where, text in (("events", stored), ("page", page), ("status", status), ("status.json", status_json),
                                ("log", d.log())):
                assert secret not in text, (secret, where)
        assert victim.poll() is None
        assert d.stop() == 0
    finally:
        receiver.stop()


def _ask(user, port: int, path: str, password: str | None) -> str:
    """The HTTP status a request of `user` gets (urllib raises on 4xx/5xx: its code is the answer)."""
    auth = "" if password is None else base64.b64encode(f"prometheus:{password}".encode()).decode()
    code = ("import sys, urllib.request, urllib.error\n"
            f"r = urllib.request.Request('http://127.0.0.1:{port}{path}')\n"
            f"if {bool(auth)}: r.add_header('Authorization', 'Basic {auth}')\n"
            "try:\n    print(urllib.request.urlopen(r, timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    return subprocess.run([SYSTEM_PYTHON, "-c", code], user=user.uid, group=user.gid, extra_groups=[],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_a_password_past_72_bytes_is_401_and_status_json_asks_for_the_password(lone_attacker, daemon_factory,
                                                                               tmp_path):
    import bcrypt

    good = "p" * 72  # all bcrypt reads; htpasswd hashes a longer one's first 72 bytes the same
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {bcrypt.hashpw(good.encode(), bcrypt.gensalt(4)).decode()}\n")
    d = daemon_factory()
    text = d.config_path.read_text().replace("[exporter]\n", f'[exporter]\nweb_config_file = "{web}"\n')
    d.config_path.write_text(text)
    d.start()
    d.wait_log("gpuwarden running", 30)
    assert _ask(lone_attacker, d.port, "/metrics", good + "x" * 28) == "401"  # was 500 (bcrypt raised)
    assert _ask(lone_attacker, d.port, "/metrics", good) == "200"
    assert _ask(lone_attacker, d.port, "/status.json", None) == "401"
    assert _ask(lone_attacker, d.port, "/status.json", good) == "200"
    assert d.stop() == 0
