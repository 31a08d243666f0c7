"""A request guard in front of vLLM's OpenAI server: malformed chat and completions bodies get a
400 with one clear line before vLLM parses them.

Why: vLLM 0.32 accepts some bodies OpenAI's API rejects (a message role `wizard`, unknown fields,
`top_p` 0) and answers others with multi-line pydantic dumps. `dcoco serve` installs the guard
through vLLM's `--middleware` (`RequestGuard`, a plain ASGI class, so this module imports nothing
of vLLM or starlette at import time). `check_body` is a pure function: it takes the raw bytes and
the request model's field names and returns the error, or None for a body to pass on unchanged.

Rules, each as OpenAI's API documents them: a JSON object in UTF-8; no field the endpoint does not
know (the set is vLLM's own request model, so vLLM's extensions pass); chat `messages` a non-empty
list of objects with a known role and string or list content (null, or none, only for an
assistant's); completions `prompt` a non-empty string or a non-empty list of strings or token ids;
the sampling parameters in range; `logprobs` true or false in chat, a count >= 0 in completions.
What needs the tokenizer (the context length) is left to vLLM, which answers it with a 400.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# field -> (lowest, highest, lowest is excluded): OpenAI's documented ranges
NUMBER_RANGES = {
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, True),
    "frequency_penalty": (-2.0, 2.0, False),
    "presence_penalty": (-2.0, 2.0, False),
}
POSITIVE_INTS = ("max_tokens", "max_completion_tokens", "n")
BOOLS = ("stream", "echo")


@dataclass(frozen=True)
class BadRequest:
    message: str  # one line
    param: str | None = None


def check_body(path: str, raw: bytes, known_fields: frozenset[str]) -> BadRequest | None:
    """The reason to reject the body of a POST to `path`, or None to pass it on."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        return BadRequest(f"the body is not valid UTF-8 (byte {error.start})")
    except ValueError as error:
        return BadRequest(f"the body is not valid JSON: {error}")
    if not isinstance(body, dict):
        return BadRequest("the body must be a JSON object")
    unknown = sorted(set(body) - known_fields)
    if unknown:
        return BadRequest(f"unrecognized request argument: {unknown[0]}", unknown[0])
    problem = _check_messages(body) if path == CHAT_PATH else _check_prompt(body)
    return problem or _check_sampling(body) or _check_logprobs(path, body)


def _check_messages(body: dict) -> BadRequest | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return BadRequest("'messages' must be a non-empty list of message objects", "messages")
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            return BadRequest(f"{param} must be an object with 'role' and 'content'", param)
        role = message.get("role")
        if role not in ROLES:
            return BadRequest(
                f"{param}.role must be one of {', '.join(ROLES)}, got {role!r}", param
            )
        content = message.get("content")
        if content is None and role != "assistant":  # an assistant's may be tool calls instead
            return BadRequest(f"{param}.content is required for role {role!r}", param)
        if content is not None and not isinstance(content, str | list):
            kind = type(content).__name__
            return BadRequest(f"{param}.content must be a string or a list, not {kind}", param)
    return None


def _check_prompt(body: dict) -> BadRequest | None:
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return None
    if isinstance(prompt, list) and prompt and all(_is_prompt_item(p) for p in prompt):
        return None
    return BadRequest(
        "'prompt' must be a non-empty string, or a non-empty list of strings or token ids",
        "prompt",
    )


def _is_prompt_item(item) -> bool:
    if isinstance(item, str):
        return bool(item)
    if isinstance(item, list):  # one prompt as token ids
        return bool(item) and all(_is_int(t) and t >= 0 for t in item)
    return _is_int(item) and item >= 0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_sampling(body: dict) -> BadRequest | None:
    for name, (low, high, open_low) in NUMBER_RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value > high or value < low or (
            open_low and value == low
        ):  # fmt: skip
            bound = "(" if open_low else "["
            return BadRequest(f"'{name}' must be a number in {bound}{low}, {high}]", name)
    for name in POSITIVE_INTS:
        value = body.get(name)
        if value is not None and not (_is_int(value) and value >= 1):
            return BadRequest(f"'{name}' must be an integer >= 1, got {value!r}", name)
    for name in BOOLS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            return BadRequest(f"'{name}' must be true or false, got {value!r}", name)
    return None


def _check_logprobs(path: str, body: dict) -> BadRequest | None:
    """Chat's `logprobs` is a switch (its count is `top_logprobs`); completions' a count."""
    value = body.get("logprobs")
    if value is None:
        return None
    if path == CHAT_PATH and not isinstance(value, bool):
        return BadRequest(f"'logprobs' must be true or false, got {value!r}", "logprobs")
    if path != CHAT_PATH and not (_is_int(value) and value >= 0):
        return BadRequest(f"'logprobs' must be an integer >= 0, got {value!r}", "logprobs")
    return None


def error_body(problem: BadRequest) -> bytes:
    """vLLM's (and OpenAI's) error shape."""
    error = {"message": problem.message, "type": "BadRequestError", "param": problem.param}
    return json.dumps({"error": {**error, "code": 400}}).encode("utf-8")


def vllm_fields() -> dict[str, frozenset[str]]:
    """Each guarded path's known fields: vLLM's own request models (imported in its process)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return {
        CHAT_PATH: frozenset(ChatCompletionRequest.model_fields),
        COMPLETIONS_PATH: frozenset(CompletionRequest.model_fields),
    }


class RequestGuard:
    """ASGI middleware: buffers a guarded POST's body, answers a bad one with a 400 and passes a
    good one on with the same bytes."""

    def __init__(self, app, fields: dict[str, frozenset[str]] | None = None) -> None:
        self.app = app
        self.fields = fields if fields is not None else vllm_fields()

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in self.fields:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body arrived: nothing to answer
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        problem = check_body(path, raw, self.fields[path])
        if problem is not None:
            await _reply_400(send, error_body(problem))
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: disconnects reach the app as before
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)


async def _reply_400(send, payload: bytes) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
