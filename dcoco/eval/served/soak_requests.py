"""The requests of `dcoco soak`: chat and completions, streamed or not, dropped mid-stream on
purpose, and fuzzed bodies that a server must answer with a 4xx.

Standard library only (http.client, so a stream can be dropped by closing the socket). Every
call returns an `Outcome`, never raises on what the server does.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class Outcome:
    kind: str  # what was sent: chat / completions (+ "-stream"), or "fuzz:<name>"
    status: int  # HTTP status; 0 = no response (connection error), -1 = timed out
    text: str = ""  # the reply text (streams: the chunks joined)
    finished: bool = False  # a finish_reason arrived (streams: and then [DONE])
    dropped: bool = False  # we closed the stream on purpose
    error_message: str = ""  # a 4xx/5xx body's message
    latency_s: float = 0.0


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


def send(url: str, path: str, body: bytes, timeout: float, kind: str, drop_after: int = 0):
    """POST `body`; read the reply whole, or for a stream (`kind` ends in -stream) chunk by
    chunk, closing the socket after `drop_after` chunks if it is > 0."""
    started = time.perf_counter()
    connection = _connection(url, timeout)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        sock = connection.sock  # http.client lets go of it once a response is read
        response = connection.getresponse()
        if response.status != 200 or not kind.endswith("-stream"):
            raw = response.read().decode("utf-8", "replace")
            return _whole(kind, response.status, raw, time.perf_counter() - started)
        return _stream(kind, response, sock, drop_after, started)
    except TimeoutError:
        return Outcome(kind, -1, latency_s=time.perf_counter() - started)
    except (OSError, http.client.HTTPException) as error:
        return Outcome(kind, 0, error_message=str(error), latency_s=time.perf_counter() - started)
    finally:
        connection.close()


def _whole(kind: str, status: int, raw: str, latency: float) -> Outcome:
    try:
        reply = json.loads(raw)
    except ValueError:
        return Outcome(kind, status, error_message=raw[:200], latency_s=latency)
    if status != 200:
        error = reply.get("error", reply) if isinstance(reply, dict) else reply
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        return Outcome(kind, status, error_message=str(message), latency_s=latency)
    choice = (reply.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
    return Outcome(kind, status, text, bool(choice.get("finish_reason")), latency_s=latency)


def _stream(kind, response, sock, drop_after: int, started: float) -> Outcome:
    pieces, finished, chunks = [], False, 0
    for line in response:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return Outcome(
                kind, 200, "".join(pieces), finished, latency_s=time.perf_counter() - started
            )
        choice = (json.loads(data).get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        pieces.append(delta.get("content") or choice.get("text") or "")
        finished = finished or bool(choice.get("finish_reason"))
        chunks += 1
        if drop_after and chunks >= drop_after:
            sock.shutdown(socket.SHUT_RDWR)  # the client walks away mid-stream
            return Outcome(
                kind, 200, "".join(pieces), False, True, latency_s=time.perf_counter() - started
            )
    # the server closed the stream without [DONE]: a truncated reply
    return Outcome(kind, 200, "".join(pieces), False, latency_s=time.perf_counter() - started)


def request_body(model: str, prompt: str, chat: bool, stream: bool, temperature: float,
                 max_tokens: int) -> bytes:  # fmt: skip
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
            "stream": stream}  # fmt: skip
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return json.dumps(body).encode("utf-8")


def fuzzed_bodies(model: str, max_context: int) -> dict[str, tuple[str, bytes]]:
    """name -> (path, body): bodies a correct server rejects with a 4xx."""
    chat, comp = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "Hello"}]

    def j(value) -> bytes:
        # short replies where a server accepts the body anyway (else one reply of the whole
        # context would read as a hang)
        return json.dumps({"max_tokens": 16, **value}).encode("utf-8")

    return {
        "not-json": (chat, b'{"model": "x", "messages": [}'),
        "invalid-utf8": (
            chat,
            b'{"model": "' + model.encode() + b'", "messages": [{"role": '
            b'"user", "content": "\xff\xfe\xfa"}]}',
        ),  # fmt: skip
        "messages-not-list": (chat, j({"model": model, "messages": "Hello"})),
        "content-number": (chat, j({"model": model, "messages": [{"role": "user", "content": 7}]})),
        "content-missing": (chat, j({"model": model, "messages": [{"role": "user"}]})),
        "logprobs-string": (chat, j({"model": model, "messages": user, "logprobs": "yes"})),
        "unknown-field": (chat, j({"model": model, "messages": user, "temprature": 0.5})),
        "empty-prompt": (comp, j({"model": model, "prompt": ""})),
        "stream-string": (chat, j({"model": model, "messages": user, "stream": "yes"})),
        "unknown-role": (
            chat,
            j({"model": model, "messages": [{"role": "wizard", "content": "hi"}]}),
        ),
        "empty-messages": (chat, j({"model": model, "messages": []})),
        "max-tokens-string": (chat, j({"model": model, "messages": user, "max_tokens": "ten"})),
        "max-tokens-negative": (chat, j({"model": model, "messages": user, "max_tokens": -5})),
        "temperature-negative": (chat, j({"model": model, "messages": user, "temperature": -1})),
        "top-p-zero": (chat, j({"model": model, "messages": user, "top_p": 0})),
        "top-p-above-one": (comp, j({"model": model, "prompt": "Hi", "top_p": 1.5})),
        "unknown-model": (chat, j({"model": "no-such-model", "messages": user})),
        "prompt-missing": (comp, j({"model": model})),
        "over-long-context": (comp, j({"model": model, "prompt": "hello " * (2 * max_context)})),
        "huge-max-tokens": (comp, j({"model": model, "prompt": "Hi", "max_tokens": 10**9})),
    }


def pick_fuzz(bodies: dict, rng: random.Random) -> tuple[str, str, bytes]:
    name = rng.choice(sorted(bodies))
    return (name, *bodies[name])
