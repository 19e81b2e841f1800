"""Teachers: whatever writes the analyzer answer for a prompt (an external LLM, or a policy checkpoint).

A teacher maps a batch of analyzer prompts to one answer each, or None when it could not produce one.
- `OpenAITeacher`: any OpenAI-compatible chat-completions endpoint (the paper used GLM at temperature 0 and
  up to 4,096 tokens). Retries with exponential backoff on flaky failures, a bounded thread pool, and a
  content-addressed on-disk cache so a re-run is free and gives byte-identical answers. The paper calls a
  live API; the cache is our addition, so Stage 1 does not depend on a paid, drifting service once run.
- `PolicyTeacher`: a model checkpoint as its own analyzer (SEED's Stage 2, and to measure analyzers).
The ALFWorld `oracle` teacher (it needs the environment) is written elsewhere against the same protocol.

The API key is read from the environment variable *named* in the parameters, at construction (to refuse
early) and per request; it is never stored on the object, logged, cached or counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from seed_core.config import ModelConfig
from seed_core.policy import Sampler
from seed_core.records import Trajectory, atomic_write_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeacherAnswer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False  # served from the on-disk cache: no request was made


@dataclass
class TeacherStats:
    """Running counters of one teacher object. Tokens are those billed by fresh (non-cached) answers."""

    calls: int = 0  # prompts asked for
    requests: int = 0  # requests actually sent (HTTP requests, or prompts in a generate batch)
    retries: int = 0  # requests after the first for the same prompt
    failures: int = 0  # failed requests (timeout, connection error, HTTP error, malformed body)
    dropped: int = 0  # prompts that got no answer at all
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failed requests by reason ("timeout", "http_500", ...)


class Teacher(Protocol):
    name: str  # recorded as the Skill's producer
    stats: TeacherStats

    def complete_batch(self, prompts: Sequence[str]) -> list[TeacherAnswer | None]:
        """One answer per prompt, in order; None where no answer could be obtained."""
        ...


class MissingAPIKeyError(RuntimeError):
    """The environment variable that should hold the teacher's API key is unset or empty."""


