"""The `oracle` teacher for Sokoban: deterministic hindsight skills from the replayed episode and the solver.

A Sokoban trajectory's game id is its room's seed, so the oracle regenerates the room, replays the actions
(an invalid response, or any word that is not a direction, is the no-op the environment played) and asks the
BFS solver what was possible. It writes the JSON answer an LLM teacher would
({"episode_summary": ..., "episode_skill": ...}), addressed to a future agent:
- success: the workflow (walk to the side of the box opposite its target, push it toward the target), this
  room's moves against the optimum, and the wasted moves to skip;
- failure, when the room became unsolvable: the decisive push (the first step after which the solver finds no
  plan: its step number, direction and where the box ended: a corner, against a wall, against a box) and the
  rule that avoids it;
- failure otherwise (out of steps): the wasted moves (invalid responses, moves that bumped into a wall or an
  unpushable box, steps back to an earlier state) and what the room still needed from the last state.
Positions are (row, col) with row 0 at the top, said once per answer. With `claims="played"`
(`teacher.oracle_claims`) an answer states only what can be read off the trajectory itself: the solver's plans
and the optimum are left out, so a small analyzer trained on these answers is never taught to state a plan it
could not have worked out.

Same protocol and choices as the ALFWorld oracle (`envs/alfworld/oracle.py`): `complete_trajectories`
instead of analyzer prompts, never re-asked, 0 prompt tokens and `len(text.split())` completion tokens, a
pure function of the trajectory and the room parameters (byte-identical answers), and the `max_chars`
budget (the skill keeps its sentences in priority order while they fit, whole sentences only; the summary
gets half). A trajectory whose recorded outcome disagrees with the replay is refused (DataError): the
generator or the rules changed since the rollout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from seed_core.envs.sokoban.room import ACTIONS, TARGET, WALL, Cell, Room, generate_room, search
from seed_core.method.teachers import TeacherAnswer, TeacherStats, budgeted_answer, oracle_answers
from seed_core.records import DataError, Trajectory

# What an answer may state (teacher.oracle_claims): `solver` adds the solver's facts (the shortest plan from the
# start or from where a lost episode ended, the optimum); `played` keeps to what a reader of the trajectory can
# check (the outcome, the moves that changed the room, the wasted steps, the decisive push).
CLAIMS = ("solver", "played")
_SIDE = {"up": "above it", "down": "below it", "left": "left of it", "right": "right of it"}
# At most this many step numbers in any list the answer names.
_LIST_MAX = 6
_COORDS = "positions are (row, col), row 0 at the top"
_WORKFLOW = (
    "Workflow: walk to the side of the box opposite its target, then push the box toward the target, one row or "
    "column at a time."
)
_CHECK_PUSH = (
    "Before every push, look at the cell beyond the box: it must be floor or a target, and a box against a wall "
    "or in a corner without a target is lost."
)
_RULES = {
    "corner": "Never push a box into a corner that is not a target: no push can ever move it out again.",
    "wall": (
        "Never push a box against a wall unless its target lies along that wall: from there it can only slide "
        "along the wall, never away from it."
    ),
    "box": (
        "Never push a box against another box along a wall or into a block of boxes and walls: they lock each "
        "other for good."
    ),
    "blocking": (
        "Fill the targets in an order that keeps the way open: a box on a target can block the boxes behind it."
    ),
    "stuck": (
        "Before each push, make sure the box can still be pushed on to its target from where it lands: a push "
        "can never be undone."
    ),
}


@dataclass(frozen=True)
class Push:
    step: int  # 1-based step number in the episode
    direction: str
    box_from: Cell
    box_to: Cell


@dataclass(frozen=True)
class EpisodeAnalysis:
    """What replaying one episode in its room shows. Step numbers are 1-based; cells are (row, col)."""

    won: bool
    steps: int  # actions replayed (the episode's, up to the win)
    targets: tuple[Cell, ...]
    start_boxes: tuple[Cell, ...]
    end_boxes: tuple[Cell, ...]
    start_plan: tuple[str, ...] | None  # the solver's shortest plan from the start; None: none found
    effective: tuple[str, ...]  # the moves that changed the room, in order
    pushes: tuple[Push, ...]
    invalid_steps: tuple[int, ...]  # no direction given (invalid response or unknown word): a no-op
    bump_steps: tuple[int, ...]  # a direction that moved nothing (a wall, or a box that could not move)
    revisit_steps: tuple[int, ...]  # moves back into a (player, boxes) state seen earlier in the episode
    dead_step: int | None  # the push after which no plan exists any more; None if that never happened
    dead_push: Push | None
    dead_reason: str  # "corner" | "wall" | "box" | "blocking" | "stuck", "" without a dead step
    dead_walls: tuple[str, ...]  # sides of the dead box that are walls ("up", "right", ...)
    last_plan: tuple[str, ...] | None  # shortest plan from the last state if lost but never dead, else None

    @property
    def wasted(self) -> int:
        return len(self.invalid_steps) + len(self.bump_steps) + len(self.revisit_steps)


def _wall(room: Room, cell: Cell) -> bool:
    h, w = room.fixed.shape
    return not (0 <= cell[0] < h and 0 <= cell[1] < w) or room.fixed[cell] == WALL


def _dead_position(room: Room, box: Cell) -> tuple[str, tuple[str, ...]]:
    """Why a box that was just pushed to `box` leaves `room` unsolvable: its reason and its wall sides."""
    sides = tuple(name for name, (dr, dc) in ACTIONS.items() if _wall(room, (box[0] + dr, box[1] + dc)))
    if room.fixed[box] == TARGET:
        return "blocking", sides
    if {"up", "down"} & set(sides) and {"left", "right"} & set(sides):
        return "corner", sides
    if sides:
        return "wall", sides
    if any((box[0] + dr, box[1] + dc) in room.boxes for dr, dc in ACTIONS.values()):
        return "box", sides
    return "stuck", sides


def analyze_episode(room: Room, actions: Sequence[str | None]) -> EpisodeAnalysis:
    """Replay `actions` (None or a non-direction is a no-op) from `room` and find what decided the outcome.

    The decisive mistake is the first push after which the solver proves there is no plan; only a push can do
    that (walking is reversible). If the solver gives up on a state (its state budget), no step is called
    decisive."""
    start_plan, _ = search(room)
    alive = start_plan is not None
    state, seen = room, {room.state_key()}
    effective: list[str] = []
    pushes: list[Push] = []
    invalid: list[int] = []
    bumps: list[int] = []
    revisits: list[int] = []
    dead: Push | None = None
    dead_room = room
    steps = 0
    for t, action in enumerate(actions, 1):
        if state.won:
            break
        steps = t
        if action not in ACTIONS:
            invalid.append(t)
            continue
        nxt = state.moved(action)
        if nxt.state_key() == state.state_key():
            bumps.append(t)
            continue
        effective.append(action)
        if nxt.state_key() in seen:
            revisits.append(t)
        seen.add(nxt.state_key())
        if nxt.boxes != state.boxes:
            (src,) = set(state.boxes) - set(nxt.boxes)
            (dst,) = set(nxt.boxes) - set(state.boxes)
            pushes.append(Push(t, action, src, dst))
            if alive and dead is None and not nxt.won:
                plan, decided = search(nxt)
                if plan is None and decided:
                    dead, dead_room, alive = pushes[-1], nxt, False
        state = nxt
    reason, sides = _dead_position(dead_room, dead.box_to) if dead else ("", ())
    last_plan = None
    if not state.won and dead is None and alive:
        plan, _ = search(state)
        last_plan = tuple(plan) if plan is not None else None
    return EpisodeAnalysis(
        won=state.won,
        steps=steps,
        targets=room.targets,
        start_boxes=room.boxes,
        end_boxes=state.boxes,
        start_plan=tuple(start_plan) if start_plan is not None else None,
        effective=tuple(effective),
        pushes=tuple(pushes),
        invalid_steps=tuple(invalid),
        bump_steps=tuple(bumps),
        revisit_steps=tuple(revisits),
        dead_step=dead.step if dead else None,
        dead_push=dead,
        dead_reason=reason,
        dead_walls=sides,
        last_plan=last_plan,
    )


# ---------------------------------------------------------------- the answer


def _join(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _cells(cells: Sequence[Cell]) -> str:
    return _join([str(c) for c in cells])


def _step_list(steps: Sequence[int]) -> str:
    shown = ", ".join(str(t) for t in steps[:_LIST_MAX])
    return f"step {shown}{', ...' if len(steps) > _LIST_MAX else ''}"


def _plan(plan: Sequence[str]) -> str:
    return ", ".join(plan) if plan else "nothing"


def _boxes_and_targets(a: EpisodeAnalysis, verb: str) -> str:
    """'the box at (3, 2) <verb> the target at (1, 2)', plural-aware."""
    if len(a.start_boxes) == 1:
        return f"the box at {a.start_boxes[0]} {verb} the target at {a.targets[0]}"
    return f"the boxes at {_cells(a.start_boxes)} {verb} the targets at {_cells(a.targets)}"


def _optimal(a: EpisodeAnalysis) -> str:
    return f"optimal {len(a.start_plan)}" if a.start_plan is not None else "no plan found from the start"


def _waste_notes(a: EpisodeAnalysis) -> list[str]:
    notes = []
    if a.invalid_steps:
        notes.append(
            f"{len(a.invalid_steps)} response(s) gave no valid move and did nothing ({_step_list(a.invalid_steps)}): "
            "answer in the required format with exactly one of up, down, left, right."
        )
    if a.bump_steps:
        notes.append(
            f"{len(a.bump_steps)} move(s) bumped into a wall or a box that could not move and did nothing "
            f"({_step_list(a.bump_steps)}): check the cell ahead of you, and beyond the box, before moving."
        )
    if a.revisit_steps:
        notes.append(
            f"{len(a.revisit_steps)} move(s) went back to an earlier position ({_step_list(a.revisit_steps)}): "
            "plan the walk to the pushing side before moving, and do not undo your own moves."
        )
    return notes


def _counts(a: EpisodeAnalysis) -> str:
    return (
        f"{len(a.pushes)} push(es), {len(a.invalid_steps)} invalid response(s), {len(a.bump_steps)} move(s) with "
        f"no effect, {len(a.revisit_steps)} move(s) back to an earlier position."
    )


def _sides(sides: Sequence[str]) -> str:
    return _join([_SIDE[s] for s in sides])


def _mistake(a: EpisodeAnalysis) -> str:
    p = a.dead_push
    one = len(a.start_boxes) == 1
    goal = f"the target at {a.targets[0]}" if one else "a target"
    head = f"step {p.step}: pushing the box {p.direction} into {p.box_to}"
    if a.dead_reason == "corner":
        tail = f"left it in a corner (walls {_sides(a.dead_walls)}), where it can never be pushed again"
    elif a.dead_reason == "wall":
        tail = f"left it against the wall {_sides(a.dead_walls)}, where it can never reach {goal}"
    elif a.dead_reason == "box":
        tail = "left it against another box, where the boxes can no longer all reach targets"
    elif a.dead_reason == "blocking":
        tail = "put it on a target where it blocks the way the other boxes need"
    else:
        tail = f"left it where it can never reach {goal}" if one else "left the boxes unable to all reach targets"
    return f"{head} {tail}"


def success_answer(a: EpisodeAnalysis, max_chars: int | None = None, solver: bool = True) -> dict[str, str]:
    """The answer for a won episode; `solver` False: only what the trajectory shows (no optimum, no plan)."""
    optimal = f", {_optimal(a)}" if solver else ""
    parts = [
        _WORKFLOW,
        f"Here ({_COORDS}) {_boxes_and_targets(a, 'reached')} with: {_plan(a.effective)} ({a.steps} steps{optimal}).",
    ]
    if solver and a.start_plan is not None and a.steps > len(a.start_plan):
        parts.append(f"The shortest plan takes {len(a.start_plan)} steps: {_plan(a.start_plan)}.")
    parts += _waste_notes(a)
    parts.append(_CHECK_PUSH)
    summary = [f"Success in {a.steps} step(s){f' ({_optimal(a)})' if solver else ''}.", _counts(a)]
    summary.append(f"Moves: {_plan(a.effective)}.")
    return budgeted_answer(summary, parts, max_chars)


def failure_answer(a: EpisodeAnalysis, max_chars: int | None = None, solver: bool = True) -> dict[str, str]:
    """The answer for a lost episode; `solver` False: only what the trajectory shows (the decisive push, the
    wasted moves), none of the solver's plans or step counts."""
    counts = _counts(a)
    optimal = f" ({_optimal(a)})" if solver else ""
    start = (
        []
        if not solver or a.start_plan is None
        else [f"The shortest plan from the start takes {len(a.start_plan)} steps: {_plan(a.start_plan)}."]
    )
    if a.dead_push is not None:
        parts = [
            _RULES[a.dead_reason],
            f"Here ({_COORDS}) the decisive mistake was {_mistake(a)}.",
            *start,
            "Warning sign: a push that puts a box next to a wall or into a corner away from the targets; walk "
            "around and push it from another side instead.",
            *_waste_notes(a),
        ]
        summary = [
            f"Failure after {a.steps} step(s){optimal}: step {a.dead_step} (push {a.dead_push.direction}) "
            "left the room unsolvable.",
            counts,
        ]
        return budgeted_answer(summary, parts, max_chars)
    if a.start_plan is None:
        parts = [_WORKFLOW, _CHECK_PUSH, *_waste_notes(a)]
        summary = [f"Failure after {a.steps} step(s): the solver found no plan for this room from the start.", counts]
        return budgeted_answer(summary, parts, max_chars)
    if not solver:
        still = ""
    elif a.last_plan is not None:
        still = f", and the room still needed {len(a.last_plan)} more step(s): {_plan(a.last_plan)}"
    else:
        still = ", and the solver could not tell what the room still needed"
    where = _cells(a.end_boxes)
    parts = [
        "Every step counts: walk straight to the side of the box opposite its target and push; do not bump into "
        "walls, give invalid answers or walk back and forth.",
        f"Here ({_COORDS}) {_boxes_and_targets(a, 'never all reached' if len(a.targets) > 1 else 'never reached')}"
        f": after {a.steps} steps the box{'es were' if len(a.targets) > 1 else ' was'} at {where}, {a.wasted} "
        f"step(s) were wasted{still}.",
        *start,
        *_waste_notes(a),
        _WORKFLOW,
    ]
    need = f"{len(a.last_plan)} more step(s) were needed" if a.last_plan is not None else "the rest is unknown"
    stayed = f": the room stayed solvable; {need}" if solver else ""
    summary = [f"Failure after {a.steps} step(s){optimal}{stayed}.", counts]
    return budgeted_answer(summary, parts, max_chars)


