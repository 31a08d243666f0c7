"""A second corpus mixed into training: the target's sampled replies beside its greedy ones.

A drafter trained on greedy replies only sees anchors (the last verified token) that are the
target's own argmax, which the target's hidden states already predict. At T = 1 every anchor is a
sample: on the held-out prompts answered at T = 1 the shipped `dflash` drafted slot 1 right 0.262
of the time where the target's own argmax reached 0.489 (0.630 against 0.781 on greedy replies;
scripts/reproduce/sampled_acceptance.py). `--mix-corpus DIR` adds such replies (`dcoco datagen
--temperature 1`) to the training split, `--mix-share` of it. Measured once, 1,500 steps half on
3,000 sampled replies did not move that number (results/smollm2-t1-drafters).

The held-out split stays the main corpus's, and a mixed record answering a held-out prompt (the
same prompt ids) is dropped, so held-out numbers keep meaning the same blocks. Ids of the two
corpora must differ: the feature cache looks records up by id.
"""

from __future__ import annotations

import random
import sys

from dcoco.data.distill import Sample, load_corpus
from dcoco.errors import DcocoError
from dcoco.paths import cache_dir, local
from dcoco.train.feature_cache import FeatureCache, build_feature_cache
from dcoco.train.feature_cache import open_features as open_corpus_features


def mix_in(config, train_set: list[Sample], heldout: list[Sample], block_size: int) -> list[Sample]:
    """`train_set` with the mix corpus's records added (none without one): as many main records
    kept (a fixed random subset) as leaves the mix `config.mix_share` of the result, or all."""
    if not config.mix_corpus:
        return train_set
    mixed = [
        s for s in load_corpus(local(config.mix_corpus), None, config.max_seq_len)
        if len(s.response_ids) >= block_size
    ]  # fmt: skip
    taken = {s.id for s in train_set} | {s.id for s in heldout}
    clashes = sorted({s.id for s in mixed} & taken)
    if clashes:
        raise DcocoError(
            f"--mix-corpus {config.mix_corpus} reuses {len(clashes)} ids of --corpus (e.g. "
            f"{clashes[0]}): give its records ids of their own"
        )
    heldout_prompts = {s.prompt_ids for s in heldout}
    mixed = [s for s in mixed if s.prompt_ids not in heldout_prompts]
    if not mixed:
        raise DcocoError(f"--mix-corpus {config.mix_corpus} has no record to train on")
    keep = round(len(mixed) * (1 - config.mix_share) / config.mix_share)
    main = train_set
    if keep < len(train_set):
        main = random.Random(config.seed).sample(train_set, keep)
    print(
        f"dcoco: training on {len(main)} records of the corpus and {len(mixed)} of "
        f"{config.mix_corpus}",
        file=sys.stderr,
    )
    return main + mixed


def open_features(config, target, taps: tuple[int, ...], samples, ranks):
    """dcoco.train.feature_cache.open_features, joined by the mix corpus's cached features (built
    where missing) when there is one; online features (TargetFeatures) serve any record as they
    are."""
    features = open_corpus_features(config, target, taps, samples, ranks)
    if not config.mix_corpus or not isinstance(features, FeatureCache):
        return features
    root = config.feature_cache or cache_dir()  # the main corpus's root (open_features)
    extra = build_feature_cache(target, taps, local(config.mix_corpus), root, ranks=ranks)
    shards = {**features.shards, **extra.shards}
    return FeatureCache(shards, features.device, features.dtype, features.online)
