"""The eval suite's synthetic tasks (no data set is downloaded): prompts, expected answers.

Completion tasks (a base model continues the prompt; ``--tasks all``): ``passkey``,
``passkey_story``, ``niah_single``, ``niah_multikey``, ``niah_multivalue``, ``niah_multiquery``
(see :mod:`llama_sparq.eval`).

Chat tasks (``--tasks chat``: an instruct model answers a user message through the GGUF's chat
template; the text is the message, the instruction after the document):

- ``chat_passkey``: a 5-digit pass key in the classic "grass is green" filler;
- ``chat_word``: a secret word (not otherwise in the text) in word-salad story filler;
- ``chat_multikey``: four "special magic number" needles with different keys in story filler,
  one asked (the others are distractors);
- ``chat_qa``: a document of story filler with two short paragraphs about fictional towns, each
  naming its river, its museum's founder and year and its bakery's speciality; the question
  (stated before the document, asked after it) is the river, the founder or the speciality of
  the town at the depth (the other town is a distractor).

The needle (the asked one) sits at the depth; the sample is sized in tokens of the formatted
chat prompt (the ``tokenize`` callable counts them) to within about 1 %.
"""

from __future__ import annotations

from itertools import product

import numpy as np

RAW_TASKS = ("passkey", "passkey_story", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")
CHAT_TASKS = ("chat_passkey", "chat_word", "chat_multikey", "chat_qa")
TASKS = RAW_TASKS + CHAT_TASKS
TASK_GROUPS = {"all": RAW_TASKS, "chat": CHAT_TASKS}

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
STORY_WORDS = ("river stone lantern market copper window orchard ladder harbor violin meadow engine "
               "candle forest pepper garden thunder marble feather compass quiet yellow distant gentle "
               "walked carried painted opened counted followed remembered crossed").split()
KEY_WORDS = ("apple", "tiger", "silver", "ocean", "maple", "rocket", "violet", "falcon", "cobalt", "ember")


PASSKEY_HEAD = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
PASSKEY_TAIL = "What is the pass key? The pass key is"


def passkey_needle(key) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


def passkey_text(key, n_filler, depth, filler=NOISE) -> str:
    """The classic passkey prompt: n_filler repeats of the filler with the key's sentence at depth."""
    k = int(n_filler * depth)
    return PASSKEY_HEAD + filler * k + passkey_needle(key) + filler * (n_filler - k) + PASSKEY_TAIL


def _story(rng, n_words):
    words = rng.choice(STORY_WORDS, size=n_words)
    out, i = [], 0
    while i < n_words:
        m = int(rng.integers(6, 14))
        sent = " ".join(words[i:i + m])
        out.append(sent[:1].upper() + sent[1:] + ".")
        i += m
    return " ".join(out) + " "


def _raw_sample(task, n_tokens, depth, seed, tokenize):
    """A completion task's (prompt text, expected answers, answer length in tokens)."""
    rng = np.random.default_rng(seed)
    if task.startswith("passkey"):
        key = int(rng.integers(10000, 99999))
        head, needle, tail = PASSKEY_HEAD, passkey_needle(key), PASSKEY_TAIL
        if task == "passkey":
            unit = NOISE
            filler = lambda n: unit * n  # noqa: E731
        else:
            filler = lambda n: _story(np.random.default_rng(seed + 1), 12 * n)  # noqa: E731
        per = max(1, len(tokenize(filler(20))) // 20)
        n_units = max(1, (n_tokens - len(tokenize(head + needle + tail))) // per)
        before = filler(int(n_units * depth))
        after = filler(n_units - int(n_units * depth))
        if task == "passkey_story":
            body = filler(n_units)
            cut = int(len(body) * depth)
            cut = body.rfind(". ", 0, cut) + 2 if body.rfind(". ", 0, cut) > 0 else 0
            before, after = body[:cut], body[cut:]
        return head + before + needle + after + tail, [str(key)], 8

    # RULER-style needles in noise
    keys = list(rng.choice(KEY_WORDS, size=4, replace=False))
    if task == "niah_multivalue":
        keys = keys[:1]
        vals = [[int(rng.integers(1000000, 9999999)) for _ in range(3)]]
    else:
        vals = [[int(rng.integers(1000000, 9999999))] for _ in keys]
    if task == "niah_single":
        keys, vals = keys[:1], vals[:1]
    needles = [f"One of the special magic numbers for {k} is: {v}. " for k, vs in zip(keys, vals) for v in vs]
    order = rng.permutation(len(needles))
    needles = [needles[i] for i in order]
    if task == "niah_multiquery":
        asked = [0, 1]
    else:
        asked = [0]
    qkeys = [keys[i] for i in asked]
    expected = [str(v) for i in asked for v in vals[i]]
    head = "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    if len(qkeys) == 1 and task != "niah_multivalue":
        tail = f"What is the special magic number for {qkeys[0]}? The special magic number for {qkeys[0]} is:"
    elif task == "niah_multivalue":
        tail = f"What are all the special magic numbers for {qkeys[0]}? The special magic numbers for {qkeys[0]} are:"
    else:
        tail = (f"What are the special magic numbers for {qkeys[0]} and {qkeys[1]}? "
                f"The special magic numbers for {qkeys[0]} and {qkeys[1]} are:")
    per = max(1, len(tokenize(NOISE * 20)) // 20)
    n_units = max(len(needles) + 1, (n_tokens - len(tokenize(head + "".join(needles) + tail))) // per)
    # needles spread around the depth (the first one at it)
    spots = sorted({min(n_units, max(0, int(n_units * depth) + int(j * n_units / (2 * len(needles)))
                                     if j else int(n_units * depth))) for j in range(len(needles))})
    while len(spots) < len(needles):
        spots.append(min(n_units, spots[-1] + 1))
    body, last = [], 0
    for s, nd in zip(spots, needles):
        body.append(NOISE * (s - last))
        body.append(nd)
        last = s
    body.append(NOISE * (n_units - last))
    return head + "".join(body) + tail, expected, 10 * len(expected)


def make_sample(task, n_tokens, depth, seed, tokenize):
    """(prompt text, expected answers, answer length in tokens) for about n_tokens tokens.

    For a chat task the text is the user message and ``tokenize`` should count the tokens of
    the formatted chat prompt holding it."""
    if task in CHAT_TASKS:
        return _chat_sample(task, n_tokens, depth, seed, tokenize)
    if task not in RAW_TASKS:
        raise ValueError(f"unknown task {task!r}; allowed: {', '.join(TASKS)}")
    return _raw_sample(task, n_tokens, depth, seed, tokenize)


# ---------------------------------------------------------------- chat tasks

SECRET_WORDS = ("pineapple", "saxophone", "glacier", "tornado", "butterfly", "volcano", "kangaroo", "lighthouse",
                "penguin", "telescope", "cinnamon", "umbrella")
_TOWN_HEADS = ("Var", "Ost", "Kel", "Brin", "Hol", "Mar", "Tes", "Quen", "Dun", "Arl", "Fen", "Cor", "Bel", "Gal")
_TOWN_TAILS = ("den", "rel", "more", "dle", "lin", "row", "by", "mere", "ow", "wick", "vale", "ford")
FIRST_NAMES = ("Elsa", "Tomas", "Amira", "Jonah", "Ingrid", "Mateo", "Leona", "Pavel", "Nadia", "Oscar")
SURNAMES = ("Brandt", "Okafor", "Lindqvist", "Moreau", "Haddad", "Kowalski", "Tanaka", "Fischer", "Alvarez",
            "Novak", "Osei", "Petrov", "Whitlock", "Castell")
FOODS = ("plum cake", "rye bread", "honey buns", "apple pie", "cheese tarts", "walnut rolls", "poppy seed loaf",
         "cherry strudel", "ginger biscuits", "fig pastries")
RIVERS = ("Alder", "Wren", "Sable", "Tarn", "Ember", "Lisk")
QA_TOWNS = 2  # the asked town and one distractor (SmolLM2 135M, dense: 9/10 at 1.3K and 3.3K)


def _sentences(seed):
    """i -> the i-th sentence (6 to 13 story words, capitalised, ending with ". ") of an endless
    word-salad story; the same seed gives the same sentences whatever is asked first."""
    rng = np.random.default_rng(seed)
    cache = []

    def unit(i):
        while len(cache) <= i:
            sent = " ".join(rng.choice(STORY_WORDS, size=int(rng.integers(6, 14))))
            cache.append(sent[:1].upper() + sent[1:] + ". ")
        return cache[i]
    return unit


def _compose(head, parts, tail, n_tokens, tokenize, unit, positions):
    """head + filler units with ``parts`` inserted + tail, about n_tokens tokens by ``tokenize``.

    ``unit(i)`` is the i-th filler unit; ``positions(n_units)`` gives each part's place (a unit
    index 0..n_units; parts at the same place keep their order). The unit count is estimated
    from the units' mean length and corrected twice from the measured length."""
    base = len(tokenize(""))
    per = max(1.0, (len(tokenize("".join(unit(i) for i in range(40)))) - base) / 40)
    fixed = len(tokenize(head + "".join(parts) + tail))
    n_units = max(len(parts) + 1, int((n_tokens - fixed) / per))

    def build(n):
        placed = sorted(zip(positions(n), range(len(parts))))
        body, j = [], 0
        for i in range(n + 1):
            while j < len(placed) and placed[j][0] <= i:
                body.append(parts[placed[j][1]])
                j += 1
            if i < n:
                body.append(unit(i))
        return head + "".join(body) + tail

    text = build(n_units)
    for _ in range(2):
        got = len(tokenize(text))
        if abs(got - n_tokens) <= max(8, n_tokens // 200):
            break
        n_units = max(len(parts) + 1, n_units + int(round((n_tokens - got) / per)))
        text = build(n_units)
    return text


def _town_paragraph(town, river, first, surname, year, food):
    return (f"\n\n{town} is a small town on the river {river}. Its museum was founded in {year} by {first} "
            f"{surname}. The bakery of {town} is famous for its {food}.\n\n")


def _chat_sample(task, n_tokens, depth, seed, tokenize):
    """A chat task's (user message, expected answers, answer length in tokens)."""
    rng = np.random.default_rng(seed)
    at_depth = lambda n: [int(n * depth)]  # noqa: E731
    if task == "chat_passkey":
        key = int(rng.integers(10000, 99999))
        text = _compose("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n\n",
                        [f"The pass key is {key}. Remember it. {key} is the pass key. "],
                        "\n\nWhat is the pass key? Answer with the number only.",
                        n_tokens, tokenize, lambda i: NOISE, at_depth)
        return text, [str(key)], 24
    story = _sentences(seed + 1)
    if task == "chat_word":
        word = str(rng.choice(SECRET_WORDS))
        text = _compose("A secret word is hidden inside the following text. Find it and memorize it.\n\n",
                        [f'The secret word is "{word}". Remember it: the secret word is "{word}". '],
                        "\n\nWhat is the secret word? Answer with the word only.",
                        n_tokens, tokenize, story, at_depth)
        return text, [word], 16
    if task == "chat_multikey":
        keys = [str(k) for k in rng.choice(KEY_WORDS, size=4, replace=False)]
        vals = [int(rng.integers(1000000, 9999999)) for _ in keys]
        needles = [f"The special magic number for {k} is {v}. " for k, v in zip(keys, vals)]
        # the asked one (keys[0]) at the depth, the others spread over the rest of the text
        spread = lambda n: [int(n * depth)] + [int(n * ((depth + (j + 1) / 4) % 1.0)) for j in range(3)]  # noqa: E731
        text = _compose("Some special magic numbers are hidden within the following text. "
                        "Make sure to memorize them.\n\n", needles,
                        f"\n\nWhat is the special magic number for {keys[0]}? Answer with the number only.",
                        n_tokens, tokenize, story, spread)
        return text, [str(vals[0])], 24
    if task == "chat_qa":
        return _qa_sample(rng, n_tokens, depth, tokenize, story)
    raise ValueError(f"unknown chat task {task!r}")


def _qa_sample(rng, n_tokens, depth, tokenize, story):
    """chat_qa: QA_TOWNS town paragraphs in story filler, a question on the one at the depth, stated
    before the document and asked after it (a small model answers it then; the year of the
    museum, tried too, it mostly could not)."""
    n_towns = QA_TOWNS
    names = [a + b for a, b in product(_TOWN_HEADS, _TOWN_TAILS)]
    towns = [names[i] for i in rng.choice(len(names), size=n_towns, replace=False)]
    # every town its own river, founder and speciality: a distractor's answer is wrong
    pick = lambda xs: [str(x) for x in rng.choice(xs, size=n_towns, replace=False)]  # noqa: E731
    facts = list(zip(towns, pick(RIVERS), pick(FIRST_NAMES), pick(SURNAMES),
                     [int(y) for y in rng.integers(1820, 1990, size=n_towns)], pick(FOODS)))
    paras = [_town_paragraph(*f) for f in facts]
    town, river, first, surname, year, food = facts[0]
    kind = int(rng.integers(0, 3))
    question, expected = [
        (f"Who founded the museum in {town}? Answer with the name only.", surname),
        (f"On which river is the town of {town}? Answer with the river's name only.", river),
        (f"What is the bakery of {town} famous for? Answer in a few words.", food),
    ][kind]
    # the asked town at the depth, the others evenly spaced after it (cyclically)
    spread = lambda n: [int(n * ((depth + j / n_towns) % 1.0)) for j in range(n_towns)]  # noqa: E731
    text = _compose(f"Read the following document and answer this question: {question.split('?')[0]}?\n\n", paras,
                    f"\n\nAnswer the question using the document. {question}",
                    n_tokens, tokenize, story, spread)
    return text, [expected], 24
