"""Invented identifiers for training "write a function" tasks: function, class and argument names
drawn at random from snake_case (or CamelCase) word combinations, so that no name is frequent
enough to be memorised and the model must copy the requested one from the request.

The held-out split stays apart: no word of any family's held-out name is in the word pool, and a
drawn name that contains a held-out name is drawn again (`is_training_name`). Names are never
Python keywords or builtins, and never a name the family's body already uses (a local variable or
a builtin it calls), so renaming cannot change what the reference solution does.
"""

from __future__ import annotations

import builtins
import functools
import keyword
import random
import re

from sparkinfer.bench.evals.task_families import FAMILIES, Family

_WORDS_TEXT = """
able above account active add address adjust after agent align all alpha amount anchor angle
apply area array arrow ask asset atom audit auto axis back badge bag balance band bank bar base
basic batch beam bell best beta big bin bird bit blank blend block bloom blue board body bolt
bond book boost border boss bottom bound box brain branch brave brick bridge bright bring broad
brush bucket budget build bulk bunch burst button buy cable cache calc call calm camp canvas cap
card care cargo carry case cast catch cell center chain chalk change channel chart cheap check
chip choose chunk circle city claim clean clear click climb clip clock close cloud club coach
coast code coin cold collect color column combo comet common compact compute cook cool copy
core corner cost couple cover craft crane create crisp crop cross crowd crown cube cup curve
cycle daily dance dark dash data date dawn deal deck deep delta dense depth derive desk detail
dial diff dig dim direct disk dive dock dot draft drag draw dream drift drive drop drum dry dual
dust eager early earth east easy echo edge edit eight elite ember empty end energy entry epoch
equal error even event exact exit extra fable face fact fair fancy far fast feed fetch field
fill film final fine fire firm fish fit fix flag flame flash fleet flint float flock flow fluid
focus fog fold folk force forge form fort frame free fresh front frost fruit fuel full fuse
gain game gap garden gate gather gauge gear gem giant gift glad glass glide globe glow goal gold
good grab grain grand graph grass great green grid grip group grove guard guess guide gust hand
handle happy harbor hash haste hawk head heap heart heavy hedge height help hero high hill hint
hold hole home honey hook hope horn host hot hour house hub huge hunt ice icon idea image inbox
index inner input iron item jade jazz jet job join joy judge jump just keen keep kernel kind king
kit kite knot label lake lamp land lane large laser late layer lead leaf lean learn ledger left
lemon lens level lever light lime line link lion list little live load local lock lodge logic
long loop loud low lucky lunar magic main major maple mark market mask match matrix meadow medal
medium melt memo mesh metal meter middle mild mill mint mirror mist mode model moon morning
motor mount move much music narrow native near neat needle nest net new next nice night noble
node noise north note novel nudge oak ocean offer olive omega open orbit order origin outer oval
owner pack page paint pair palm panel paper park part pass patch path peak pearl pen pepper pick
piece pilot pine pipe pivot pixel place plain plan planet plant plate play plot plum point polar
pool port post pouch power press price prime print prism probe proof prop proud pulse pump pure
push quick quiet quota race radar radio rail rain range rank rapid rare rate raw reach read
ready real record red reef relay rely remote rest ridge right ring ripple rise river road robin
rock roll roof room root rope rose rough round route row royal rule run rush safe sail salt
sample sand save scale scan scene scope score scout screen sea seal season seed select sense
serve set shade shadow shape share sharp shelf shell shift shine ship short show side sight
signal silk silver simple sink site size sketch sky slate sleek slice slide slim slot slow small
smart smooth snap snow soft solar solid solve song sort sound source south space spark speed
spell spin spine split spoon spot spray spring square stack stage stamp stand star start state
steady steam steel stem step stone stop store storm story stream street strong style sugar suit
summit sun super sure surf swap sweet swift table tag tail take talk tall tank tape target task
team tempo tend test thick thin thread tide tiger tight timber tiny token tone tool top torch
total touch tower trace track trade trail train tree trend trial tribe trim trio true trust tune
turn twin ultra under union unit upper urban usual valid valley vapor vast vault vector velvet
verse view vine visit vital vivid voice volt wagon walk wall warm watch water wave wax wealth
weave web wedge west whale wheel white wide wild wind wing wire wise wolf wood word work world
yard year yield young zeal zebra zero zinc zone
"""
_VERBS_TEXT = """
add adjust align apply build calc check choose clean collect compute convert copy count create
derive detect do eval extract fetch filter find fix format gather get give handle join keep load
make map merge move parse pick process produce read reduce render resolve return run scan select
solve sort split take test track transform turn update verify walk yield
"""
_PREFIXES = ("is", "has", "get", "to", "can", "should", "find", "count", "make", "compute")
_INFIXES = ("of", "to", "by", "in", "for", "with", "and", "at", "per")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _held_out_words() -> frozenset[str]:
    """Words of held-out names that no family's training name uses: the words a training name
    could only have learnt from the held-out split."""
    held: set[str] = set()
    seen: set[str] = set()
    for family in FAMILIES:
        held.update(_split_words(family.held_out_name))
        for name in family.names:
            seen.update(_split_words(name))
    return frozenset(held - seen)


