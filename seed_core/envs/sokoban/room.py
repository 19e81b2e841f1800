"""Sokoban rooms: gym-sokoban's rules and room generator (as verl-agent uses them), and a BFS solver.

Rules (gym-sokoban's `SokobanEnv` with its PUSH actions 1-4, which are the only moves verl-agent plays):
- Tiles: 0 wall, 1 floor, 2 target, 3 box on target, 4 box, 5 player (6, player on a target, only renders).
  A `Room` keeps the fixed part (walls, floor, targets) apart from the boxes and the player.
- A move: if the next cell holds a box and the cell beyond is floor or target (inside the grid), the box is
  pushed and the player follows; otherwise the player moves if the next cell is floor or target; otherwise
  nothing moves. Boxes are never pulled.
- Reward of a step (`_calc_reward`): -0.1, plus 1 when the number of boxes on targets goes up, minus 1 when it
  goes down. The room is won when every box is on a target.

Generator (gym-sokoban's `generate_room`, with verl-agent's settings and changes):
1. topology: a random walk of int(1.7 * (rows + cols)) steps (verl-agent's `num_gen_steps`) that changes
   direction with probability 0.35 and stamps one of five 3x3 floor masks at each position; the border is
   wall;
2. the player, then one target per box, on distinct random floor cells;
3. reverse play from the solved state (every box on its target): a depth-first search whose moves walk the
   player and pull the box behind it, to depth `SEARCH_DEPTH` (verl-agent's `search_depth: 30`, counted as
   gym's `ttl`), each state searched once (the first time it is reached), at most `MAX_EXPLORED` states;
4. the reached state with the highest score box_swaps * (sum of the boxes' Manhattan distances from their own
   targets) becomes the room, where box_swaps counts how often the pulled box changed along the search path
   and a state with a box or the player on a target scores 0; a best score of 0 rejects the try;
5. verl-agent's extra walk: with probability 0.8 (total displacement 1) or 0.5, the player then walks 1-3
   random steps onto free cells not visited yet, continuing each time with probability 0.5, so it does not
   always start next to the box it last pulled.
Only pulls reverse a push and a player walk is reversible, so every generated room is solvable.

Departures:
- Randomness is `np.random.default_rng(seed)` alone, so a seed gives the same room on every machine and in
  every process (gym draws from the global `random` / `np.random`); rooms are not those gym gives a seed.
- The +10 finish bonus is not part of `Room.step`'s reward: the caller adds its configured win reward.
- No room within `tries`: a `GenerationError` naming the seed. verl-agent retries with the seed
  `hash(str(seed))`, which changes with PYTHONHASHSEED. Too few floor cells (gym's RuntimeError) is a failed try.
- Actions are the words up / down / left / right; any other string is a no-op costing the step penalty
  (gym's action 0, verl-agent's invalid action).
- The image is drawn here (a sprite per tile, tile-aligned), not gym-sokoban's PNG surfaces.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
ACTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
"""The moves, in gym-sokoban's order (its push actions 1-4), as (row, col) changes; row 0 is the top."""
SYMBOLS = {WALL: "#", FLOOR: "_", TARGET: "O", BOX_ON_TARGET: "√", BOX: "X", PLAYER: "P", PLAYER_ON_TARGET: "S"}
"""verl-agent's text symbols of each tile code."""

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0

P_CHANGE_DIRECTIONS = 0.35
SEARCH_DEPTH = 30
MAX_EXPLORED = 300_000
_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=bool,
)
_WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))


class GenerationError(ValueError):
    """Room parameters that cannot work, or a seed that gave no room; the message says which and what to do."""


Cell = tuple[int, int]


