"""`dcoco generate`: one reply to one prompt, streamed as it is decoded (or one JSON object)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from dcoco.config import Command
from dcoco.decode.methods import check_method, method_names
from dcoco.decode.session import DecodeConfig, make_engine, open_target


@dataclass
class GenerateConfig(DecodeConfig):
    prompt: str = ""  # the user message (the chat template is applied)
    method: str = "plain"  # METHOD[:SELECTION][@CHECKPOINT], see dcoco.decode.methods
    temperature: float = 0.0  # 0 = greedy
    json: bool = False  # print one JSON object instead of streaming text


def run(config: GenerateConfig) -> int:
    check_method(config.method)
    sampling = config.sampling(config.temperature)
    target = open_target(config, [config.method])
    engine = make_engine(target, config.method, config)
    prompt_ids = target.encode_chat(config.prompt, chat=config.chat)
    streamer = None if config.json else _Streamer(target)
    result = engine.generate(
        prompt_ids,
        config.max_new_tokens,
        sampling,
        config.seed,
        on_tokens=streamer.push if streamer else None,
    )
    stats = result.stats
    if config.json:
        record = {
            "method": engine.method,
            "text": target.decode(result.new_ids),
            "finish_reason": result.finish_reason,
            **stats.summary(),
        }
        print(json.dumps(record))
        return 0
    print()
    hist = " ".join(f"{length}:{count}" for length, count in stats.accept_hist().items())
    print(
        f"[{engine.method}] {stats.new_tokens} tokens in {stats.total_s:.2f}s = "
        f"{stats.tokens_per_s:.1f} tok/s | tau {stats.tau:.2f} over {stats.cycles} cycles | "
        f"accept hist {hist}",
        file=sys.stderr,
    )
    return 0


class _Streamer:
    """Prints text as tokens arrive, decoding the whole reply so multi-token characters render."""

    def __init__(self, target):
        self.target = target
        self.ids: list[int] = []
        self.printed = 0

    def push(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        text = self.target.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its next byte
            return
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)


COMMAND = Command(
    "generate",
    "generate a reply to one prompt",
    GenerateConfig,
    run,
    positional=("prompt",),
    helps={"method": f"METHOD[:SELECTION][@CHECKPOINT]; METHOD: {', '.join(method_names())}"},
)
