"""The training text: the King James Bible from Debian's bible-kjv-text (public domain), split into
chapters, a held-out set of chapters for perplexity, and chat conversations rendered exactly as
the Muse Glimmer chat template renders them (so a chat request to the served model gets English).
"""

import collections
import random
import re
import subprocess

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Control tokens, in id order after the normal ones: the Muse Glimmer specials its chat template
# and ATEM parser use, and the vision markers the template can write.
SPECIALS = [
    BOS,
    EOS,
    "<|eom|>",
    "<|eot|>",
    "<|finetune_right_pad|>",
    "<|start|>",
    "<|message|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|vid_start|>",
    "<|vid_end|>",
    "<|vid_frame_separator|>",
    "<|image|>",
    "<|video|>",
    "<|patch|>",
    "<|reserved_special_token_0|>",
]

# Every 50th chapter, from the 26th on, is held out: 24 chapters spread over the whole book.
HELD_OUT_EVERY, HELD_OUT_PHASE = 50, 25


def read_kjv():
    """[(book, chapter, [verse texts])] in canonical order, from the `bible` program."""
    out = subprocess.run(
        ["bible", "-l9999", "gen1:1-rev22:21"], check=True, capture_output=True, text=True
    ).stdout
    chapters, verses = [], None
    for line in out.split("\n"):
        m = re.match(r"^\s+(\d+) (.*\S)\s*$", line)
        if m:
            assert verses is not None and int(m.group(1)) == len(verses) + 1, line
            verses.append(m.group(2))
        elif line.strip():
            book, chap = line.strip().rsplit(" ", 1)
            verses = []
            chapters.append((book, int(chap), verses))
    assert len(chapters) == 1189, len(chapters)
    return chapters


def chapter_text(book, chap, verses):
    return f"{book} {chap}\n\n" + "".join(f"{i + 1} {v}\n" for i, v in enumerate(verses))


def split(chapters):
    train, held = [], []
    for i, c in enumerate(chapters):
        (held if i % HELD_OUT_EVERY == HELD_OUT_PHASE else train).append(c)
    return train, held


# --- chat ------------------------------------------------------------------------------------

SYSTEMS = [
    "You are a helpful assistant.",
    "You are a helpful AI assistant.",
    "Answer in the words of the King James Bible.",
    "You are a concise assistant.",
    "Be brief.",
]
GREETINGS = [
    "Hello",
    "Hello!",
    "Hi",
    "Hi there",
    "Hey",
    "Good morning",
    "Good evening",
    "How are you?",
    "Who are you?",
    "What is your name?",
    "Say something.",
    "Tell me something.",
    "Write a sentence.",
    "Write something in English.",
    "Speak to me.",
    "Give me a verse.",
    "Quote a verse.",
    "Tell me a story.",
    "What is the meaning of life?",
    "Can you help me?",
    "Thank you",
    "Please write a short answer.",
]
TOPIC_FORMS = [
    "Tell me about {w}.",
    "What does the Bible say about {w}?",
    "Write a verse about {w}.",
    "{W}",
    "{w}",
    "Say something about {w}.",
    "What is {w}?",
    "Give me a verse about {w}.",
]
CONTINUE_FORMS = ["Continue: {s}", "{s}", "Finish this verse: {s}", "Complete: {s}"]
QUOTE_FORMS = ["Quote {r}.", "What does {r} say?", "{r}", "Recite {r}."]


def system_block(rng):
    """The system message as the template writes it: its default block (most conversations) or a
    caller's system text, with the reasoning line and the recipients line."""
    strength = rng.choice(["high", "high", "low", "medium", "xhigh"])
    if rng.random() < 0.8:
        s = "<|start|>system<|message|>You are a helpful AI assistant.\nKnowledge cutoff: 2026-01-04."
        if rng.random() < 0.85:
            y, m, d = rng.randint(2024, 2030), rng.randint(1, 12), rng.randint(1, 28)
            s += f"\nCurrent date: {y:04d}-{m:02d}-{d:02d}."
    else:
        s = "<|start|>system<|message|>" + rng.choice(SYSTEMS)
    return s + f'\n\nReasoning strength: {strength}.\n\n# Valid recipients: "self", "user".<|eot|>'


def render_chat(rng, turns):
    text = BOS + system_block(rng)
    for user, answer in turns:
        text += f"<|start|>user<|message|>{user}<|eot|>"
        text += f"<|start|>assistant to=user<|message|>{answer}<|eot|>"
    return text


def chat_examples(train_chapters, n, seed):
    """n conversations of one or two turns whose answers are verses of the training chapters."""
    rng = random.Random(seed)
    verses = []  # (reference, text)
    for book, chap, vs in train_chapters:
        for i, v in enumerate(vs):
            verses.append((f"{book} {chap}:{i + 1}", v))
    word_verses = collections.defaultdict(list)
    freq = collections.Counter()
    for k, (_, v) in enumerate(verses):
        ws = set(re.findall(r"[a-z]+", v.lower()))
        for w in ws:
            word_verses[w].append(k)
            freq[w] += 1
    common = {w for w, _ in freq.most_common(80)}
    topics = sorted(w for w, c in freq.items() if c >= 12 and len(w) >= 4 and w not in common)
    short = [k for k, (_, v) in enumerate(verses) if len(v) <= 140]

    def turn():
        kind = rng.random()
        if kind < 0.35:
            w = rng.choice(topics)
            form = rng.choice(TOPIC_FORMS)
            user = form.format(w=w, W=w.capitalize())
            answer = verses[rng.choice(word_verses[w])][1]
        elif kind < 0.6:
            ref, v = verses[rng.randrange(len(verses))]
            words = v.split()
            k = min(len(words) - 1, rng.randint(3, 8))
            user = rng.choice(CONTINUE_FORMS).format(s=" ".join(words[: max(k, 1)]))
            answer = v
        elif kind < 0.75:
            ref, v = verses[rng.randrange(len(verses))]
            user = rng.choice(QUOTE_FORMS).format(r=ref)
            answer = v
        else:
            user = rng.choice(GREETINGS)
            answer = verses[rng.choice(short)][1]
        return user, answer

    out = []
    for _ in range(n):
        turns = [turn()]
        if rng.random() < 0.2:
            turns.append(turn())
        out.append(render_chat(rng, turns))
    return out