@dataclass(frozen=True)
class Room:
    """One Sokoban state: walls, floor and targets (`fixed`, int8 HxW), the boxes (sorted) and the player.

    Immutable: `step` returns the next Room. Equal rooms compare equal and hash alike."""

    fixed: np.ndarray
    boxes: tuple[Cell, ...]
    player: Cell

    def __post_init__(self) -> None:
        fixed = np.array(self.fixed, dtype=np.int8)
        if fixed.ndim != 2 or 0 in fixed.shape:
            raise ValueError(f"Room.fixed must be a non-empty 2-D grid, got shape {fixed.shape}")
        if not np.isin(fixed, (WALL, FLOOR, TARGET)).all():
            raise ValueError("Room.fixed holds walls (0), floor (1) and targets (2) only; boxes and player go apart")
        boxes = tuple(sorted((int(r), int(c)) for r, c in self.boxes))
        player = (int(self.player[0]), int(self.player[1]))
        h, w = fixed.shape
        for what, cell in [("player", player)] + [("box", b) for b in boxes]:
            if not (0 <= cell[0] < h and 0 <= cell[1] < w) or fixed[cell] == WALL:
                raise ValueError(f"Room: the {what} at {cell} is outside the grid or on a wall")
        if len(set(boxes)) != len(boxes) or player in boxes or not boxes:
            raise ValueError(f"Room: boxes {boxes} must be at least one, distinct, and not under the player {player}")
        if int((fixed == TARGET).sum()) != len(boxes):
            raise ValueError(f"Room: {int((fixed == TARGET).sum())} target(s) for {len(boxes)} box(es); give one each")
        fixed.setflags(write=False)
        object.__setattr__(self, "fixed", fixed)
        object.__setattr__(self, "boxes", boxes)
        object.__setattr__(self, "player", player)

    @classmethod
    def _unchecked(cls, fixed: np.ndarray, boxes: tuple[Cell, ...], player: Cell) -> Room:
        """A Room from parts already valid (read-only int8 `fixed`, sorted int boxes): the hot path of `step`."""
        room = object.__new__(cls)
        object.__setattr__(room, "fixed", fixed)
        object.__setattr__(room, "boxes", boxes)
        object.__setattr__(room, "player", player)
        return room

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Room):
            return NotImplemented
        return self.state_key() == other.state_key() and np.array_equal(self.fixed, other.fixed)

    def __hash__(self) -> int:
        return hash((self.fixed.shape, self.fixed.tobytes(), self.boxes, self.player))

    def _free(self, cell: Cell) -> bool:
        """Floor or target inside the grid (boxes not considered)."""
        h, w = self.fixed.shape
        return 0 <= cell[0] < h and 0 <= cell[1] < w and self.fixed[cell] != WALL

    def moved(self, action: str) -> Room:
        """The room after `action` (gym-sokoban's push semantics); this room itself when nothing moves."""
        if action not in ACTIONS:
            return self
        (dr, dc), (r, c) = ACTIONS[action], self.player
        nxt = (r + dr, c + dc)
        if not self._free(nxt):
            return self
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if not self._free(beyond) or beyond in self.boxes:
                return self
            boxes = tuple(sorted(beyond if b == nxt else b for b in self.boxes))
            return Room._unchecked(self.fixed, boxes, nxt)
        return Room._unchecked(self.fixed, self.boxes, nxt)

    def step(self, action: str) -> tuple[Room, float, bool]:
        """(next room, reward, won) for one action; the reward leaves out the finish bonus (the caller's)."""
        nxt = self.moved(action)
        before, after = self.boxes_on_target(), nxt.boxes_on_target()
        reward = STEP_PENALTY
        if after > before:
            reward += BOX_ON_TARGET_REWARD
        elif after < before:
            reward += BOX_OFF_TARGET_PENALTY
        return nxt, reward, nxt.won

    def boxes_on_target(self) -> int:
        return sum(1 for b in self.boxes if self.fixed[b] == TARGET)

    @property
    def won(self) -> bool:
        return self.boxes_on_target() == len(self.boxes)

    @property
    def targets(self) -> tuple[Cell, ...]:
        return tuple((int(r), int(c)) for r, c in np.argwhere(self.fixed == TARGET))

    def state_key(self) -> tuple[Cell, tuple[Cell, ...]]:
        """What changes during an episode: (player, boxes)."""
        return (self.player, self.boxes)

    def sha256(self) -> str:
        """Hex digest of the layout: shape, fixed tiles, boxes and player (little-endian int64 coordinates)."""
        h = hashlib.sha256()
        h.update(np.array(self.fixed.shape, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.fixed).tobytes())
        h.update(np.array(self.boxes, dtype="<i8").reshape(-1, 2).tobytes())
        h.update(np.array(self.player, dtype="<i8").tobytes())
        return h.hexdigest()

    def tiles(self) -> np.ndarray:
        """The rendered tile codes (HxW int8): gym-sokoban's, with 6 for the player on a target."""
        grid = self.fixed.copy()
        for b in self.boxes:
            grid[b] = BOX_ON_TARGET if self.fixed[b] == TARGET else BOX
        grid[self.player] = PLAYER_ON_TARGET if self.fixed[self.player] == TARGET else PLAYER
        return grid

    def text(self) -> str:
        """verl-agent's symbols, one row per line, separated by single spaces (each symbol its own token)."""
        return "\n".join(" ".join(SYMBOLS[int(v)] for v in row) for row in self.tiles())

    def rgb(self, tile: int = 16) -> np.ndarray:
        """The room as an image (H*tile, W*tile, 3) uint8, each tile's pixels a function of its code alone."""
        return tiles_rgb(self.tiles(), tile)


