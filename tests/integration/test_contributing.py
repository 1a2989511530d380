"""README's contributing section, done as it says: a new alert channel is a class implementing
alert/channel.Channel and one registration line (alert/targets.register), and the real daemon, in this process,
delivers to it from a config URL of its scheme, as it does to apprise's. (An engine kind's fake, toyllm, is
tests/integration/test_engine_kinds.py's.)"""

import asyncio

from helpers import TEST_GPU, driver_record
from inprocess import daemon_in, running

from gpuwarden.alert import targets
from gpuwarden.alert.channel import Alert

GOT: list[Alert] = []


class Pager:
    """A channel of this test's own: it keeps what it is handed."""

    takes_pictures = False

    def __init__(self, url: str, name: str, resend: float) -> None:
        self.url, self.name = url, name

    async def notify(self, alert: Alert, timeout: float) -> tuple[bool, str | None]:
        GOT.append(alert)
        return False, None

    async def refresh(self, timeout, still_open) -> tuple[bool, str | None]:
        return False, None

    def resume(self, alert: Alert) -> None:
        pass

    def carry(self, earlier) -> None:
        pass


def test_a_channel_registered_in_one_line_gets_the_daemons_alerts(tmp_path):
    targets.register(["testpager"], Pager)  # the one line
    kernel = tmp_path / "kern.log"
    kernel.touch()
    daemon = daemon_in(tmp_path, f'[kernel]\nsource = "file"\nfile = "{kernel}"\n'
                                 f'[alerts]\nhostname = "box1"\ngroup_window = "200ms"\nurls = ["testpager://ops"]\n')

    async def scenario():
        async with running(daemon):
            await asyncio.sleep(0.5)
            with kernel.open("a") as log:
                log.write(driver_record(f"NVRM: Xid (PCI:{TEST_GPU[:-2]}): 79, pid=1234, name=python3, "
                                        "GPU has fallen off the bus.", device=None))
            for _ in range(100):
                if GOT:
                    break
                await asyncio.sleep(0.1)
    try:
        asyncio.run(scenario())
    finally:
        targets.unregister(["testpager"])
    [alert] = GOT
    print(alert.title)
    assert alert.title.startswith("box1: ") and "fallen off the bus" in alert.body, (alert.title, alert.body)
