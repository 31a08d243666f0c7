"""The `dcoco` command line: one subcommand per job, each a thin call into the library."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from dcoco.config import add_config_args, config_from_args
from dcoco.decode.methods import check_method, method_names
from dcoco.decode.session import DecodeConfig, make_engine, open_target
from dcoco.errors import DcocoError


@dataclass
class GenerateConfig(DecodeConfig):
    method: str = "plain"  # METHOD[:SELECTION][@CHECKPOINT], see dcoco.decode.methods
    json: bool = False  # print one JSON object instead of streaming text


def _add_generate(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate a reply to one prompt")
    parser.add_argument("prompt", help="the user message (the chat template is applied)")
    add_config_args(
        parser,
        GenerateConfig,
        {"method": f"METHOD[:SELECTION][@CHECKPOINT]; METHOD: {', '.join(method_names())}"},
    )
    parser.set_defaults(handler=_run_generate)


def _run_generate(args) -> int:
    config = config_from_args(GenerateConfig, args)
    check_method(config.method)
    target = open_target(config)
    engine = make_engine(target, config.method, config)
    prompt_ids = target.encode_chat(args.prompt, chat=config.chat)
    streamer = None if config.json else _Streamer(target)
    result = engine.generate(
        prompt_ids,
        config.max_new_tokens,
        config.sampling(),
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


def build_parser() -> argparse.ArgumentParser:
    from dcoco.data import datagen
    from dcoco.eval import bench, compare, coverage, heldout, report
    from dcoco.serving import bench_client, serve
    from dcoco.train import drafter_train, head_train

    parser = argparse.ArgumentParser(
        prog="dcoco", description="Speculative decoding with corrected parallel drafts."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate(subparsers)
    compare.add_parser(subparsers)
    bench.add_parser(subparsers)
    report.add_parser(subparsers)
    coverage.add_parser(subparsers)
    heldout.add_parser(subparsers)
    drafter_train.add_parser(subparsers)
    head_train.add_parser(subparsers)
    datagen.add_parser(subparsers)
    serve.add_parser(subparsers)
    bench_client.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) if hasattr(args, "handler") else args.run(args)
    except DcocoError as error:
        print(f"dcoco: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dcoco: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
