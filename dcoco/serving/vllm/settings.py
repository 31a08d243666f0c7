"""What `dcoco serve` tells the plugin in vLLM's processes: one settings object.

vLLM runs its engine core and workers as processes of their own, and the environment is what
reaches them all, so the settings travel as one JSON object in one variable, SETTINGS_ENV. The
server sets it when it starts vLLM; the live schedule (dcoco.serving.live_schedule) and the
schedule probe (dcoco.serving.vllm.schedule_probe) change it inside a process with `use`. The
readers call `current()` where they need a value (a dict lookup and a cached parse, next to a
step that costs milliseconds).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import cache

from dcoco.errors import DcocoError
from dcoco.serving.draft_schedule import OPEN_END, split

SETTINGS_ENV = "DCOCO_VLLM_SETTINGS"


@dataclass(frozen=True)
class PluginSettings:
    sampled_schedule: str = ""  # sampled requests' schedule (`1:2,2-:0`); empty: the greedy one
    head_max_batch: int = OPEN_END  # `@N`: the most running requests the draft head picks for
    sampled_head_max_batch: int = OPEN_END  # `/M` of `@N/M`: the same in all-sampled steps
    context_margin: int = 1  # K = 0 steps store the drafter's context up to drafting batch + this
    live_record: str = ""  # the `auto` schedule's probe record (dcoco.serving.live_schedule)
    # a server's draft head: on a CPU its fused walk's kernels build in a thread while its eager
    # call answers, and nothing is compiled (vLLM fails a step past 300 s, a first compile on 2
    # cores can take longer, and tracing beside model steps broke one:
    # dcoco.models.heads.head_compile); False where it is timed
    compile_head_in_background: bool = False

    def with_schedule(self, text: str) -> PluginSettings:
        """These settings with the sampled schedule and head ceilings of `GREEDY/SAMPLED@N/M`."""
        pair, ceiling, sampled_ceiling = split(text)
        _, _, sampled = pair.partition("/")
        return dataclasses.replace(
            self,
            sampled_schedule=sampled,
            head_max_batch=ceiling,
            sampled_head_max_batch=sampled_ceiling,
        )

    def environment(self) -> dict[str, str]:
        """The environment that carries these settings to vLLM's processes."""
        return {SETTINGS_ENV: json.dumps(dataclasses.asdict(self), sort_keys=True)}


def current() -> PluginSettings:
    """This process's settings (the defaults where `dcoco serve` set none)."""
    return _parse(os.environ.get(SETTINGS_ENV, ""))


def use(settings: PluginSettings) -> None:
    """Make `settings` this process's own (the processes it starts inherit them)."""
    os.environ.update(settings.environment())


@cache
def _parse(text: str) -> PluginSettings:
    if not text:
        return PluginSettings()
    try:
        return PluginSettings(**json.loads(text))
    except (ValueError, TypeError) as error:
        raise DcocoError(f"{SETTINGS_ENV} is not dcoco's plugin settings ({error})") from None
