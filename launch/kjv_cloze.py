#!/usr/bin/env python3
"""The main job's downstream tasks: two tests on verses the training never sees.

usage: kjv_cloze.py VERSES TRAIN_OUT CLOZE_OUT ORDER_OUT [--examples N] [--seed S]

VERSES holds one verse per line as `bible` prints them ("Ge1:1 In the beginning God ...").
N verses (seeded, default 300) are held out: TRAIN_OUT gets every other verse, in order (what prep
makes the training data of: the held-out verses are in neither its train nor its val split), and
CLOZE_OUT one JSONL example per held-out verse, in the layout of eval.tasks:
  {"context": "Ge1:1 In the beginning God", "choices": [" created the heaven and the earth.", ...], "label": i}
the context being the reference and the first half of the verse's words, the choices its true second
half among the second halves of three other held-out verses, at a seeded place; and ORDER_OUT the
same contexts with the true second half among three seeded shuffles of its own words (the same
bytes: a test of word order; verses whose second half has fewer than 3 other orders are left out).
An untrained model is near 25% on both. Deterministic: the same files for the same input and seed.
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("verses")
    ap.add_argument("train_out")
    ap.add_argument("cloze_out")
    ap.add_argument("order_out")
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=41)
    a = ap.parse_args()
    with open(a.verses, encoding="utf-8") as f:
        verses = [line.rstrip("\n") for line in f if line.strip()]
    # Verses of at least two words after the reference can be cut in two.
    usable = [i for i, v in enumerate(verses) if len(v.split(" ")) >= 3]
    rng = random.Random(a.seed)
    held = sorted(rng.sample(usable, a.examples))
    held_set = set(held)
    with open(a.train_out, "w", encoding="utf-8") as f:
        for i, v in enumerate(verses):
            if i not in held_set:
                f.write(v + "\n")

    def halves(v):
        words = v.split(" ")  # words[0]: the reference
        cut = 1 + (len(words) - 1 + 1) // 2  # the reference and ceil(half) of the words
        return " ".join(words[:cut]), " " + " ".join(words[cut:])

    parts = [halves(verses[i]) for i in held]
    with open(a.cloze_out, "w", encoding="utf-8") as f:
        for k, (context, answer) in enumerate(parts):
            others = rng.sample([j for j in range(len(parts)) if j != k], 3)
            choices = [parts[j][1] for j in others]
            label = rng.randrange(4)
            choices.insert(label, answer)
            f.write(json.dumps({"context": context, "choices": choices, "label": label}) + "\n")
    order = 0
    with open(a.order_out, "w", encoding="utf-8") as f:
        for context, answer in parts:
            words = answer[1:].split(" ")
            seen, others = {tuple(words)}, []
            for _ in range(100):
                w = words[:]
                rng.shuffle(w)
                if tuple(w) not in seen:
                    seen.add(tuple(w))
                    others.append(" " + " ".join(w))
                if len(others) == 3:
                    break
            if len(others) < 3:
                continue
            label = rng.randrange(4)
            others.insert(label, answer)
            f.write(json.dumps({"context": context, "choices": others, "label": label}) + "\n")
            order += 1
    print(f"kjv_cloze: {len(verses) - len(held)} verses to train on, {len(held)} held out as {a.cloze_out} "
          f"and {order} of them as {a.order_out}")


if __name__ == "__main__":
    main()