class _RequestFailed(Exception):
    """One failed request; `reason` is a short label for the stats ("timeout", "http_500", "malformed")."""

    def __init__(self, reason: str, retryable: bool = True, retry_after_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.retry_after_s = retry_after_s


# Upper bound on any single wait, whether from backoff or from a server's Retry-After.
_MAX_WAIT_S = 60.0


class OpenAITeacher:
    """An OpenAI-compatible `/chat/completions` endpoint; `base_url` includes the version (`.../v1`)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str,
        *,
        cache_dir: str | os.PathLike,
        temperature: float = 0.0,
        max_tokens: int = 4096,
        concurrency: int = 4,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        backoff_base_s: float = 1.0,
    ):
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(
                f"teacher needs concurrency >= 1, max_retries >= 0 and timeout_s > 0 "
                f"(got {concurrency}, {max_retries}, {timeout_s}); fix the teacher section of params.yaml"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.cache_dir = Path(cache_dir)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.name = f"openai:{model}"
        self.stats = TeacherStats()
        self._lock = threading.Lock()
        self._api_key()  # refuse now, before any rollout is spent, rather than at the first request

    def __repr__(self) -> str:
        return f"OpenAITeacher(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def _api_key(self) -> str:
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise MissingAPIKeyError(
                f"environment variable {self.api_key_env} is not set (or empty); export it with your API key for "
                f"{self.base_url}, or choose another teacher kind (e.g. oracle) in params.yaml"
            )
        return key

    def _request(self, prompt: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def cache_path(self, prompt: str) -> Path:
        """The cache file for `prompt`: keyed by everything that decides the answer, not by the endpoint URL."""
        key = hashlib.sha256(json.dumps(self._request(prompt), sort_keys=True).encode("utf-8")).hexdigest()
        return self.cache_dir / f"{key}.json"

    def complete_batch(self, prompts: Sequence[str]) -> list[TeacherAnswer | None]:
        with httpx.Client(timeout=self.timeout_s, limits=httpx.Limits(max_connections=self.concurrency)) as client:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                return list(pool.map(lambda p: self._complete(client, p), prompts))

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, n in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + n)

    def _complete(self, client: httpx.Client, prompt: str) -> TeacherAnswer | None:
        self._count(calls=1)
        path = self.cache_path(prompt)
        cached = self._read_cache(path)
        if cached is not None:
            self._count(cache_hits=1)
            return cached
        answer = self._ask_with_retries(client, prompt)
        if answer is not None:
            self._count(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens)
            # Only successful answers are cached, so a failure is asked again on the next run.
            record = {
                "model": self.model,
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                **asdict(answer),
            }
            del record["cached"]
            atomic_write_text(path, json.dumps(record, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
        return answer

    def _ask_with_retries(self, client: httpx.Client, prompt: str) -> TeacherAnswer | None:
        for attempt in range(self.max_retries + 1):
            self._count(requests=1, retries=int(attempt > 0))
            try:
                return self._post(client, prompt)
            except _RequestFailed as e:
                with self._lock:
                    self.stats.failures += 1
                    self.stats.errors[e.reason] = self.stats.errors.get(e.reason, 0) + 1
                if not e.retryable or attempt == self.max_retries:
                    log.warning(
                        "teacher %s: no answer after %d request(s), last error %s", self.name, attempt + 1, e.reason
                    )
                    break
                backoff = self.backoff_base_s * 2**attempt
                wait = min(backoff if e.retry_after_s is None else e.retry_after_s, _MAX_WAIT_S)
                log.info(
                    "teacher %s: request failed (%s), retry %d/%d in %.2f s",
                    self.name,
                    e.reason,
                    attempt + 1,
                    self.max_retries,
                    wait,
                )
                time.sleep(wait)
        self._count(dropped=1)
        return None

    def _post(self, client: httpx.Client, prompt: str) -> TeacherAnswer:
        headers = {"Authorization": f"Bearer {self._api_key()}"}
        try:
            r = client.post(f"{self.base_url}/chat/completions", json=self._request(prompt), headers=headers)
        except httpx.TimeoutException as e:
            raise _RequestFailed("timeout") from e
        except httpx.TransportError as e:
            raise _RequestFailed("connection") from e
        if r.status_code == 429 or r.status_code >= 500:
            raise _RequestFailed(f"http_{r.status_code}", retry_after_s=_retry_after(r.headers.get("retry-after")))
        if r.status_code >= 400:  # a bad request, key or model name: asking again gives the same answer
            raise _RequestFailed(f"http_{r.status_code}", retryable=False)
        # A 2xx with an unusable body is a server hiccup (proxies, overloaded gateways): retried like a 5xx.
        try:
            body = r.json()
            text = body["choices"][0]["message"]["content"]
            usage = body.get("usage") or {}
            tokens = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise _RequestFailed("malformed") from e
        if not isinstance(text, str):
            raise _RequestFailed("malformed")
        return TeacherAnswer(text, *tokens)

    def _read_cache(self, path: Path) -> TeacherAnswer | None:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return TeacherAnswer(d["text"], d["prompt_tokens"], d["completion_tokens"], cached=True)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # Writes are atomic, so this is a hand-edited or foreign file; asking again overwrites it.
            log.warning("teacher cache file %s is not a cached answer; ignoring it", path)
            return None


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header; the HTTP-date form is rare for APIs and falls back to backoff."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class PolicyTeacher:
    """A policy checkpoint as analyzer: one batched greedy `generate` call.

    The Sampler protocol reports no prompt lengths, so `prompt_tokens` is 0; completion tokens are counted.
    """

    def __init__(
        self,
        policy: Sampler,
        name: str,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        stop: Sequence[str] = (),
    ):
        self.policy = policy
        self.stop = tuple(stop)
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.stats = TeacherStats()

    def complete_batch(self, prompts: Sequence[str]) -> list[TeacherAnswer | None]:
        if not prompts:
            return []
        gens = self.policy.generate(
            list(prompts),
            temperature=self.temperature,
            top_p=1.0,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            seed=self.seed,
        )
        answers = [TeacherAnswer(g.text, 0, len(g.token_ids)) for g in gens]
        self.stats.calls += len(prompts)
        self.stats.requests += len(prompts)
        self.stats.completion_tokens += sum(a.completion_tokens for a in answers)
        return answers


# ---------------------------------------------------------------- a checkpoint as analyzer

ANALYZER_STOP = ("}",)
"""A model analyzer stops at the first closing brace: the answer is one flat JSON object."""
NO_PROMPT_CAP = 1_000_000
"""Analyzer prompts are never cut: keeping only their end would drop the task and the first steps."""


def checkpoint_name(path: str | Path) -> str:
    """`<folder>@<sha256 of its safetensors files, 12 hex>`: the producer name of a model analyzer."""
    path = Path(path)
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return f"{path.name}@{h.hexdigest()[:12]}"


def checkpoint_teacher(
    model_path: str | Path, *, max_new_tokens: int, model: ModelConfig, batch_size: int
) -> PolicyTeacher:
    """A checkpoint as analyzer on `model.device`: greedy, stopping at the first "}", its prompts never truncated."""
    from seed_core.models import load_for
    from seed_core.policy.hf import HFPolicy

    weights, tok = load_for(model_path, model)
    policy = HFPolicy(weights, tok, batch_size=batch_size, max_prompt_tokens=NO_PROMPT_CAP)
    return PolicyTeacher(policy, f"policy:{checkpoint_name(model_path)}", max_new_tokens, stop=ANALYZER_STOP)


# ---------------------------------------------------------------- oracle answers (what the games' oracle teachers share)


def _fit(parts: Sequence[str], max_chars: int | None) -> str:
    """The parts (most important first) joined by spaces, keeping each one that still fits in `max_chars`; the
    first is always kept."""
    kept = [parts[0]]
    for part in parts[1:]:
        if max_chars is None or len(" ".join([*kept, part])) <= max_chars:
            kept.append(part)
    return " ".join(kept)


def budgeted_answer(summary: Sequence[str], skill: Sequence[str], max_chars: int | None) -> dict[str, str]:
    """An oracle's answer from sentences in priority order: the skill keeps whole sentences while they fit in
    `max_chars`, the summary (context for a reader, never injected) in half of it; None: no limit."""
    return {"episode_summary": _fit(summary, max_chars and max_chars // 2), "episode_skill": _fit(skill, max_chars)}


def oracle_answers(oracle, trajectories: Sequence[Trajectory]) -> list[TeacherAnswer]:
    """`oracle.analyze_trajectory` of each trajectory as TeacherAnswers, counted in `oracle.stats`: 0 prompt tokens
    (no model reads anything) and a whitespace word count as completion tokens."""
    answers = []
    for traj in trajectories:
        text = oracle.analyze_trajectory(traj)
        answers.append(TeacherAnswer(text, prompt_tokens=0, completion_tokens=len(text.split())))
    oracle.stats.calls += len(answers)
    oracle.stats.completion_tokens += sum(a.completion_tokens for a in answers)
    return answers
