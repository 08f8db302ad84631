"""Deterministic task generators for the CPU testbed.

Two tasks, both plain-text prompt -> completion:

* ``arith``   -- multi-step arithmetic word problems; the completion is a worked solution ending in
  ``#### <answer>`` (GSM8K's format). Numbers are small (every value in ``[0, MAX_VALUE]``).
* ``summary`` -- a short news-like passage (key facts plus distractors) and a one-sentence summary
  in the style of XSum. Its ``reference`` lists every phrasing of the summary, one per line; the
  reward is the best ROUGE-2 F1 over them, so only the facts count, not the phrasing style.

Wording is sampled from several phrasing options at many *choice points* (openings, connectives,
equation phrasings, summary templates). A ``style`` names the weights over those options:

* ``"target"``  -- prefers the first option of every choice point (weights ~ 0.4^i),
* ``"draft"``   -- prefers the last option (the reverse order),
* ``"uniform"`` -- every option equally likely (used for the evaluation references).

The two models of the testbed are trained on the ``"target"`` and ``"draft"`` mixes, so they
disagree often on harmless wording while the numbers / facts are what the reward checks.

Train/test split [decision]: every example has a *canonical key* (the arithmetic skeleton --
start value and operations -- or the summary's event type and key facts; names and wording are
not part of it). An example is in the test split iff ``sha256(key) % TEST_MODULUS == 0``.
Generation samples with a seeded ``random.Random`` and keeps only keys of the requested split, so
the splits are disjoint for *any* seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

TASKS = ("arith", "summary")
STYLES = ("target", "draft", "uniform")
SPLITS = ("train", "test")

TEST_MODULUS = 5  # 1 in 5 canonical keys belongs to the test split.
MAX_VALUE = 60  # every intermediate value of an arith problem lies in [0, MAX_VALUE]
STYLE_DECAY = 0.4  # weight of option i is STYLE_DECAY**i ("target") or its reverse ("draft")

ARITH_PROMPT = "Question: {question}\nAnswer:"
SUMMARY_PROMPT = "Article: {passage}\nSummary:"


@dataclass(frozen=True)
class Example:
    """One generated example. ``completion`` starts with a space and follows ``prompt`` directly."""

    task: str
    prompt: str
    completion: str
    reference: str  # what the reward compares with: the solution (arith); every phrasing of the summary, one per line
    answer: str  # final number (arith); the sampled summary, i.e. the completion without its space (summary)
    key: str  # canonical content key used for the train/test split


# ----------------------------------------------------------------------------------------------
# helpers


def split_of(key: str) -> str:
    """``"test"`` iff ``sha256(key) % TEST_MODULUS == 0``, else ``"train"``."""
    digest = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return "test" if digest % TEST_MODULUS == 0 else "train"


def _style_weights(style: str, n: int) -> list[float]:
    if style == "uniform":
        return [1.0] * n
    weights = [STYLE_DECAY**i for i in range(n)]
    if style == "draft":
        weights.reverse()
    elif style != "target":
        raise ValueError(f"`style` is {style!r}; use one of {STYLES}.")
    return weights


def _pick(rng: random.Random, options: list[str] | tuple[str, ...], style: str) -> str:
    """A style-weighted choice among phrasing options."""
    return rng.choices(list(options), weights=_style_weights(style, len(options)))[0]


def _seeded_rng(seed: int, split: str, task: str) -> random.Random:
    # A string seed is hashed with sha512 by `random`, so it is stable across runs and platforms.
    return random.Random(f"diversed-testbed/{task}/{split}/{seed}")


# ----------------------------------------------------------------------------------------------
# arith

NAMES = [
    ("Tom", "he"),
    ("Ann", "she"),
    ("Ben", "he"),
    ("Lucy", "she"),
    ("Sam", "he"),
    ("Mia", "she"),
    ("Jack", "he"),
    ("Emma", "she"),
    ("Leo", "he"),
    ("Nora", "she"),
    ("Max", "he"),
    ("Lily", "she"),
    ("Omar", "he"),
    ("Zoe", "she"),
    ("Ravi", "he"),
    ("Ella", "she"),
    ("Ivan", "he"),
    ("Rosa", "she"),
    ("Paul", "he"),
    ("Kate", "she"),
    ("Noah", "he"),
    ("Sara", "she"),
    ("Finn", "he"),
    ("Maya", "she"),
]
OBJECTS = [
    "apples",
    "marbles",
    "stickers",
    "books",
    "pencils",
    "cookies",
    "coins",
    "shells",
    "stamps",
    "cards",
    "eggs",
    "flowers",
    "toys",
    "balloons",
    "candies",
    "rocks",
    "beads",
    "buttons",
    "crayons",
    "oranges",
    "cupcakes",
    "tickets",
    "seeds",
    "plums",
]
CONTAINERS = [("bags", "bag"), ("boxes", "box"), ("packs", "pack"), ("jars", "jar")]

# Question sentences: one tuple per action, one entry per question style (story, formal, casual).
Q_START = ("{N} has {s} {obj}.", "At the start, {N} owns {s} {obj}.", "{N} starts out with {s} {obj}.")
Q_ADD = [
    ("{Pc} buys {k} more {obj}.", "Later, {N} purchases {k} additional {obj}.", "Then {N} buys another {k}."),
    ("{Pc} finds {k} more {obj}.", "{N} subsequently finds {k} further {obj}.", "Oh, and {N} finds {k} more."),
    ("{F} gives {Po} {k} {obj}.", "{F} presents {N} with {k} {obj}.", "{F} hands over {k} more."),
]
Q_SUB = [
    ("{Pc} gives {k} {obj} to {F}.", "{N} then donates {k} {obj} to {F}.", "{N} gives {F} {k} of them."),
    ("{Pc} loses {k} {obj}.", "Unfortunately, {N} loses {k} {obj}.", "{k} of them get lost."),
    ("{Pc} uses {k} {obj}.", "{N} uses up {k} {obj}.", "{N} uses {k}."),
]
Q_MUL = {
    2: ("Then the number of {obj} {P} has doubles.", "The number of {obj} is then doubled.", "Then the pile doubles."),
    3: ("Then the number of {obj} {P} has triples.", "The number of {obj} is then tripled.", "Then the pile triples."),
}
Q_GROUP = (
    "{Pc} buys {k} {cs} with {m} {obj} in each {c}.",
    "{N} acquires {k} {cs}, each containing {m} {obj}.",
    "{N} grabs {k} {cs} of {m}.",
)
Q_END = (
    "How many {obj} does {N} have now?",
    "What is the total number of {obj} that {N} has at the end?",
    "How many {obj} does {N} end up with?",
)

# Solution choice points (style-weighted).
S_OPEN = ("{N} starts with {s} {obj}.", "At first, {N} has {s} {obj}.", "In the beginning there are {s} {obj}.")
S_CONN = ("Then", "Next", "After that", "Now")
S_STEP = ("{conn}, {P} has {expr} {obj}.", "{conn}, {expr}.", "{conn} the count is {expr}.")
S_CLOSE = ("So the answer is {a}.", "In total, {N} has {a} {obj}.", "The final count is {a}.")


def _arith_skeleton(rng: random.Random) -> tuple[int, list[tuple]]:
    """Start value and 2-4 operations; every intermediate value stays in [1, MAX_VALUE]."""
    start = rng.randint(3, 20)
    value = start
    ops: list[tuple] = []
    for _ in range(rng.randint(2, 4)):
        kinds = ["add", "sub", "add", "sub"]
        if value <= MAX_VALUE // 2:
            kinds.append("mul")
        if value + 4 <= MAX_VALUE:
            kinds.append("group")
        kind = rng.choice(kinds)
        if kind == "add":
            k = rng.randint(2, min(12, MAX_VALUE - value)) if value <= MAX_VALUE - 2 else None
            if k is None:
                kind = "sub"
            else:
                ops.append(("add", k))
                value += k
        if kind == "sub":
            if value < 2:
                ops.append(("add", rng.randint(2, 12)))
                value += ops[-1][1]
            else:
                k = rng.randint(1, min(12, value - 1))
                ops.append(("sub", k))
                value -= k
        elif kind == "mul":
            f = 3 if value * 3 <= MAX_VALUE and rng.random() < 0.4 else 2
            ops.append(("mul", f))
            value *= f
        elif kind == "group":
            room = MAX_VALUE - value
            pairs = [(k, m) for k in range(2, 6) for m in range(2, 9) if k * m <= room]
            k, m = rng.choice(pairs)
            ops.append(("group", k, m))
            value += k * m
    return start, ops


def _arith_key(start: int, ops: list[tuple]) -> str:
    return "arith|" + str(start) + "|" + ";".join(",".join(map(str, op)) for op in ops)


def _arith_example(rng: random.Random, start: int, ops: list[tuple], style: str) -> Example:
    name, pron = rng.choice(NAMES)
    friend = rng.choice([n for n, _ in NAMES if n != name])
    obj = rng.choice(OBJECTS)
    cont_pl, cont_sg = rng.choice(CONTAINERS)
    pron_obj = "him" if pron == "he" else "her"
    slots = dict(N=name, P=pron, Pc=pron.capitalize(), Po=pron_obj, F=friend, obj=obj, cs=cont_pl, c=cont_sg)
    qstyle = rng.choices(range(3), weights=_style_weights(style, 3))[0]

    question = [Q_START[qstyle].format(s=start, **slots)]
    solution = [_pick(rng, S_OPEN, style).format(s=start, **slots)]
    value = start
    for op in ops:
        if op[0] == "add":
            question.append(rng.choice(Q_ADD)[qstyle].format(k=op[1], **slots))
            expr = f"{value} + {op[1]} = {value + op[1]}"
            value += op[1]
        elif op[0] == "sub":
            question.append(rng.choice(Q_SUB)[qstyle].format(k=op[1], **slots))
            expr = f"{value} - {op[1]} = {value - op[1]}"
            value -= op[1]
        elif op[0] == "mul":
            question.append(Q_MUL[op[1]][qstyle].format(**slots))
            expr = f"{value} * {op[1]} = {value * op[1]}"
            value *= op[1]
        else:
            _, k, m = op
            question.append(Q_GROUP[qstyle].format(k=k, m=m, **slots))
            expr = f"{k} * {m} = {k * m} and {value} + {k * m} = {value + k * m}"
            value += k * m
        conn = _pick(rng, S_CONN, style)
        solution.append(_pick(rng, S_STEP, style).format(conn=conn, expr=expr, **slots))
    question.append(Q_END[qstyle].format(**slots))
    solution.append(_pick(rng, S_CLOSE, style).format(a=value, **slots))
    solution_text = " ".join(solution) + f"\n#### {value}"
    return Example(
        task="arith",
        prompt=ARITH_PROMPT.format(question=" ".join(question)),
        completion=" " + solution_text,
        reference=solution_text,
        answer=str(value),
        key=_arith_key(start, ops),
    )


def _gen_arith(rng: random.Random, style: str) -> tuple[str, Callable[[], Example]]:
    start, ops = _arith_skeleton(rng)
    return _arith_key(start, ops), lambda: _arith_example(rng, start, ops, style)


# ----------------------------------------------------------------------------------------------
# summary

FIRST = [
    "Anna",
    "David",
    "Maria",
    "James",
    "Elena",
    "Peter",
    "Laura",
    "Henry",
    "Clara",
    "Victor",
    "Helen",
    "Oscar",
    "Julia",
    "Simon",
    "Grace",
    "Martin",
    "Alice",
    "Robert",
    "Irene",
    "Daniel",
]
LAST = [
    "Cole",
    "Hart",
    "Moreno",
    "Walsh",
    "Becker",
    "Novak",
    "Reid",
    "Fischer",
    "Santos",
    "Quinn",
    "Larsen",
    "Okafor",
    "Brandt",
    "Keller",
    "Duarte",
    "Lindqvist",
    "Palmer",
    "Rossi",
    "Tanaka",
    "Wilde",
]
TOWNS = [
    "Millbrook",
    "Ashford",
    "Redwater",
    "Elmstead",
    "Stonebridge",
    "Fairhaven",
    "Oakridge",
    "Westmere",
    "Kingsley",
    "Brackwell",
    "Dunmore",
    "Highcombe",
    "Larkfield",
    "Northam",
    "Pinecrest",
    "Rosedale",
    "Silverton",
    "Thornbury",
    "Willowby",
    "Greystone",
]
CITIES = [
    "Lisbon",
    "Oslo",
    "Dublin",
    "Vienna",
    "Leeds",
    "Porto",
    "Krakow",
    "Lyon",
    "Turin",
    "Gdansk",
    "Bergen",
    "Ghent",
    "Seville",
    "Zurich",
    "Bristol",
    "Tampere",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FEST_THINGS = ["apple", "music", "kite", "lantern", "cheese", "flower", "book", "film", "jazz", "bread"]
COMPANIES = [
    "Brightway",
    "Northstar",
    "Bluepeak",
    "Corelight",
    "Greenfield",
    "Ironleaf",
    "Skyline",
    "Tidewell",
    "Brookstone",
    "Redcliff",
    "Solvant",
    "Vantora",
    "Helmark",
    "Quillon",
]
PRODUCTS = [
    "electric bike",
    "phone",
    "coffee machine",
    "solar panel",
    "smart watch",
    "tablet",
    "electric van",
    "heat pump",
    "drone",
    "washing machine",
]
TEAMS = [
    "Redford United",
    "Ashby Rovers",
    "Castleton City",
    "Dunham Athletic",
    "Eastwick Town",
    "Farley Wanderers",
    "Glenmoor Rangers",
    "Hollins Albion",
    "Kirkby County",
    "Marston Park",
]
PRIZES = [
    "Blue River Prize",
    "Golden Leaf Award",
    "Northern Light Medal",
    "Clearwater Prize",
    "Silver Oak Award",
    "Harbor Science Prize",
]
TOPICS = [
    "clean water",
    "bird migration",
    "crop disease",
    "ocean currents",
    "battery design",
    "child health",
    "soil bacteria",
    "solar storms",
    "river pollution",
    "memory loss",
]

SUMMARY_TEMPLATES = {
    "festival": (
        "About {n} people attended the annual {thing} festival in {town} on {day}.",
        "The {thing} festival in {town} drew about {n} visitors on {day}.",
        "{town} held its {thing} festival on {day}, with about {n} people attending.",
    ),
    "company": (
        "{company} has announced a new {product} and plans to hire {n} workers in {city}.",
        "The {city} firm {company} will hire {n} workers after launching a new {product}.",
        "{company} unveiled a new {product} on {day} and said it would add {n} jobs.",
    ),
    "match": (
        "{team1} beat {team2} {g1} goals to {g2} on {day}, with {player} scoring first.",
        "{player} scored as {team1} won {g1} to {g2} against {team2}.",
        "{team1} defeated {team2} {g1} to {g2} on {day}.",
    ),
    "award": (
        "Dr {person} of {city} has won the {prize} for work on {topic}.",
        "The {prize} has been awarded to {city} scientist Dr {person} for research on {topic}.",
        "Dr {person} received the {prize}, worth {n} thousand dollars, for work on {topic}.",
    ),
}


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _other(rng: random.Random, pool: list[str], *exclude: str) -> str:
    return rng.choice([x for x in pool if x not in exclude])


def _summary_facts(rng: random.Random) -> tuple[str, dict]:
    kind = rng.choice(sorted(SUMMARY_TEMPLATES))
    f: dict = dict(day=rng.choice(DAYS), city=rng.choice(CITIES))
    if kind == "festival":
        f.update(town=rng.choice(TOWNS), thing=rng.choice(FEST_THINGS), n=rng.randrange(120, 990, 10))
    elif kind == "company":
        f.update(company=rng.choice(COMPANIES), product=rng.choice(PRODUCTS), n=rng.randrange(20, 900, 10))
    elif kind == "match":
        g1 = rng.randint(1, 6)
        f.update(team1=rng.choice(TEAMS), g1=g1, g2=rng.randint(0, g1 - 1), player=_person(rng))
        f["team2"] = _other(rng, TEAMS, f["team1"])
    else:
        f.update(person=_person(rng), prize=rng.choice(PRIZES), topic=rng.choice(TOPICS), n=rng.randint(10, 500))
    return kind, f


def _summary_key(kind: str, facts: dict) -> str:
    return "summary|" + kind + "|" + "|".join(f"{k}={facts[k]}" for k in sorted(facts))


def _summary_sentences(rng: random.Random, kind: str, f: dict) -> tuple[list[str], list[str]]:
    """(key sentences, distractor sentences) of a passage."""
    day, city = f["day"], f["city"]
    other_day = _other(rng, DAYS, day)
    if kind == "festival":
        key = [
            f"The town of {f['town']} held its annual {f['thing']} festival on {day}.",
            f"About {f['n']} people came to the event.",
        ]
        extra = [
            f"The mayor, {_person(rng)}, opened the festival with a short speech.",
            f"The festival was first held {rng.randint(3, 60)} years ago.",
            "It rained for a short time in the afternoon.",
            f"Nearby {_other(rng, TOWNS, f['town'])} will host a {_other(rng, FEST_THINGS, f['thing'])} fair on "
            f"{other_day}.",
            f"Tickets cost {rng.randint(2, 30)} dollars.",
        ]
    elif kind == "company":
        key = [
            f"{f['company']}, a firm based in {city}, announced a new {f['product']} on {day}.",
            f"The company said it would hire {f['n']} new workers.",
        ]
        extra = [
            f"Its chief executive, {_person(rng)}, did not give a price.",
            f"Shares in {_other(rng, COMPANIES, f['company'])} fell slightly on {other_day}.",
            f"The firm was founded {rng.randint(3, 90)} years ago.",
            f"A rival firm sold {rng.randrange(100, 990, 10)} units of its own "
            f"{_other(rng, PRODUCTS, f['product'])} last year.",
        ]
    elif kind == "match":
        key = [
            f"{f['team1']} beat {f['team2']} by {f['g1']} goals to {f['g2']} on {day}.",
            f"{f['player']} scored the first goal for {f['team1']}.",
        ]
        t3 = _other(rng, TEAMS, f["team1"], f["team2"])
        extra = [
            f"The match was played in front of {rng.randrange(200, 990, 10)} fans.",
            f"{t3} will play {_other(rng, TEAMS, f['team1'], f['team2'], t3)} on {other_day}.",
            f"The weather in {city} was cold.",
            f"{_person(rng)} missed a penalty in the second half.",
        ]
    else:
        key = [
            f"Dr {f['person']} from {city} has won the {f['prize']} for work on {f['topic']}.",
            f"The prize comes with {f['n']} thousand dollars.",
        ]
        extra = [
            f"Last year the prize went to Dr {_person(rng)}.",
            f"The ceremony took place in {_other(rng, CITIES, city)} on {day}.",
            f"Dr {f['person'].split()[1]} has also studied {_other(rng, TOPICS, f['topic'])}.",
            f"About {rng.randrange(100, 990, 10)} guests attended the dinner.",
        ]
    return key, extra


def _summary_example(rng: random.Random, kind: str, facts: dict, style: str) -> Example:
    key_sents, extra = _summary_sentences(rng, kind, facts)
    rng.shuffle(extra)
    body = key_sents[1:] + extra[: rng.randint(2, 3)]
    rng.shuffle(body)
    lead = rng.choice([0, 0, 1])  # mostly lead with the main fact, sometimes a distractor first
    sentences = body[:lead] + key_sents[:1] + body[lead:]
    summary = _pick(rng, SUMMARY_TEMPLATES[kind], style).format(**facts)
    # [decision] Every phrasing of the same facts is a correct summary: the reference lists them all,
    # one per line, and the reward takes the best match (multi-reference ROUGE), so the score measures
    # the facts, not which phrasing style a model prefers -- wording is meant to be harmless.
    all_phrasings = [template.format(**facts) for template in SUMMARY_TEMPLATES[kind]]
    return Example(
        task="summary",
        prompt=SUMMARY_PROMPT.format(passage=" ".join(sentences)),
        completion=" " + summary,
        reference="\n".join(all_phrasings),
        answer=summary,
        key=_summary_key(kind, facts),
    )


def _gen_summary(rng: random.Random, style: str) -> tuple[str, Callable[[], Example]]:
    kind, facts = _summary_facts(rng)
    return _summary_key(kind, facts), lambda: _summary_example(rng, kind, facts, style)


# ----------------------------------------------------------------------------------------------
# public API

_GENERATORS = {"arith": _gen_arith, "summary": _gen_summary}


def generate(
    task: str,
    split: str = "test",
    num_examples: int = 200,
    seed: int = 0,
    style: str = "uniform",
    unique: bool = True,
) -> list[Example]:
    """``num_examples`` examples of ``task`` from ``split``, deterministic in ``seed``.

    Candidates whose canonical key belongs to the other split are skipped, so train and test are
    disjoint for any seeds. With ``unique`` no canonical key repeats within the returned list.
    """
    if task not in _GENERATORS:
        raise ValueError(f"`task` is {task!r}; use one of {TASKS}.")
    if split not in SPLITS:
        raise ValueError(f"`split` is {split!r}; use one of {SPLITS}.")
    if style not in STYLES:
        raise ValueError(f"`style` is {style!r}; use one of {STYLES}.")
    if num_examples < 0:
        raise ValueError(f"`num_examples` is {num_examples}; it must be >= 0.")
    rng = _seeded_rng(seed, split, task)
    out: list[Example] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < num_examples:
        attempts += 1
        if attempts > 200 * num_examples + 10_000:
            raise RuntimeError(f"could not generate {num_examples} unique {task!r} examples; lower `num_examples`.")
        key, make = _GENERATORS[task](rng, style)
        if split_of(key) != split or (unique and key in seen):
            continue
        seen.add(key)
        out.append(make())
    return out
