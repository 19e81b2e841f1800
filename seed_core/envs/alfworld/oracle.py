"""The `oracle` teacher: an offline, deterministic hindsight analyzer for ALFWorld.

SEED's Stage 1 labels each trajectory with a skill written by an external LLM. The oracle is a free,
reproducible stand-in that knows what the environment knows after the episode: the game's expert
walkthrough, where every object really was (the PDDL problem's initial state), which step first left the
expert plan, loops, actions that did nothing, and badly formatted responses. From that it writes the same
JSON answer an LLM teacher would ({"episode_summary": ..., "episode_skill": ...}):
- success: the workflow that worked, as the agent's own effective actions in order (searching detours
  removed), the task type's decision rule, and the detours to skip;
- failure: the core mistake (the first goal milestone never reached: find and take the object, heat / cool /
  clean it, place it, use the lamp), the true location of the target object(s), the expert plan, and the
  warning signs seen (first step off the plan, repeated action/observation pairs, invalid-format steps).

Object names: the PDDL problem uses mangled ids (`Apple_bar__plus_00_dot_26...`); the game shows
`apple 2`. Names are demangled with ALFWorld's own `Demangler` (no shuffling, as `AlfworldGame` plays them)
over the entities of the initial-state facts, which is the set textworld's PDDL backend numbers.

Departures / choices (the paper has no oracle):
- The oracle reads Trajectory records, not analyzer prompts: `seed_core.method.skills.analyze` calls
  `complete_trajectories` for teachers that have it. It is never re-asked (its answers always parse and
  are deterministic, so a re-ask would repeat them).
- Token counts: 0 prompt tokens (no model reads anything) and completion tokens = `len(text.split())`,
  a whitespace word count of the JSON answer, so "teacher cost" stats stay comparable in order of magnitude.
- Determinism: the answer is a pure function of the trajectory and the game file; same trajectory,
  byte-identical answer.
- Length budget (`teacher.oracle_max_chars`): the skill keeps its sentences in priority order while they
  fit, whole sentences only; the summary (context for a reader, never injected) gets half the budget. A
  135M analyzer did not learn the full ~1,000-character answers from a handful of examples (held-out parse
  rate 0 after Stage 1 here); with 300 characters it learned the format but looped on the summary's
  "Visited ..." sentences, which the half budget leaves out.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from seed_core.envs.alfworld.data import DataError, game_path, how_to_install, import_alfworld
from seed_core.method.teachers import TeacherAnswer, TeacherStats, budgeted_answer, oracle_answers
from seed_core.records import Step, Trajectory

NOTHING = "Nothing happens."
# What a skill quotes of an agent's action: invalid steps carry the whole raw response as their action.
_QUOTE_CHARS = 60
# At most this many items in any list the skill names (detours, loops, other instances).
_LIST_MAX = 3

# The appliance each transforming task type needs, with the verb of its command ("heat X with microwave 1").
TRANSFORMS = {
    "pick_heat_then_place_in_recep": ("heat", "microwave"),
    "pick_cool_then_place_in_recep": ("cool", "fridge"),
    "pick_clean_then_place_in_recep": ("clean", "sinkbasin"),
}
_PAST = {"heat": "heated", "cool": "cooled", "clean": "cleaned"}

# Feedback lines of the ALFWorld grammar that mean an action took effect.
_NAME = r"[a-z]+(?: \d+)?"
_ARRIVE = re.compile(rf"^You arrive at ({_NAME})\.")
_OPEN = re.compile(rf"^You open the ({_NAME})\.")
_TAKE = re.compile(rf"^You pick up the ({_NAME}) from the ({_NAME})\.")
_MOVE = re.compile(rf"^You move the ({_NAME}) to the ({_NAME})\.")
_TRANSFORM = re.compile(rf"^You (heat|cool|clean) the ({_NAME}) using the ({_NAME})\.")
_TURN_ON = re.compile(rf"^You turn on the ({_NAME})\.")

_FACT = re.compile(r"\(([A-Za-z][\w-]*)((?:\s+[^\s()]+)+)\s*\)")


def kind_of(name: str) -> str:
    """The type of a demangled instance name: `apple 2` -> `apple`."""
    return re.sub(r" \d+$", "", name.strip())


def _matches(pattern: str, actions: Sequence[str]) -> list[tuple[str, ...]]:
    """The groups of every action that fully matches `pattern`, in order."""
    return [m.groups() for a in actions if (m := re.fullmatch(pattern, a))]


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _quote(action: str) -> str:
    action = " ".join(action.split())
    return f"'{action[:_QUOTE_CHARS]}...'" if len(action) > _QUOTE_CHARS else f"'{action}'"


def _join(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


# ---------------------------------------------------------------- what the game file knows


@dataclass(frozen=True)
class GameFacts:
    """What an ALFWorld game file says about its solution, in the names the agent sees."""

    task_type: str
    walkthrough: tuple[str, ...]  # the expert plan, as admissible commands
    target: str  # object type to deliver or examine ("apple")
    count: int  # how many of them (2 for pick_two_obj_and_place)
    goal_receptacle: str  # receptacle type to put it in ("countertop"); "" for look_at_obj_in_light
    lamp: str  # "desklamp" / "floorlamp" for look_at_obj_in_light, else ""
    appliance: str  # the walkthrough's heat/cool/clean appliance or lamp ("microwave 1", "desklamp 1"), else ""
    locations: dict[str, tuple[str, ...]]  # initial receptacle(s) of every object instance ("apple 2" -> ...)
    receptacles: frozenset[str]  # every receptacle instance
    openable: frozenset[str]  # receptacles that must be opened first

    @property
    def expert_takes(self) -> list[tuple[str, str]]:
        """(object, receptacle) of each `take` in the walkthrough, in order."""
        return _matches(rf"take ({_NAME}) from ({_NAME})", self.walkthrough)

    def instances_of(self, kind: str, visible: frozenset[str] | None = None) -> list[tuple[str, str]]:
        """(instance, receptacle) for every object of `kind`, sorted; only receptacles in `visible` if given."""
        out = []
        for obj, recs in sorted(self.locations.items()):
            if kind_of(obj) != kind:
                continue
            for r in recs:
                if r in self.receptacles and (visible is None or r in visible):
                    out.append((obj, r))
        return out


def _section(text: str, start: str, end: str | None) -> str:
    i = text.find(start)
    if i < 0:
        return ""
    j = text.find(end, i) if end else -1
    return text[i : j if j >= 0 else len(text)]


def demangled_names(init_facts: list[tuple[str, list[str]]]) -> dict[str, str]:
    """Mangled PDDL id -> the name the game shows, via ALFWorld's own Demangler (unshuffled).

    The numbering depends on the set of entities (ids of one kind are numbered in reverse sorted order),
    which textworld takes from the arguments of the initial-state facts; so do we, lower-cased as it does.
    """
    import_alfworld()
    from alfworld.agents.utils.misc import Demangler

    ids = sorted({a.lower() for _, args in init_facts for a in args})
    demangler = Demangler(game_infos={i: SimpleNamespace(id=i) for i in ids}, shuffle=False)
    return {i: demangler.demangle_alfred_name(i).strip() for i in ids}


def read_game_facts(path: Path, task_type: str) -> GameFacts:
    game = json.loads(Path(path).read_text(encoding="utf-8"))
    problem = game["pddl_problem"]
    walkthrough = tuple(a.strip().lower() for a in game.get("walkthrough", []))
    init = [(m.group(1), m.group(2).split()) for m in _FACT.finditer(_section(problem, "(:init", "(:goal"))]
    names = demangled_names(init)

    def n(x: str) -> str:
        return names.get(x.lower(), x.lower())

    locations: dict[str, list[str]] = {}
    receptacles, openable = set(), set()
    for pred, args in init:
        if pred == "inReceptacle" and len(args) == 2:
            locations.setdefault(n(args[0]), []).append(n(args[1]))
        elif pred == "receptacleType" and args:
            receptacles.add(n(args[0]))
        elif pred == "openable" and args:
            openable.add(n(args[0]))

    goal = _section(problem, "(:goal", None)
    types = {v: t.lower() for v, t in re.findall(r"\(objectType (\?\w+) (\w+?)Type\)", goal)}
    toggle_vars = set(re.findall(r"\(toggleable (\?\w+)\)", goal))
    lamp = next((t for v, t in types.items() if v in toggle_vars), "")
    objects = [t for v, t in types.items() if v not in toggle_vars]
    recep = re.search(r"\(receptacleType \?\w+ (\w+?)Type\)", goal)
    if objects:
        target = objects[0]
    else:  # an unexpected goal form: the walkthrough still says what is picked up
        takes = _matches(rf"take ({_NAME}) from {_NAME}", walkthrough)
        target = kind_of(takes[0][0]) if takes else ""
    appliance = ""
    if task_type in TRANSFORMS:
        verb = TRANSFORMS[task_type][0]
        appliance = next(iter(_matches(rf"{verb} {_NAME} with ({_NAME})", walkthrough)), ("",))[0]
    elif lamp:
        appliance = next(iter(_matches(rf"use ({_NAME})", walkthrough)), ("",))[0]
    return GameFacts(
        task_type=task_type,
        walkthrough=walkthrough,
        target=target,
        count=2 if task_type == "pick_two_obj_and_place" else 1,
        goal_receptacle=recep.group(1).lower() if recep else "",
        lamp=lamp,
        appliance=appliance,
        locations={k: tuple(v) for k, v in sorted(locations.items())},
        receptacles=frozenset(receptacles),
        openable=frozenset(openable),
    )


# ---------------------------------------------------------------- what the agent did


@dataclass
class EpisodeReplay:
    """The agent's episode read back from its actions and the environment's feedback."""

    visits: list[tuple[int, str]] = field(default_factory=list)  # (step, receptacle arrived at)
    takes: list[tuple[int, str, str]] = field(default_factory=list)  # (step, object, receptacle)
    moves: list[tuple[int, str, str]] = field(default_factory=list)  # (step, object, receptacle)
    transforms: list[tuple[int, str, str, str]] = field(default_factory=list)  # (step, verb, object, appliance)
    lamp_uses: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)  # (step, lamp, held objects)
    opens: list[tuple[int, str]] = field(default_factory=list)
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)  # object -> (first step seen, where)
    location_at: list[str] = field(default_factory=list)  # where the agent was when it took each step's action
    invalid: list[int] = field(default_factory=list)  # steps whose response broke the format
    no_effect: list[int] = field(default_factory=list)  # well-formed actions answered "Nothing happens."
    # (action, times) for actions that got the same feedback more than once: a loop, as the observation repeats
    loops: list[tuple[str, int]] = field(default_factory=list)


def replay(steps: Sequence[Step]) -> EpisodeReplay:
    r = EpisodeReplay()
    here, held = "", []
    pairs: Counter[tuple[str, str]] = Counter()
    for t, s in enumerate(steps, 1):
        r.location_at.append(here)
        fb = s.feedback.strip()
        if not s.valid:
            r.invalid.append(t)
        elif fb == NOTHING:
            r.no_effect.append(t)
        if s.valid:
            pairs[(s.action, fb)] += 1
        if m := _ARRIVE.match(fb):
            here = m.group(1)
            r.visits.append((t, here))
        elif m := _OPEN.match(fb):
            r.opens.append((t, m.group(1)))
        elif m := _TAKE.match(fb):
            r.takes.append((t, m.group(1), m.group(2)))
            held.append(m.group(1))
        elif m := _MOVE.match(fb):
            r.moves.append((t, m.group(1), m.group(2)))
            held = [o for o in held if o != m.group(1)]
        elif m := _TRANSFORM.match(fb):
            r.transforms.append((t, m.group(1), m.group(2), m.group(3)))
        elif m := _TURN_ON.match(fb):
            r.lamp_uses.append((t, m.group(1), tuple(held)))
        if _ARRIVE.match(fb) or _OPEN.match(fb):
            for obj in re.findall(r"\b(?:a|an) ([a-z]+ \d+)", fb):
                r.seen.setdefault(obj, (t, here))
    first: dict[str, int] = {}
    for t, s in enumerate(steps, 1):
        first.setdefault(s.action, t)
    repeated: Counter[str] = Counter()
    for (action, _), c in pairs.items():
        if c >= 2:
            repeated[action] += c
    r.loops = sorted(repeated.items(), key=lambda x: (-x[1], first[x[0]]))
    return r


# ---------------------------------------------------------------- the skill


def _route(actions: list[tuple[int, str, str]]) -> list[str]:
    """(step, location, action) -> commands with a `go to` wherever the location changes."""
    out, here = [], ""
    for _, loc, act in sorted(actions):
        if loc and loc != here:
            out.append(f"go to {loc}")
            here = loc
        out.append(act)
    return out


def effective_route(steps: Sequence[Step], facts: GameFacts, r: EpisodeReplay) -> list[str]:
    """The actions of a won episode that achieved the goal, in order, each preceded by where it happened.

    Kept: the last take of each delivered (or examined) target object, its heat/cool/clean, its final move
    into a goal receptacle, the last lamp use, and the last opening of each receptacle taken from or moved to
    before that action. Searching detours, wrong objects and repeats are dropped.
    """
    delivered = [o for _, o, rec in r.moves if kind_of(o) == facts.target and kind_of(rec) == facts.goal_receptacle]
    if facts.lamp:
        delivered = [o for _, _, held in r.lamp_uses[-1:] for o in held if kind_of(o) == facts.target]
        if not delivered:  # lamp turned on first, object picked up next (the walkthrough's own order)
            delivered = [o for _, o, _ in r.takes if kind_of(o) == facts.target][-1:]
    kept: dict[int, str] = {}  # step -> the receptacle it takes from or moves to ("" for none)
    for obj in dict.fromkeys(delivered):
        takes = [(t, rec) for t, o, rec in r.takes if o == obj]
        transforms = [(t, "") for t, _, o, _ in r.transforms if o == obj]
        moves = [(t, rec) for t, o, rec in r.moves if o == obj and kind_of(rec) == facts.goal_receptacle]
        kept.update(takes[-1:] + transforms[-1:] + moves[-1:])
    kept.update((t, "") for t, _, _ in r.lamp_uses[-1:])
    for t, rec in list(kept.items()):
        opened = [u for u, rr in r.opens if rr == rec and u < t]
        if opened:
            kept.setdefault(opened[-1], "")
    return _route([(t, r.location_at[t - 1], steps[t - 1].action) for t in kept])


def _rule(facts: GameFacts, where: str) -> str:
    """The task type's decision rule, with this game's object, appliance and target receptacle."""
    obj, rec = facts.target, facts.goal_receptacle
    find = f"find {_article(obj)} first ({where})" if where else f"find {_article(obj)} first"
    if facts.task_type in TRANSFORMS:
        verb, kind = TRANSFORMS[facts.task_type]
        appliance = facts.appliance or f"{kind} 1"
        return f"{find}, take it, {verb} it with {appliance} while holding it, and only then move it to {_article(rec)}"
    if facts.lamp:
        lamp = facts.appliance or f"{facts.lamp} 1"
        place = _join(list(facts.locations.get(lamp, ())))
        at = f" (at {place})" if place else ""
        return (
            f"{find}, take it, and turn on {lamp}{at} with 'use {lamp}' while you are next to it; the task is "
            f"done when you hold the {obj} beside the lit {facts.lamp}"
        )
    if facts.count == 2:
        return (
            f"{find}, take it and move it to {_article(rec)}, then go back for a second {obj} and move "
            f"it to the same {rec}; you can carry only one at a time"
        )
    return f"{find}, take it, then go straight to {_article(rec)} and move it there"


def _where_expert_takes(facts: GameFacts) -> str:
    takes = facts.expert_takes
    return _join([f"{o} at {rec}" for o, rec in takes]) if takes else ""


def _other_instances(facts: GameFacts, visible: frozenset[str] | None) -> str:
    taken = {o for o, _ in facts.expert_takes}
    others = [f"{o} at {rec}" for o, rec in facts.instances_of(facts.target, visible) if o not in taken]
    if not others:
        return ""
    more = f" and {len(others) - _LIST_MAX} more" if len(others) > _LIST_MAX else ""
    return f"; other instances: {', '.join(others[:_LIST_MAX])}{more}"


def _open_note(facts: GameFacts) -> str:
    closed = [rec for _, rec in facts.expert_takes if rec in facts.openable]
    return f" ({_join(list(dict.fromkeys(closed)))} must be opened first)" if closed else ""


def _format_note(r: EpisodeReplay) -> str:
    if not r.invalid:
        return ""
    steps = ", ".join(str(t) for t in r.invalid[: _LIST_MAX * 2]) + (", ..." if len(r.invalid) > _LIST_MAX * 2 else "")
    return (
        f"{len(r.invalid)} response(s) broke the format (step {steps}): always reason inside <think></think> "
        f"and give exactly one admissible action inside <action></action>."
    )


def _loop_note(r: EpisodeReplay) -> str:
    if not r.loops:
        return ""
    said = "; ".join(f"{_quote(a)} {c} times" for a, c in r.loops[: _LIST_MAX - 1])
    return (
        f"You repeated {said} with the same result: when an observation repeats, do something new (a "
        "receptacle you have not checked yet)."
    )


def _no_effect_note(r: EpisodeReplay) -> str:
    if not r.no_effect:
        return ""
    return (
        f'{len(r.no_effect)} action(s) got "Nothing happens.": pick actions only from the admissible list '
        "(you must be at a receptacle, and holding the object, to use it there)."
    )


def _visible(steps: Sequence[Step]) -> frozenset[str] | None:
    """Receptacles the agent could go to (from the first step's admissible actions); None when unknown."""
    if not steps:
        return None
    gos = [a[len("go to ") :] for a in steps[0].admissible_actions if a.startswith("go to ")]
    return frozenset(gos) or None


def _progress(facts: GameFacts, r: EpisodeReplay) -> tuple[str, str, str]:
    """(stage, core mistake as a rule, what happened) for a failed episode, from the first goal milestone it
    missed. Stages in goal order: find, take, transform, lamp, second, place, other."""
    obj, rec = facts.target, facts.goal_receptacle
    took = [o for _, o, _ in r.takes if kind_of(o) == obj]
    if not took:
        seen = sorted((t, o, w) for o, (t, w) in r.seen.items() if kind_of(o) == obj)
        if seen:
            t, o, w = seen[0]
            return (
                "take",
                f"Take the {obj} as soon as you see it: {o} was in view at {w or 'the start'} (step {t}) "
                "and you never picked it up",
                f"it saw {o} at {w} but never took {_article(obj)}",
            )
        return (
            "find",
            f"Go first to where the {obj} is; searching other receptacles was the core mistake",
            f"it never found {_article(obj)}",
        )
    if facts.task_type in TRANSFORMS:
        verb, kind = TRANSFORMS[facts.task_type]
        if not [o for _, v, o, _ in r.transforms if v == verb and kind_of(o) == obj]:
            appliance = facts.appliance or f"{kind} 1"
            early = [rr for _, o, rr in r.moves if kind_of(o) == obj and kind_of(rr) == rec]
            pre = f"; you put it on {early[0]} before it was {_PAST[verb]}" if early else ""
            return (
                "transform",
                f"After taking the {obj}, {verb} it with {appliance} ('{verb} {took[-1]} with "
                f"{appliance}') before placing it{pre}",
                f"it took {took[-1]} but never {_PAST[verb]} it",
            )
    if facts.lamp:
        lamp = facts.appliance or f"{facts.lamp} 1"
        if not r.lamp_uses:
            return (
                "lamp",
                f"Once you hold the {obj}, go to {lamp} and turn it on with 'use {lamp}'; you never "
                f"turned on {_article(facts.lamp)}",
                f"it took {took[-1]} but never used the {facts.lamp}",
            )
        return (
            "lamp",
            f"Hold the {obj} next to the lit {lamp} at the end: turning it on and then walking away, or "
            f"putting the {obj} down, does not count",
            f"it used the {facts.lamp} but did not end holding the {obj} beside it",
        )
    placed = [(o, rr) for _, o, rr in r.moves if kind_of(o) == obj]
    good = list(dict.fromkeys(o for o, rr in placed if kind_of(rr) == rec))
    if facts.count == 2 and len(good) == 1:
        return (
            "second",
            f"After placing the first {obj}, go back for a second, different {obj} and move it to the same {rec}",
            f"it placed only one {obj} ({good[0]}) in {_article(rec)}",
        )
    if not good:
        elsewhere = [rr for _, rr in placed if kind_of(rr) != rec]
        if elsewhere:
            return (
                "place",
                f"Put the {obj} in {_article(rec)}, not in {elsewhere[0]}: only {_article(rec)} completes the task",
                f"it put the {obj} in {elsewhere[0]} instead of {_article(rec)}",
            )
        return (
            "place",
            f"After taking the {obj}, go to {_article(rec)}{_plan_place(facts)} and move it there",
            f"it took {took[-1]} but never put it in {_article(rec)}",
        )
    return (
        "other",
        "Follow the plan's order and finish every sub-goal before the step limit",
        "it reached the sub-goals but not in a way that completed the task",
    )


def _plan_place(facts: GameFacts) -> str:
    moves = _matches(rf"move {_NAME} to ({_NAME})", facts.walkthrough)
    return f" ({moves[-1][0]} in the plan)" if moves else ""


def _needs(facts: GameFacts) -> str:
    """What the rest of the task needs once the object is in hand: the appliance, lamp or receptacle."""
    obj, rec = facts.target, facts.goal_receptacle
    if facts.task_type in TRANSFORMS:
        verb, kind = TRANSFORMS[facts.task_type]
        return (
            f"Then {verb} it with {facts.appliance or kind + ' 1'} and move it to {_article(rec)}{_plan_place(facts)}."
        )
    if facts.lamp:
        lamp = facts.appliance or f"{facts.lamp} 1"
        place = _join(list(facts.locations.get(lamp, ())))
        return f"Then turn on {lamp}{f' (at {place})' if place else ''} with 'use {lamp}' while holding it."
    if facts.count == 2:
        return f"Move two {obj}s, one at a time, to the same {rec}{_plan_place(facts)}."
    return f"Then move it to {_article(rec)}{_plan_place(facts)}."


def _first_divergence(steps: Sequence[Step], plan: Sequence[str]) -> str:
    for t, (s, expert) in enumerate(zip(steps, plan), 1):
        if s.action != expert:
            return f"the first step off the expert plan was step {t}: {_quote(s.action)} instead of '{expert}'"
    if len(steps) < len(plan):
        return f"the episode ended after {len(steps)} step(s), before the expert plan was complete"
    return ""


def _detours(r: EpisodeReplay, needed: set[str]) -> list[str]:
    return list(dict.fromkeys(rec for _, rec in r.visits if rec not in needed))


def success_answer(traj: Trajectory, facts: GameFacts, max_chars: int | None = None) -> dict[str, str]:
    r = replay(traj.steps)
    route = effective_route(traj.steps, facts, r) or list(facts.walkthrough)
    took = _matches(rf"take ({_NAME}) from ({_NAME})", route)
    where = _join([f"{o} was at {w}" for o, w in took]) or _where_expert_takes(facts)
    needed = {a[len("go to ") :] for a in route if a.startswith("go to ")}
    detours = _detours(r, needed)
    parts = [f"To {traj.task.rstrip('.')}: {', '.join(route)}.", f"Rule: {_rule(facts, where)}."]
    if len(traj.steps) > len(route):
        skip = f" Skip the detours to {_join(detours[:_LIST_MAX])}." if detours else ""
        parts.append(f"This route needs {len(route)} actions; the episode took {len(traj.steps)}.{skip}")
    if note := _format_note(r):
        parts.append(note)
    summary = [
        f"Success in {len(traj.steps)} step(s), {len(r.invalid)} invalid-format step(s), "
        f"{len(r.no_effect)} action(s) with no effect.",
        f"Effective route: {', '.join(route)}.",
    ]
    return budgeted_answer(summary, parts, max_chars)


def failure_answer(traj: Trajectory, facts: GameFacts, max_chars: int | None = None) -> dict[str, str]:
    r = replay(traj.steps)
    where = _where_expert_takes(facts)
    stage, core, happened = _progress(facts, r)
    expert_recs = {a[len("go to ") :] for a in facts.walkthrough if a.startswith("go to ")}
    detours = _detours(r, expert_recs)
    format_first = bool(r.invalid) and len(r.invalid) * 2 >= len(traj.steps)
    parts = []
    if format_first:
        parts.append(f"Answer in the required format first: {_format_note(r)}")
    if stage == "find" and detours and facts.expert_takes:
        # The core mistake is the search itself: say where to go instead, by name.
        places = _join(list(dict.fromkeys(rec for _, rec in facts.expert_takes)))
        parts.append(
            f"Do not search {_join(detours[:_LIST_MAX])} first: the {facts.target} is at {places}; go there first."
        )
    else:
        parts.append(f"{core}.")
    wrong = list(dict.fromkeys(o for _, o, _ in r.takes if kind_of(o) != facts.target))
    if wrong:
        parts.append(
            f"You picked up {_join(wrong[:_LIST_MAX])}, which is not {_article(facts.target)}: take only "
            f"{_article(facts.target)}."
        )
    parts.append(
        f"Where things are: {where or 'see the plan'}{_other_instances(facts, _visible(traj.steps))}"
        f"{_open_note(facts)}."
    )
    if stage in ("find", "take"):
        parts.append(_needs(facts))
    if facts.walkthrough:
        parts.append(f"Plan that works: {', '.join(facts.walkthrough)}.")
    if sign := _first_divergence(traj.steps, facts.walkthrough):
        parts.append(f"Warning sign: {sign}.")
    parts += [note for note in (_loop_note(r), _no_effect_note(r)) if note]
    if r.invalid and not format_first:
        parts.append(_format_note(r))
    visited = _join(list(dict.fromkeys(rec for _, rec in r.visits))[: _LIST_MAX * 2]) or "nothing"
    summary = [
        f"Failure after {len(traj.steps)} step(s), {len(r.invalid)} invalid-format step(s), "
        f"{len(r.no_effect)} action(s) with no effect.",
        f"True location: {where or 'unknown'}.",
        f"Visited {visited}; {happened}.",
    ]
    if r.loops:
        summary.append(f"Most repeated: {_quote(r.loops[0][0])} x{r.loops[0][1]}.")
    return budgeted_answer(summary, parts, max_chars)


# ---------------------------------------------------------------- the teacher


class OracleTeacher:
    """Hindsight skills for ALFWorld trajectories from the game files under `data_root` (no model, no network).

    Used through `seed_core.method.skills.analyze`, which hands it the Trajectory records (`complete_trajectories`)
    instead of analyzer prompts. Game files are read once per game id.
    """

    name = "oracle"

    def __init__(self, data_root: str | Path, max_chars: int | None = None):
        self.data_root = Path(data_root)
        self.max_chars = max_chars  # skill budget (the summary gets half), whole sentences; None: no limit
        self.stats = TeacherStats()
        self._facts: dict[str, GameFacts] = {}

    def game_facts(self, game_id: str, task_type: str) -> GameFacts:
        if game_id not in self._facts:
            path = game_path(self.data_root, game_id)
            if not path.is_file():
                raise DataError(
                    f"the oracle teacher needs game file {path}, which does not exist; {how_to_install(self.data_root)}"
                )
            self._facts[game_id] = read_game_facts(path, task_type)
        return self._facts[game_id]

    def analyze_trajectory(self, traj: Trajectory) -> str:
        """The JSON answer for one trajectory: byte-identical for the same trajectory."""
        facts = self.game_facts(traj.game_id, traj.task_type)
        answer = (success_answer if traj.won else failure_answer)(traj, facts, self.max_chars)
        return json.dumps(answer, ensure_ascii=False)

    def complete_trajectories(self, trajectories: Sequence[Trajectory]) -> list[TeacherAnswer | None]:
        """One answer per trajectory, in order (never None: the oracle always answers)."""
        return oracle_answers(self, trajectories)