def tiles_rgb(tiles: np.ndarray, tile: int = 16) -> np.ndarray:
    """(H, W) tile codes -> (H*tile, W*tile, 3) uint8 image."""
    h, w = tiles.shape
    return _sprites(tile)[tiles].transpose(0, 2, 1, 3, 4).reshape(h * tile, w * tile, 3)


def text_tiles(text: str) -> np.ndarray:
    """`Room.text()` back to its (H, W) tile codes; a symbol that is not a tile's is a ValueError."""
    codes = {sym: code for code, sym in SYMBOLS.items()}
    rows = [line.split(" ") for line in text.strip("\n").split("\n")]
    if len({len(r) for r in rows}) != 1 or any(c not in codes for r in rows for c in r):
        raise ValueError(f"not a Sokoban grid (rows of {''.join(codes)} separated by single spaces): {text!r}")
    return np.array([[codes[c] for c in r] for r in rows], dtype=np.int8)


def room_from_text(text: str) -> Room:
    """The Room a stored observation (`Room.text()`) shows: what the solver needs to judge a step's state."""
    tiles = text_tiles(text)
    boxes = tuple((int(r), int(c)) for r, c in np.argwhere(np.isin(tiles, (BOX, BOX_ON_TARGET))))
    (player,) = [(int(r), int(c)) for r, c in np.argwhere(np.isin(tiles, (PLAYER, PLAYER_ON_TARGET)))]
    fixed = np.where(np.isin(tiles, (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)), TARGET, tiles)
    fixed = np.where(np.isin(fixed, (BOX, PLAYER)), FLOOR, fixed).astype(np.int8)
    return Room(fixed, boxes, player)


def grid_rgb(text: str, tile: int = 16) -> np.ndarray:
    """The image of a stored observation (`Room.text()`): steps keep the grid text, images are redrawn from it."""
    return tiles_rgb(text_tiles(text), tile)


