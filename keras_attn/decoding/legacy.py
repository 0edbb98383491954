"""keras_attn 0.2's spellings of the decoding functions, mapped onto today's: they keep working
for one release, each with a DeprecationWarning whose message says the new spelling.

- `generate(..., strategy=, temperature=, top_k=, top_p=, seed=, beam_size=,
  length_penalty=)` is `generate(..., sampler=...)` (`"greedy"`: `Greedy()`; `"sample"`:
  `TopP(p=top_p, k=top_k, temperature=temperature, seed=seed)`, the same filter and draw;
  `"beam"`: `Beam(beam_size, length_penalty)`); the scores keep 0.2's normalization by
  `length_penalty` (default 0.6) whatever the strategy;
- `eos_id` is `stop_token_ids`; `return_attention` is `return_attention_scores`;
- arguments after `max_length` given by position (0.2's order) are keyword-only.
"""

from __future__ import annotations

from keras_attn._checks import check_number, check_one_of, warn_deprecated
from keras_attn.decoding import samplers

SUFFIX = " (keras_attn 0.3 names, see CHANGELOG.md)."
# `generate`'s arguments after `max_length`, in keras_attn 0.2's order.
GENERATE_ORDER = ("max_new_tokens", "strategy", "temperature", "top_k", "top_p", "seed",
                  "beam_size", "length_penalty", "eos_id", "return_attention", "return_scores",
                  "jit_compile", "pad_id", "suppressed_ids", "prompt_lengths")
SAMPLING = ("strategy", "temperature", "top_k", "top_p", "seed", "beam_size", "length_penalty")
RENAMED = {"eos_id": "stop_token_ids", "return_attention": "return_attention_scores"}


def sampler_of(strategy: str = "greedy", temperature=1.0, top_k=0, top_p=1.0, seed=0,
               beam_size: int = 4, length_penalty: float = 0.6):
    """The sampler of keras_attn 0.2's settings (checked whatever the strategy, as they
    were)."""
    check_one_of("strategy", strategy, ("greedy", "sample", "beam"))
    check_number("length_penalty", length_penalty, 0)
    drawn = samplers.TopP(p=top_p, k=top_k, temperature=temperature, seed=seed)
    beam = samplers.Beam(beam_size, length_penalty)
    return {"greedy": samplers.Greedy(), "sample": drawn, "beam": beam}[strategy]


def generate_options(owner: str, args: tuple, kwargs: dict) -> dict:
    """Today's `generate` options for keras_attn 0.2's positional `args` (after `max_length`)
    and keyword `kwargs`, with one DeprecationWarning naming what changed.

    Returns:
        dict of today's names (`sampler`, `stop_token_ids`, `return_attention_scores`,
        `max_new_tokens`, ...) and `alpha`, the scores' length-penalty exponent of 0.2.

    Raises:
        TypeError: as Python does, for too many positional arguments, an unknown keyword or
            an argument given twice.
    """
    if len(args) > len(GENERATE_ORDER):
        raise TypeError(f"{owner}() takes 3 positional arguments but {len(args) + 3} were "
                        "given")
    old = dict(zip(GENERATE_ORDER, args))
    for name, value in kwargs.items():
        if name not in SAMPLING and name not in RENAMED:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        if name in old:
            raise TypeError(f"{owner}() got multiple values for argument {name!r}")
        old[name] = value
    used = []
    if args:
        used.append(f"arguments after `max_length` are keyword-only (received "
                    f"{', '.join(GENERATE_ORDER[:len(args)])} by position)")
    sampling = {name: old.pop(name) for name in SAMPLING if name in old}
    new = {"alpha": sampling.get("length_penalty", 0.6)}
    check_number("length_penalty", new["alpha"], 0)
    if sampling:
        new["sampler"] = sampler_of(**sampling)
        used.append(f"{', '.join(f'`{name}`' for name in sampling)} are a sampler: "
                    f"`sampler={new['sampler']!r}`")
    for name, renamed in RENAMED.items():
        if name in old:
            new[renamed] = old.pop(name)
            used.append(f"`{name}` is `{renamed}`")
    new.update(old)
    warn_deprecated(f"{owner}: " + "; ".join(used) + SUFFIX)
    return new


def warn_function(old: str, new: str) -> None:
    """The DeprecationWarning of a deprecated decoding function."""
    warn_deprecated(f"keras_attn.decoding.{old} is keras_attn.decoding.{new}" + SUFFIX)