# ---------------------------------------------------------------- checking what a skill claims

_MOVE_LIST = re.compile(r"\b(?:up|down|left|right)\b(?:\s*,\s*(?:and\s+)?(?:up|down|left|right)\b)+", re.I)
_SUCCESS = re.compile(r"\bsuccess\w*|(?<!never )(?<!never all )\breached\b|\bsolved\b|\bwon\b", re.I)
_FAILURE = re.compile(r"\bfail\w*|\bdecisive mistake\b|\bnever (?:all )?reached\b|\bunsolvable\b", re.I)
# Counts a skill can state, each with the replay's true value. The oracle words them this way (`_counts`,
# `_waste_notes`), so a Stage-1 analyzer copies these phrasings; each one stated is a claim checked exactly.
_COUNT_CLAIMS: tuple[tuple[re.Pattern, Callable[[EpisodeAnalysis], int]], ...] = (
    (re.compile(r"\b(\d+) push\(es\)", re.I), lambda a: len(a.pushes)),
    (
        re.compile(r"\b(\d+) (?:invalid response\(s\)|response\(s\) gave no valid move)", re.I),
        lambda a: len(a.invalid_steps),
    ),
    (re.compile(r"\b(\d+) move\(s\) (?:with no effect|bumped)", re.I), lambda a: len(a.bump_steps)),
    (re.compile(r"\b(\d+) move\(s\) (?:went )?back to an earlier position", re.I), lambda a: len(a.revisit_steps)),
    (re.compile(r"\b(?:after|in) (\d+) steps?\b", re.I), lambda a: a.steps),
    (re.compile(r"\b(\d+) step\(s\) were wasted", re.I), lambda a: a.wasted),
)
_STEP_REFS = re.compile(r"\bsteps? (\d+(?:, \d+)*)", re.I)  # "step 12 (push left)", "(step 6, 7, 12)"


