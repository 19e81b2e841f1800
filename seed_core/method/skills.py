"""Hindsight skills: trajectory serialization, the analyzer prompt, the tolerant parser, and `analyze`.

Implements SEED's analyzer step (Stage 1 labelling and Stage 2 "Analyze"): each finished trajectory is shown
to a teacher with its task, outcome and steps (raw observation, full response, step return), and the answer
is parsed into one episode-level skill. Parsing is tolerant as in the paper (fenced or raw JSON inside prose,
trailing commas, first valid object, non-empty `episode_skill`); a trajectory whose answer still does not
parse gets no skill, hence no OPD signal.

Departures from the paper, where it is silent or we add safety:
- the step return is the undiscounted reward-to-go; the last step's environment feedback is shown after the
  steps, since no later observation carries it (it is what tells a failure's last action did nothing);
- one re-ask showing the parse error (the paper keeps only answers that parse; the issue allows one retry);
- the summary and skill are capped at `max_skill_chars` (a runaway answer must not flood the teacher context);
- an answer that echoes the prompt's skill placeholder is rejected;
- a teacher may read the Trajectory records instead of the prompts (`TrajectoryTeacher`, e.g. the ALFWorld
  oracle in `seed_core.envs.alfworld.oracle`); records still carry the analyzer prompt's hash, and such a teacher is never
  re-asked (it is deterministic: the same trajectory gets the same answer).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from seed_core.method.prompts import ANALYZER_PROMPT, REASK_PROMPT, SKILL_PLACEHOLDER
from seed_core.method.teachers import Teacher, TeacherAnswer, TeacherStats
from seed_core.records import Skill, Trajectory

PARSED = ("ok", "ok_after_reask")
"""Parse statuses of a usable skill (one that gives OPD signal and SFT examples)."""
PARSE_STATUSES = ("ok", "ok_after_reask", "failed", "dropped")
DEFAULT_MAX_SKILL_CHARS = 2000
# A failed answer is quoted back in the re-ask; a runaway one is cut so the re-ask prompt stays bounded.
REASK_ANSWER_CHARS = 4000


# ---------------------------------------------------------------- analyzer prompt


def step_returns(rewards: Sequence[float]) -> list[float]:
    """Undiscounted reward-to-go: returns[t] = sum(rewards[t:])."""
    out, g = [], 0.0
    for r in reversed(rewards):
        g += r
        out.append(g)
    return out[::-1]


def _fmt_return(x: float) -> str:
    # Rounded so float noise (9.899999...) never reaches the prompt or its hash; + 0.0 turns -0 into 0.
    return format(round(x, 6) + 0.0, "g")


def serialize_trajectory(traj: Trajectory) -> str:
    """The steps as the analyzer reads them, numbered from 1; deterministic (the prompt hash depends on it)."""
    returns = step_returns([s.reward for s in traj.steps])
    blocks = [
        f"[Step {i}]\nObservation: {s.observation}\nResponse: {s.response}\nStep return: {_fmt_return(g)}"
        for i, (s, g) in enumerate(zip(traj.steps, returns), 1)
    ]
    if traj.steps:
        blocks.append(f"[After step {len(traj.steps)}]\nObservation: {traj.steps[-1].feedback}")
    return "\n\n".join(blocks)


def outcome(traj: Trajectory) -> str:
    return "success" if traj.won else "failure"


def analyzer_prompt(traj: Trajectory, template: str = ANALYZER_PROMPT) -> str:
    return template.format(task=traj.task, outcome=outcome(traj), trajectory=serialize_trajectory(traj))


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- parser


@dataclass(frozen=True)
class ParseResult:
    summary: str
    skill: str
    error: str | None  # why the answer is unusable, phrased for the re-ask; None when it parsed
    truncated: bool = False  # the summary or skill was cut to max_skill_chars

    @property
    def ok(self) -> bool:
        return self.error is None


# Structural characters of a JSON object, and the rest of a JSON string after its opening quote.
_STRUCT = re.compile(r'[{}"]')
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
# A JSON string (kept as is) or a comma followed only by whitespace before a closing bracket (dropped).
_TRAILING_COMMA = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|,(\s*[}\]])', re.S)


def _record_object_ends(text: str, start: int, ends: dict[int, int | None]) -> None:
    """For every "{" outside strings from text[start] (a "{") on, record where its brace-balanced span ends
    (exclusive), or None when it never closes. Braces inside strings are skipped (escape-aware).

    One pass serves every start it visits, since a scan from any of them would see the same strings; a "{"
    that this pass saw inside a string gets its own pass. This keeps degenerate answers ("{{{{...") linear.
    """
    stack: list[int] = []
    i = start
    while m := _STRUCT.search(text, i):
        if m.group() == '"':
            s = _STRING_REST.match(text, m.end())
            if s is None:
                break  # an unterminated string: nothing still open can close
            i = s.end()
            continue
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            ends[stack.pop()] = m.end()
        i = m.end()
    ends.update(dict.fromkeys(stack))


def _load_object(span: str) -> dict[str, Any]:
    """json.loads of a "{...}" span, retried once with trailing commas removed. Raises ValueError."""
    # strict=False: raw newlines inside strings are common in model answers and harmless.
    try:
        try:
            return json.loads(span, strict=False)
        except json.JSONDecodeError:
            return json.loads(_TRAILING_COMMA.sub(lambda m: m.group(1) or m.group(2), span), strict=False)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e


def _cap(text: str, limit: int) -> tuple[str, bool]:
    return (text[:limit].rstrip(), True) if len(text) > limit else (text, False)


def parse_skill(text: str, max_skill_chars: int = DEFAULT_MAX_SKILL_CHARS) -> ParseResult:
    """The first JSON object in `text` that has an `episode_skill` field, validated.

    Every "{" is a candidate start, in order, so a fenced block, an object inside prose, or an object nested
    in a wrapper are all found; a span that is not valid JSON (even without trailing commas) is skipped.
    """
    first_error: str | None = None
    keys_seen: list[str] = []
    ends: dict[int, int | None] = {}
    for m in re.finditer(r"\{", text):
        if m.start() not in ends:
            _record_object_ends(text, m.start(), ends)
        end = ends[m.start()]
        if end is None:
            first_error = first_error or f"the JSON object starting at character {m.start()} is never closed"
            continue
        try:
            obj = _load_object(text[m.start() : end])
        except ValueError as e:
            first_error = first_error or f"invalid JSON at character {m.start()} ({e})"
            continue
        if "episode_skill" not in obj:
            keys_seen += [k for k in obj if k not in keys_seen]
            continue
        return _validate(obj, max_skill_chars)
    if keys_seen:
        return ParseResult("", "", f'no JSON object has an "episode_skill" field (found fields {keys_seen})')
    return ParseResult("", "", first_error or "the answer contains no JSON object")


def _validate(obj: dict[str, Any], max_skill_chars: int) -> ParseResult:
    skill = obj["episode_skill"]
    if not isinstance(skill, str):
        return ParseResult("", "", f'"episode_skill" must be a string, got {type(skill).__name__}')
    skill = skill.strip()
    if not skill:
        return ParseResult("", "", '"episode_skill" is empty')
    if skill == SKILL_PLACEHOLDER:
        return ParseResult("", "", '"episode_skill" repeats the placeholder of the answer format instead of a skill')
    summary = obj.get("episode_summary")
    summary = summary.strip() if isinstance(summary, str) else ""
    skill, cut_skill = _cap(skill, max_skill_chars)
    summary, cut_summary = _cap(summary, max_skill_chars)
    return ParseResult(summary, skill, None, cut_skill or cut_summary)


# ---------------------------------------------------------------- analyze


@runtime_checkable
class TrajectoryTeacher(Protocol):
    """A teacher that reads the finished episodes themselves rather than their analyzer prompts (the ALFWorld
    oracle needs the game id and the steps' actions and feedback, which a prompt only holds as text)."""

    name: str
    stats: TeacherStats

    def complete_trajectories(self, trajectories: Sequence[Trajectory]) -> list[TeacherAnswer | None]:
        """One answer per trajectory, in order; None where no answer could be obtained."""
        ...


@dataclass
class AnalysisStats:
    """Counts for one `analyze` call. Tokens cover every answer used, cached or not (the cost of the data)."""

    trajectories: int = 0
    ok: int = 0
    ok_after_reask: int = 0
    failed: int = 0  # answered, but no parseable skill even after the re-ask
    dropped: int = 0  # the teacher gave no answer
    truncated: int = 0
    calls: int = 0  # prompts sent to the teacher, re-asks included
    cached: int = 0  # answers served from the teacher's cache
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def parse_rate(self) -> float:
        return (self.ok + self.ok_after_reask) / self.trajectories if self.trajectories else 0.0

    def add_answers(self, answers: Sequence[TeacherAnswer | None]) -> None:
        self.calls += len(answers)
        for a in answers:
            if a is not None:
                self.cached += int(a.cached)
                self.prompt_tokens += a.prompt_tokens
                self.completion_tokens += a.completion_tokens


def analyze(
    trajectories: Sequence[Trajectory],
    teacher: Teacher | TrajectoryTeacher,
    *,
    reask: bool = True,
    max_skill_chars: int = DEFAULT_MAX_SKILL_CHARS,
    template: str = ANALYZER_PROMPT,
) -> tuple[list[Skill], AnalysisStats]:
    """One Skill record per trajectory, in order, plus counts.

    parse_status: "ok", "ok_after_reask", "failed" (answered but unparseable; also when the re-ask got no
    answer), or "dropped" (no answer). Failed and dropped records have empty summary and skill.
    A `TrajectoryTeacher` (one with `complete_trajectories`) is given the trajectories instead of the prompts
    and is never re-asked; its records still carry the analyzer prompt's hash.
    """
    stats = AnalysisStats(trajectories=len(trajectories))
    prompts = [analyzer_prompt(t, template) for t in trajectories]
    by_trajectory = isinstance(teacher, TrajectoryTeacher)
    answers = teacher.complete_trajectories(trajectories) if by_trajectory else teacher.complete_batch(prompts)
    stats.add_answers(answers)
    parsed = [parse_skill(a.text, max_skill_chars) if a is not None else None for a in answers]
    status = ["dropped" if p is None else "ok" if p.ok else "failed" for p in parsed]
    raw = [a.text if a is not None else "" for a in answers]

    redo = [i for i, s in enumerate(status) if s == "failed"] if reask and not by_trajectory else []
    if redo:
        reask_prompts = [
            REASK_PROMPT.format(prompt=prompts[i], answer=_cap(raw[i], REASK_ANSWER_CHARS)[0], error=parsed[i].error)
            for i in redo
        ]
        second = teacher.complete_batch(reask_prompts)
        stats.add_answers(second)
        for i, a in zip(redo, second):
            if a is None:
                continue
            raw[i] = a.text
            parsed[i] = parse_skill(a.text, max_skill_chars)
            if parsed[i].ok:
                status[i] = "ok_after_reask"

    skills = []
    for t, prompt, p, st, r in zip(trajectories, prompts, parsed, status, raw):
        good = p is not None and p.ok
        setattr(stats, st, getattr(stats, st) + 1)
        if good and p.truncated:
            stats.truncated += 1
        skills.append(
            Skill(
                traj_id=t.traj_id,
                game_id=t.game_id,
                task_type=t.task_type,
                outcome=outcome(t),
                summary=p.summary if good else "",
                skill=p.skill if good else "",
                parse_status=st,
                raw_output=r,
                producer=teacher.name,
                prompt_hash=prompt_hash(prompt),
            )
        )
    return skills, stats


def shuffled_skills(trajectories: Sequence[Trajectory], skills: Sequence[Skill | None]) -> list[Skill | None]:
    """The shuffled-skill control: each trajectory gets a skill written for another game. The batch's games are
    taken in order of first appearance and rotated by one: the k-th trajectory of game i gets the k-th skill
    (cycling) of game i + 1, so every skill keeps its form and length and loses its content. The record is the
    source's text, relabelled for the trajectory it now goes with (`producer` "shuffled:<source producer>").
    Fewer than two games is a ValueError: there is no other room to take a skill from."""
    games: dict[str, list[Skill | None]] = {}
    for t, s in zip(trajectories, skills):
        games.setdefault(t.game_id, []).append(s)
    order = list(games)
    if len(order) < 2:
        raise ValueError(f"shuffled skills need trajectories of two games or more, got {len(order)}")
    nth: dict[str, int] = {}
    out: list[Skill | None] = []
    for t in trajectories:
        k = nth[t.game_id] = nth.get(t.game_id, -1) + 1
        donor = games[order[(order.index(t.game_id) + 1) % len(order)]]
        src = donor[k % len(donor)]
        out.append(
            None
            if src is None
            else dataclasses.replace(
                src, traj_id=t.traj_id, game_id=t.game_id, outcome=outcome(t), producer=f"shuffled:{src.producer}"
            )
        )
    return out


def consistency_metrics(env, trajectories: Sequence[Trajectory], skills: Sequence[Skill]) -> dict[str, float]:
    """Whether parsed skills say true things of their episodes (`Environment.check_skill`): the share that make at
    least one checkable claim and no false one (`skills/consistent`), the share of outcome claims that are true,
    the share of stated move lists that are true, and the share of stated counts and step numbers that are true; {}
    where the environment cannot check (ALFWorld) or no skill parsed; a share with nothing to count (no outcome
    claim, no move list, no count) is left out. A skill that parses but lies is not a success."""
    checks = [env.check_skill(t, s) for t, s in zip(trajectories, skills) if s.parse_status in PARSED]
    checks = [c for c in checks if c is not None]
    if not checks:
        return {}
    outcomes = [c.outcome for c in checks if c.outcome is not None]
    lists = sum(c.move_lists for c in checks)
    out = {"skills/consistent": sum(c.consistent for c in checks) / len(checks)}
    if outcomes:
        out["skills/outcome_true"] = sum(outcomes) / len(outcomes)
    if lists:
        out["skills/move_lists_true"] = sum(c.move_lists_true for c in checks) / lists
    if facts := sum(c.facts for c in checks):
        out["skills/facts_true"] = sum(c.facts_true for c in checks) / facts
    return out
