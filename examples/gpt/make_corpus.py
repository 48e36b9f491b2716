"""Write `corpus.txt`: the GPT example's training text, made here from a small grammar.

    python examples/gpt/make_corpus.py            # rewrites corpus.txt (the same bytes every time)

Why a made text: the example must ship its data and no network is assumed, and a text written
by this script is ours to give away: corpus.txt is dedicated to the public domain (CC0). It is
plain English prose with a regular grammar and a few hundred words, so a tiny byte-level model
visibly learns spelling, spacing and word order in a few dozen steps.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SIZE = 300_000  # bytes
SEED = 1851

PEOPLE = ["the miller", "the old sailor", "a young weaver", "the shepherd", "the captain", "my grandmother",
          "the blacksmith", "a quiet scholar", "the ferryman", "the baker's daughter", "the stranger",
          "the village priest", "a tired soldier", "the innkeeper", "the clockmaker", "her brother"]
PLACES = ["the river", "the harbour", "the mill", "the forest", "the market", "the chapel", "the hill",
          "the bridge", "the orchard", "the lighthouse", "the north road", "the empty house", "the valley"]
THINGS = ["a lantern", "a letter", "an old map", "a basket of apples", "a silver key", "a small boat",
          "a loaf of bread", "a wooden box", "a bundle of wool", "a broken wheel", "a green coat", "a book"]
VERBS_TO = ["walked to", "ran toward", "looked back at", "came down to", "sailed past", "waited near",
            "returned to", "wandered through", "climbed above", "rested beside"]
VERBS_OBJ = ["carried", "found", "mended", "sold", "lost", "opened", "hid", "gave away", "painted", "kept"]
TIMES = ["at dawn", "in the evening", "before the rain", "after supper", "on the first day of winter",
         "when the bells rang", "late at night", "in the spring", "while the town slept", "at noon"]
MANNERS = ["slowly", "without a word", "with great care", "in a hurry", "as if in a dream", "once more",
           "quietly", "for the last time"]
WEATHER = ["The wind rose over {p}.", "Rain fell on {p} all day.", "A grey fog lay on {p}.",
           "The sun was warm on {p}.", "Snow covered {p} and the roofs beyond it."]
SAYINGS = ["\"We shall see,\" said {a}.", "\"Not today,\" said {a}, and smiled.",
           "\"Where have you been?\" asked {a}.", "\"It is late,\" said {a}, \"and the road is long.\"",
           "\"Bring it here,\" said {a}."]
LINKS = ["and", "but", "so", "and then", "yet"]


def cap(text: str) -> str:
    return text[0].upper() + text[1:]


def sentence(rng: random.Random) -> str:
    a, b = rng.choice(PEOPLE), rng.choice(PEOPLE)
    p, t = rng.choice(PLACES), rng.choice(THINGS)
    kind = rng.randrange(6)
    if kind == 0:
        return cap(f"{a} {rng.choice(VERBS_TO)} {p} {rng.choice(TIMES)}.")
    if kind == 1:
        return cap(f"{a} {rng.choice(VERBS_OBJ)} {t} {rng.choice(MANNERS)}, {rng.choice(LINKS)} {b} "
                   f"{rng.choice(VERBS_TO)} {p}.")
    if kind == 2:
        return rng.choice(WEATHER).format(p=p)
    if kind == 3:
        return cap(rng.choice(SAYINGS).format(a=a)) if rng.random() < 0.5 else rng.choice(SAYINGS).format(a=a)
    if kind == 4:
        return cap(f"{rng.choice(TIMES)}, {a} {rng.choice(VERBS_OBJ)} {t} and {rng.choice(VERBS_TO)} {p}.")
    return cap(f"{a} and {b} {rng.choice(VERBS_TO)} {p}, {rng.choice(MANNERS)}.")


def corpus(size: int = SIZE, seed: int = SEED) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    while n < size:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 7))) + "\n\n"
        parts.append(paragraph)
        n += len(paragraph)
    return "".join(parts)[:size]


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("corpus.txt")
    out.write_text(corpus(), encoding="ascii")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