@dataclass(frozen=True)
class SkillCheck:
    """What a skill (its summary and rule) claims about its episode, checked against the replay and the solver."""

    outcome: bool | None  # the claimed outcome is the recorded one; None: no claim (or both claimed: False)
    move_lists: int  # lists of two or more moves the text states
    move_lists_true: int  # of which: the moves played, or a plan that wins from the start or from the last state
    facts: int = 0  # counts it states (pushes, invalid answers, bumps, revisits, steps, wasted steps) and step numbers
    facts_true: int = 0  # of which: the replay's count; a step number within the episode

    @property
    def consistent(self) -> bool:
        """At least one claim, and every claim true: a skill that parses but states nothing checkable, or anything
        false, is not consistent."""
        claims = (self.outcome is not None) + self.move_lists + self.facts
        true = self.move_lists_true == self.move_lists and self.facts_true == self.facts
        return claims > 0 and self.outcome is not False and true


def _wins(room: Room, moves: Sequence[str]) -> bool:
    for m in moves:
        room = room.moved(m)
    return room.won


def check_skill(text: str, room: Room, actions: Sequence[str | None], a: EpisodeAnalysis) -> SkillCheck:
    """Check `text` (summary and skill together) against the episode played from `room` with `actions` (None: an
    invalid answer) and its replay `a`: the outcome it claims (words of success: success, reached, solved, won;
    of failure: fail..., decisive mistake, never reached, unsolvable; both kinds at once is a false claim), and
    every list of two or more moves it states, which is true when it is the moves the episode made (those that
    changed the room, or every move it sent) or a plan that wins the room from its start or (a lost episode) from
    its last state; and every count it states in the oracle's words (`_COUNT_CLAIMS`: "3 push(es)", "after 15
    step(s)", ...) against the replay, and every step number it names ("step 21") against the episode's length."""
    said_won, said_lost = bool(_SUCCESS.search(text)), bool(_FAILURE.search(text))
    outcome = None if not (said_won or said_lost) else (said_won != said_lost and said_won == a.won)
    end = room
    for m in actions:
        end = end.moved(m) if not end.won else end
    sent = [m for m in actions if m in ACTIONS]
    lists = [
        [w.lower() for w in re.findall(r"up|down|left|right", m.group(0), re.I)]
        for m in _MOVE_LIST.finditer(text)
        if not text[: m.start()].lower().endswith("one of ")  # the answer format: "exactly one of up, down, ..."
    ]
    true = sum(ms in (list(a.effective), sent) or _wins(room, ms) or (not a.won and _wins(end, ms)) for ms in lists)
    facts = [int(m.group(1)) == value(a) for pattern, value in _COUNT_CLAIMS for m in pattern.finditer(text)]
    facts += [1 <= int(n) <= a.steps for m in _STEP_REFS.finditer(text) for n in m.group(1).split(", ")]
    return SkillCheck(outcome, len(lists), true, len(facts), sum(facts))


