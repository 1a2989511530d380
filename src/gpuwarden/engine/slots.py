"""llama.cpp's /slots as a per-step progress source, for a llama-server started without --metrics.

tools/server (b11434, server-context.cpp `to_json`): each slot reports `is_processing` and, for its current
or last task, `id_task`, `n_prompt_tokens_processed` and `next_token[0].n_decoded` (tokens generated so far,
counted on every step). The prompt count grows batch by batch during a prefill (measured on b11434: 512, 960,
1472 ... every 2 s of a 3000-token prompt at --batch-size 64), so a long prefill is progress. Builds that
report `n_past` instead (the slot's position: prompt and generated tokens) count through it. /slots is on by
default (`--no-slots` turns it off). It is answered by the inference loop's own queue, so it hangs when that
loop hangs: a timeout here is itself the evidence.
"""

from __future__ import annotations

import json

from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.scraper import HttpScraper, ScrapeError


class SlotsProgress:
    """Turns successive /slots readings into one counter of tokens processed that only grows."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, int]] = {}  # slot id -> (task id, tokens of that task so far)
        self.total = 0

    def sample(self, slots: list[dict]) -> EngineSample:
        running, seen = 0, {}
        for slot in slots:
            running += bool(slot.get("is_processing"))
            if "id_task" not in slot:
                continue
            decoded = sum(int(t.get("n_decoded", 0)) for t in slot.get("next_token") or [])
            prompt = slot.get("n_prompt_tokens_processed", slot.get("n_past"))
            tokens = int(prompt or 0) + decoded
            task, before = self._seen.get(slot["id"], (None, 0))
            self.total += tokens - before if task == slot["id_task"] and tokens >= before else tokens
            seen[slot["id"]] = (slot["id_task"], tokens)
        self._seen = seen  # the slots it answers now (llama.cpp's are fixed): ids never seen again are forgotten
        return EngineSample(profile="llamacpp slots", running=float(running), waiting=None, generated=None,
                            progress=float(self.total), per_step=True, timing=None)


class SlotsScraper(HttpScraper):
    """llama.cpp's /slots, where its /metrics is off: progress from the slots' decoded tokens."""

    what = "/slots: "

    def __init__(self, base_url: str, timeout: float = 5.0, max_bytes: int = 8 << 20) -> None:
        # 8 MiB of JSON held the loop 0.3 s here, and its slots as long again: parsed off the loop, as /metrics
        super().__init__(base_url.rstrip("/") + "/slots", timeout, max_bytes)
        self.progress = SlotsProgress()

    def _sample(self, body: bytes) -> EngineSample:
        try:
            return self.progress.sample(json.loads(body))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as exc:
            raise ScrapeError("unparsable", f"/slots: {type(exc).__name__}: {str(exc)[:200]}") from None