@lru_cache(maxsize=8)
def _sprites(tile: int) -> np.ndarray:
    """(7, tile, tile, 3) uint8: wall bricks, plain floor, a target ring, boxes (a framed square with a cross,
    green when on a target), the player (a disk; smaller on a target, so the ring shows)."""
    if not isinstance(tile, int) or tile < 4:
        raise ValueError(f"rgb: tile must be an int >= 4 pixels, got {tile!r}")
    yy, xx = np.mgrid[0:tile, 0:tile]
    mid = (tile - 1) / 2
    dist = np.hypot(yy - mid, xx - mid)
    floor_rgb, ring_rgb, edge_rgb = (226, 220, 200), (200, 40, 40), (90, 55, 20)

    def plain(rgb: tuple[int, int, int]) -> np.ndarray:
        return np.broadcast_to(np.array(rgb, dtype=np.uint8), (tile, tile, 3)).copy()

    brick_h, brick_w = max(tile // 4, 2), max(tile // 2, 2)
    row = yy // brick_h
    mortar = (yy % brick_h == brick_h - 1) | ((xx + (row % 2) * (brick_w // 2)) % brick_w == brick_w - 1)
    wall = plain((150, 70, 45))
    wall[mortar] = (100, 95, 90)

    floor = plain(floor_rgb)
    target = plain(floor_rgb)
    target[(dist <= tile * 0.40) & (dist >= tile * 0.25)] = ring_rgb

    margin, border = max(tile // 8, 1), max(tile // 8, 1)
    inside = (yy >= margin) & (yy < tile - margin) & (xx >= margin) & (xx < tile - margin)
    core = (yy >= margin + border) & (yy < tile - margin - border) & (xx >= margin + border)
    core &= xx < tile - margin - border
    cross = core & ((np.abs(yy - xx) < 1) | (np.abs(yy + xx - (tile - 1)) < 1))

    def box_sprite(fill: tuple[int, int, int]) -> np.ndarray:
        img = plain(floor_rgb)
        img[inside] = edge_rgb
        img[core] = fill
        img[cross] = edge_rgb
        return img

    player = plain(floor_rgb)
    player[dist <= tile * 0.34] = (40, 90, 200)
    player_on_target = target.copy()
    player_on_target[dist <= tile * 0.2] = (40, 90, 200)
    out = np.stack(
        [wall, floor, target, box_sprite((80, 170, 70)), box_sprite((185, 125, 55)), player, player_on_target]
    )
    out.setflags(write=False)
    return out


# ---------------------------------------------------------------- generation


def _plural(n: int) -> str:
    return f"{n} box" if n == 1 else f"{n} boxes"


def check_room_params(dim, num_boxes) -> tuple[int, int]:
    """(rows, cols) when `dim` and `num_boxes` can make rooms, else a GenerationError naming the parameter.

    Each side needs at least 5 cells (a 3x3 interior inside the walls: a box needs a free cell on both sides
    to be pushed), and the interior needs three cells per box (its target, the box, room to push it)."""
    if (
        isinstance(dim, (str, bytes))
        or not hasattr(dim, "__len__")
        or len(dim) != 2
        or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dim)
    ):
        raise GenerationError(f"params: `env.sokoban.dim` must be [rows, cols] (two integers), got {dim!r}")
    h, w = int(dim[0]), int(dim[1])
    if h < 5 or w < 5:
        raise GenerationError(
            f"params: `env.sokoban.dim` is {[h, w]}; each side must be >= 5 (walls included, so the interior is at "
            "least 3x3 and a box can be pushed)"
        )
    most = (h - 2) * (w - 2) // 3
    if not isinstance(num_boxes, (int, np.integer)) or isinstance(num_boxes, bool) or not 1 <= num_boxes <= most:
        raise GenerationError(
            f"params: `env.sokoban.boxes` is {num_boxes!r}; with env.sokoban.dim {[h, w]} it must be an integer from 1 "
            f"to {most} (a third of the {(h - 2) * (w - 2)} interior cells)"
        )
    return h, w


def generate_room(seed: int, dim: tuple[int, int] = (6, 6), num_boxes: int = 1, tries: int = 20) -> Room:
    """The room of `seed`: deterministic, solvable, no box on a target. See the module docstring for the steps."""
    h, w = check_room_params(dim, num_boxes)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise GenerationError(f"a room's seed must be a non-negative integer, got {seed!r}")
    if tries < 1:
        raise GenerationError(f"generate_room: tries must be >= 1, got {tries}")
    rng = np.random.default_rng(int(seed))
    for _ in range(tries):
        fixed = _topology(rng, h, w, int(1.7 * (h + w)))
        player = _place(rng, fixed, num_boxes)
        if player is None:
            continue
        found = _reverse_play(fixed, player)
        if found is None:
            continue
        boxes, player, displacement = found
        player = _wander(rng, fixed, boxes, player, 0.8 if displacement == 1 else 0.5)
        fixed.setflags(write=False)
        return Room._unchecked(fixed, tuple(sorted(boxes)), player)
    raise GenerationError(
        f"no solvable room for seed {seed} with dim {(h, w)} and {_plural(num_boxes)} within {tries} "
        f"{'try' if tries == 1 else 'tries'}; each random walk left too little floor to pull every box off its "
        "target. Use another seed, a larger env.sokoban.dim or fewer env.sokoban.boxes"
    )


def _topology(rng: np.random.Generator, h: int, w: int, num_steps: int) -> np.ndarray:
    """Walls (0) and floor (1): a random walk stamping 3x3 floor masks, border walls."""
    level = np.zeros((h, w), dtype=bool)
    change, new_dir, mask = rng.random(num_steps), rng.integers(4, size=num_steps), rng.integers(5, size=num_steps)
    dr, dc = _WALK_DIRECTIONS[rng.integers(4)]
    r, c = int(rng.integers(1, h)), int(rng.integers(1, w))
    for s in range(num_steps):
        if change[s] < P_CHANGE_DIRECTIONS:
            dr, dc = _WALK_DIRECTIONS[new_dir[s]]
        r, c = max(min(r + dr, h - 2), 1), max(min(c + dc, w - 2), 1)
        level[r - 1 : r + 2, c - 1 : c + 2] |= _MASKS[mask[s]]
    level[[0, h - 1], :] = False
    level[:, [0, w - 1]] = False
    return level.astype(np.int8)


def _place(rng: np.random.Generator, fixed: np.ndarray, num_boxes: int) -> Cell | None:
    """Puts `num_boxes` targets into `fixed` (in place) and returns the player's cell, all on distinct floor
    cells; None when there are not more floor cells than boxes + 1 (gym-sokoban's RuntimeError)."""
    free = [(int(r), int(c)) for r, c in np.argwhere(fixed == FLOOR)]
    if len(free) <= num_boxes + 1:
        return None
    player = free.pop(int(rng.integers(len(free))))
    for _ in range(num_boxes):
        fixed[free.pop(int(rng.integers(len(free))))] = TARGET
    return player


def _reverse_play(fixed: np.ndarray, player: Cell) -> tuple[list[Cell], Cell, int] | None:
    """gym-sokoban's reverse play from the solved state: (boxes, player, total displacement) of the best-scored
    state, or None when the best score is 0. Depth-first in pull order up, down, left, right; a state (player
    and boxes, a box that has moved told apart from one that has not, as gym's room array does) is searched
    the first time it is reached only."""
    h, w = fixed.shape
    flat = fixed.ravel()
    wall = (flat == WALL).tolist()
    targets = tuple(int(i) for i in np.flatnonzero(flat == TARGET))
    on_target = set(targets)
    steps = (-w, w, -1, 1)
    explored: set = set()
    best_score, best = -1, None
    # (player, boxes by their target's index, moved-bit mask, last pulled box, box swaps, depth)
    stack = [(player[0] * w + player[1], targets, 0, -1, 0, 0)]
    while stack:
        p, boxes, moved, last, swaps, depth = stack.pop()
        if depth >= SEARCH_DEPTH - 1 or len(explored) >= MAX_EXPLORED:
            continue  # gym's `ttl` runs out at depth SEARCH_DEPTH - 1
        key = (p, tuple(sorted(2 * b + (moved >> i & 1) for i, b in enumerate(boxes))))
        if key in explored:
            continue
        explored.add(key)
        if p in on_target or any(b in on_target for b in boxes):
            score = 0
        else:
            score = swaps * sum(abs(b // w - t // w) + abs(b % w - t % w) for b, t in zip(boxes, targets))
        if score > best_score:
            best_score, best = score, (p, boxes)
        for d in reversed(steps):  # pushed in reverse so that `up` is searched first
            n = p + d
            if wall[n] or n in boxes:
                continue
            behind = p - d
            if behind in boxes:
                i = boxes.index(behind)
                pulled = boxes[:i] + (p,) + boxes[i + 1 :]
                stack.append((n, pulled, moved | 1 << i, i, swaps + (last != i), depth + 1))
            else:
                stack.append((n, boxes, moved, last, swaps, depth + 1))
    if best_score <= 0:
        return None
    p, boxes = best
    displacement = sum(abs(b // w - t // w) + abs(b % w - t % w) for b, t in zip(boxes, targets))
    return [(b // w, b % w) for b in boxes], (p // w, p % w), displacement


def _wander(rng: np.random.Generator, fixed: np.ndarray, boxes: list[Cell], player: Cell, p_move: float) -> Cell:
    """verl-agent's random player walk after reverse play: 1-3 steps onto free cells not visited yet."""
    if rng.random() > p_move:
        return player
    visited, blocked = [player], set(boxes)
    for step in range(3):
        options = []
        for dr, dc in ACTIONS.values():
            n = (player[0] + dr, player[1] + dc)
            if fixed[n] != WALL and n not in blocked and n not in visited:
                options.append(n)
        if not options:
            break
        player = options[int(rng.integers(len(options)))]
        visited.append(player)
        if step == 2 or rng.random() > 0.5:
            break
    return player


# ---------------------------------------------------------------- solving


def search(room: Room, max_states: int = 200_000) -> tuple[list[str] | None, bool]:
    """Breadth-first search over (player, boxes): (a shortest plan, True), (None, True) when no plan exists, or
    (None, False) when more than `max_states` states were reached first (undecided). Pushes onto cells from
    which a box can reach no target even alone (simple dead squares) are pruned; that loses no solution."""
    if room.won:
        return [], True
    h, w = room.fixed.shape
    stride = w + 2  # a wall border around the grid, so hand-made rooms without one stay inside
    padded = np.zeros((h + 2, stride), dtype=np.int8)
    padded[1:-1, 1:-1] = room.fixed
    flat = padded.ravel()
    wall = (flat == WALL).tolist()
    targets = frozenset(int(i) for i in np.flatnonzero(flat == TARGET))
    live = _live_cells(wall, targets, stride)
    moves = [(name, dr * stride + dc) for name, (dr, dc) in ACTIONS.items()]

    def index(cell: Cell) -> int:
        return (cell[0] + 1) * stride + cell[1] + 1

    start = (index(room.player), tuple(sorted(index(b) for b in room.boxes)))
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        p, boxes = state
        for name, d in moves:
            n = p + d
            if wall[n]:
                continue
            if n in boxes:
                beyond = n + d
                if wall[beyond] or beyond in boxes or beyond not in live:
                    continue
                nboxes = tuple(sorted(beyond if b == n else b for b in boxes))
            else:
                nboxes = boxes
            nxt = (n, nboxes)
            if nxt in parent:
                continue
            parent[nxt] = (state, name)
            if nboxes is not boxes and all(b in targets for b in nboxes):
                plan = []
                while parent[nxt] is not None:
                    nxt, name = parent[nxt]
                    plan.append(name)
                return plan[::-1], True
            if len(parent) > max_states:
                return None, False
            queue.append(nxt)
    return None, True


def _live_cells(wall: list[bool], targets: frozenset[int], stride: int) -> set[int]:
    """Cells from which a lone box can be pushed onto some target: pull it back from every target."""
    live, todo = set(targets), list(targets)
    while todo:
        b = todo.pop()
        for d in (-stride, stride, -1, 1):
            prev, player = b - d, b - 2 * d  # a push by d moved the box from prev, the player stood at player
            if 0 <= player < len(wall) and not wall[prev] and not wall[player] and prev not in live:
                live.add(prev)
                todo.append(prev)
    return live


def solve(room: Room, max_states: int = 200_000) -> list[str] | None:
    """A shortest plan (every move counts) that wins `room`: [] if already won, None if none exists or if the
    search gave up after `max_states` states (use `search` to tell the two apart)."""
    return search(room, max_states)[0]


def is_solvable(room: Room, max_states: int = 200_000) -> bool:
    """Whether `solve` finds a plan (False also when the search gives up: see `search`)."""
    return solve(room, max_states) is not None


# ---------------------------------------------------------------- step labels (the credit probe's ground truth)

STEP_LABELS = ("optimal", "wasted", "fatal", "lost")
"""The solver's verdict on one move (`step_labels`)."""


def step_labels(room: Room, actions: Sequence[str | None], max_states: int = 200_000) -> list[str]:
    """The solver's verdict on each move of an episode played from `room`, one label per action:
    - `optimal`: the move shortens the shortest plan by one (the winning move included);
    - `wasted`: the room stays solvable and the plan is not shorter (a walk away, a bump, or an invalid answer:
      None or any word that is not a move, which the environment plays as a no-op);
    - `fatal`: the room was solvable before the move and is not after it (a push into a corner, say);
    - `lost`: the room was already unsolvable (a fatal move came earlier): nothing this move does matters.
    Actions after a win get no label (an episode ends on its win). A state the solver cannot decide within
    `max_states` is a ValueError naming it: no room of the supported sizes comes near that budget."""
    dist: dict = {}

    def plan_length(state: Room) -> int | None:
        key = state.state_key()
        if key not in dist:
            plan, decided = search(state, max_states)
            if not decided:
                raise ValueError(
                    f"step_labels: the solver gave up after {max_states} states on a room with boxes at "
                    f"{state.boxes}; raise max_states"
                )
            dist[key] = None if plan is None else len(plan)
        return dist[key]

    labels: list[str] = []
    state = room
    for action in actions:
        if state.won:
            break
        before = plan_length(state)
        nxt = state.moved(action)  # None or a non-move is the environment's no-op
        after = plan_length(nxt)
        if before is None:
            labels.append("lost")
        elif after is None:
            labels.append("fatal")
        elif after == before - 1:
            labels.append("optimal")
        else:
            labels.append("wasted")
        state = nxt
    return labels