class SokobanOracleTeacher:
    """Hindsight skills for Sokoban trajectories (no model, no network): rooms regenerated from their seeds with
    `dim` and `num_boxes` (the rollout's env.sokoban.dim / env.sokoban.boxes).

    Used through `seed_core.method.skills.analyze`, which hands it the Trajectory records (`complete_trajectories`)
    instead of analyzer prompts. Rooms are generated once per seed."""

    name = "oracle"

    def __init__(self, dim: tuple[int, int], num_boxes: int, max_chars: int | None = None, claims: str = "solver"):
        if claims not in CLAIMS:
            raise ValueError(f"oracle claims must be one of {', '.join(CLAIMS)}, got {claims!r}")
        self.dim = tuple(dim)
        self.num_boxes = num_boxes
        self.max_chars = max_chars  # skill budget (the summary gets half), whole sentences; None: no limit
        self.claims = claims  # solver: also the solver's plans and optimum; played: only what the episode shows
        self.stats = TeacherStats()
        self._rooms: dict[int, Room] = {}

    def room(self, game_id: str) -> Room:
        if not game_id.isdigit():
            raise DataError(f"Sokoban game id {game_id!r} is not a room seed (a non-negative integer)")
        seed = int(game_id)
        if seed not in self._rooms:
            self._rooms[seed] = generate_room(seed, self.dim, self.num_boxes)
        return self._rooms[seed]

    def analyze(self, traj: Trajectory) -> EpisodeAnalysis:
        actions = [s.action if s.valid else None for s in traj.steps]
        a = analyze_episode(self.room(traj.game_id), actions)
        if a.won != traj.won:
            raise DataError(
                f"trajectory {traj.traj_id} records won={traj.won}, but replaying its actions in Sokoban room "
                f"{traj.game_id} (dim {list(self.dim)}, {self.num_boxes} box(es)) gives won={a.won}: the room "
                "generator, the rules or the room parameters changed since the rollout; re-run the rollout"
            )
        return a

    def analyze_trajectory(self, traj: Trajectory) -> str:
        """The JSON answer for one trajectory: byte-identical for the same trajectory."""
        a = self.analyze(traj)
        answer = (success_answer if a.won else failure_answer)(a, self.max_chars, solver=self.claims == "solver")
        return json.dumps(answer, ensure_ascii=False)

    def check_skill(self, traj: Trajectory, text: str) -> SkillCheck:
        """`check_skill` of `text` (a skill's summary and rule) against `traj` replayed in its room."""
        actions = [s.action if s.valid else None for s in traj.steps]
        return check_skill(text, self.room(traj.game_id), actions, self.analyze(traj))

    def complete_trajectories(self, trajectories: Sequence[Trajectory]) -> list[TeacherAnswer | None]:
        """One answer per trajectory, in order (never None: the oracle always answers)."""
        return oracle_answers(self, trajectories)