def _split_words(name: str) -> list[str]:
    """snake_case or CamelCase words of a name, lower case."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w.lower() for w in spaced.split("_") if w]


HELD_OUT_NAMES = frozenset(f.held_out_name for f in FAMILIES)
HELD_OUT_WORDS = _held_out_words()
_HELD_OUT_NAME_RE = re.compile("|".join(re.escape(h.lower()) for h in sorted(HELD_OUT_NAMES)))
_RESERVED = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins))
WORDS = tuple(sorted(frozenset(_WORDS_TEXT.split()) - HELD_OUT_WORDS - _RESERVED))
VERBS = tuple(sorted(frozenset(_VERBS_TEXT.split()) - HELD_OUT_WORDS - _RESERVED))


def is_training_name(name: str) -> bool:
    """True when `name` may name a training function, class or argument: not a held-out name,
    none inside it (case-insensitive), and no held-out name word among its words."""
    if _HELD_OUT_NAME_RE.search(name.lower()):
        return False
    return not any(w in HELD_OUT_WORDS for w in _split_words(name))


@functools.cache
def _body_identifiers(family: Family) -> frozenset[str]:
    return frozenset(_IDENTIFIER.findall(family.body))


def _snake(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.15:
        parts = [rng.choice(_PREFIXES), rng.choice(WORDS)]
        parts += [rng.choice(WORDS)] if rng.random() < 0.4 else []
    elif roll < 0.25:
        parts = [rng.choice(WORDS), rng.choice(_INFIXES), rng.choice(WORDS)]
    elif roll < 0.45:
        parts = [rng.choice(VERBS), rng.choice(WORDS)]
    elif roll < 0.6:
        parts = [rng.choice(WORDS), rng.choice(WORDS)]
    elif roll < 0.75:
        parts = [rng.choice(VERBS), rng.choice(WORDS), rng.choice(WORDS)]
    elif roll < 0.85:
        parts = [rng.choice(WORDS)]
    elif roll < 0.95:
        parts = [rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)]
    else:
        parts = [rng.choice(WORDS), str(rng.randint(1, 99))]
    return "_".join(parts)


def _camel(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS).capitalize() for _ in range(rng.randint(1, 3)))


def _usable(name: str, taken: frozenset[str] | set[str]) -> bool:
    return name not in _RESERVED and name not in taken and is_training_name(name)


def invented_name(rng: random.Random, family: Family) -> str:
    """A random function (snake_case) or class (CamelCase) name for a training task."""
    taken = _body_identifiers(family)
    while True:
        name = _camel(rng) if family.is_class else _snake(rng)
        if _usable(name, taken):
            return name


def invented_args(rng: random.Random, family: Family, name: str) -> tuple[str, ...]:
    """Distinct random argument names, as many as the family takes: single words mostly, some
    two-word names and single letters."""
    count = len(family.args[0])
    taken = set(_body_identifiers(family)) | {name}
    args: list[str] = []
    while len(args) < count:
        roll = rng.random()
        if roll < 0.65:
            arg = rng.choice(WORDS)
        elif roll < 0.9:
            arg = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
        else:
            arg = rng.choice("abcdefghjkmnpqrstuvwxyz")
        if _usable(arg, taken):
            args.append(arg)
            taken.add(arg)
    return tuple(args)
