"""The request guard `dcoco serve` puts in front of vLLM: every fuzzed body of `dcoco soak` that
needs no model to judge is answered 400 with one line; well-formed bodies, vLLM's extensions
included, pass byte for byte; other paths and methods are not touched."""

from __future__ import annotations

import asyncio
import json

import pytest

from dcoco.eval.served.soak_requests import fuzzed_bodies, request_body
from dcoco.serving.request_guard import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    RequestGuard,
    check_body,
)

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "stream", "n", "seed", "stop"}
FIELDS = {
    CHAT_PATH: frozenset(COMMON | {"messages", "max_completion_tokens", "logprobs"}),
    COMPLETIONS_PATH: frozenset(COMMON | {"prompt", "echo", "logprobs"}),
}
# judged by vLLM itself, which knows the served name, the tokenizer and the context length
NEEDS_THE_MODEL = {"unknown-model", "over-long-context", "huge-max-tokens"}


@pytest.mark.parametrize("name", sorted(set(fuzzed_bodies("m", 64)) - NEEDS_THE_MODEL))
def test_every_fuzzed_body_is_rejected_with_one_line(name):
    path, body = fuzzed_bodies("m", 64)[name]
    problem = check_body(path, body, FIELDS[path])
    assert problem is not None, name
    assert problem.message and "\n" not in problem.message


GOOD = [
    (CHAT_PATH, request_body("m", "Hi", True, True, 0.0, 16)),
    (CHAT_PATH, request_body("m", "Hi", True, False, 1.0, 16)),
    (COMPLETIONS_PATH, request_body("m", "Hi", False, True, 0.0, 16)),
    (COMPLETIONS_PATH, json.dumps({"prompt": [[1, 2, 3]], "logprobs": 2, "echo": True}).encode()),
    (COMPLETIONS_PATH, json.dumps({"prompt": ["a", "b"], "top_k": 5, "n": 2}).encode()),
    (CHAT_PATH, json.dumps({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": None},
    ], "top_p": 1, "temperature": 2, "max_completion_tokens": 3, "stop": ["\n"],
        "logprobs": True}).encode()),
]  # fmt: skip


@pytest.mark.parametrize("path,body", GOOD)
def test_well_formed_bodies_pass(path, body):
    assert check_body(path, body, FIELDS[path]) is None


@pytest.mark.parametrize(
    "field,value,ok",
    [("temperature", 0, True), ("temperature", 2.01, False), ("temperature", float("nan"), False),
     ("top_p", 1e-9, True), ("top_p", 0, False), ("max_tokens", 1, True), ("max_tokens", 0, False),
     ("max_tokens", True, False), ("n", 2.0, False), ("stream", 1, False)],
)  # fmt: skip
def test_range_edges(field, value, ok):
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], field: value}).encode()
    assert (check_body(CHAT_PATH, body, FIELDS[CHAT_PATH]) is None) is ok


def _call(path, body: bytes, method="POST"):
    """Run the ASGI guard once; -> (what the app received or None, the response messages)."""
    seen, sent = {}, []
    pieces = [body[:5], body[5:]]  # a body in two chunks, as a server may deliver it

    async def app(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        chunk = pieces.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pieces)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path}
    asyncio.run(RequestGuard(app, FIELDS)(scope, receive, send))
    return seen.get("body"), sent


def test_the_middleware_answers_400_and_keeps_the_app_out():
    path, body = fuzzed_bodies("m", 64)["unknown-role"]
    seen, sent = _call(path, body)
    assert seen is None
    assert sent[0]["status"] == 400
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == 400 and "role" in error["message"]


def test_the_middleware_passes_a_good_body_byte_for_byte():
    body = request_body("m", "Hello there", True, False, 0.0, 16)
    seen, sent = _call(CHAT_PATH, body)
    assert seen == body and sent[0]["status"] == 200


def test_other_paths_and_methods_are_not_read():
    seen, _ = _call("/v1/embeddings", b'{"bad": ')
    assert seen == b'{"bad'  # the app read the first chunk itself: the guard did not buffer
    seen, _ = _call(CHAT_PATH, b"xxxxxyyy", method="GET")
    assert seen == b"xxxxx"
