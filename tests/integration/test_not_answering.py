"""A configured engine that nothing serves (not started, a mistyped port) is a page, once, after its bound; when
an engine answers there at last, its down condition ends and the page hears it. The real daemon, a real alert
delivery to a loopback receiver, a real engine process started late on the configured port."""

from helpers import free_port, wait_for


def test_an_engine_that_never_answers_is_paged_once_and_its_answer_ends_it(daemon_factory, fake_engine, receiver):
    port = free_port()
    d = daemon_factory(
        f'[alerts]\nhostname = "box1"\ngroup_window = "300ms"\nurls = ["json://127.0.0.1:{receiver.port}/pager"]\n'
        f'[[engine]]\nname = "llama-8b"\nmetrics_url = "http://127.0.0.1:{port}/metrics"\n'
        'scrape_interval = "0.5s"\nrestart_timeout = "3s"\n').start()
    d.wait_serving()
    page = wait_for(lambda: next((b for b in receiver.json_bodies("/pager") if "not answering" in b["title"]), None),
                    20, 0.2, "the page")
    assert page["type"] == "failure" and page["title"].startswith("box1: engine llama-8b not answering for ")
    assert f"has not answered at http://127.0.0.1:{port}/metrics from " in page["message"]
    assert "since gpuwarden began to watch it" in page["message"] and "ss -ltnp" in page["message"]
    fake_engine("progress", port=port)  # it answers at last
    ended = wait_for(lambda: next((b for b in receiver.json_bodies("/pager") if b["type"] == "success"), None),
                     20, 0.2, "the all-clear")
    assert "llama-8b answers /metrics" in ended["message"]
    events = [e["kind"] for e in d.events()]
    assert events.count("engine_not_answering") == 1, events
    assert d.stop() == 0
