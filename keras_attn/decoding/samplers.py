"""Samplers: how each next token is chosen, as small serializable objects (keras-hub's
`keras_hub.samplers`, on the decoding loops of `keras_attn.decoding`).

- `Greedy()`: the most likely token;
- `Beam(num_beams=4, length_penalty=0.6)`: beam search with GNMT's length normalization;
- `Random(temperature=1.0, seed=None)`: a draw from the whole distribution;
- `TopK(k=5, ...)`, `TopP(p=0.1, k=None, ...)`, `MinP(min_p=0.1, ...)`: a draw from the `k`
  most likely tokens, the nucleus of probability `p`, or the tokens at least `min_p` times as
  likely as the most likely one;
- `RepetitionPenalty(penalty, sampler="greedy")`: any sampler (beam search included) with the
  logits of the tokens already in the sequence, prompt included, penalized first.

Each is checked once, when it is made (a ValueError naming the argument), and chooses with
`keras.ops` (`get_next_token`), so it runs inside the compiled loops on TensorFlow, JAX and
torch. Its numbers (`temperature`, `k`, `p`, `min_p`, `seed`, `length_penalty`, `penalty`)
enter the compiled program as scalar tensors: one program serves every value, and a
SavedModel can take them as request inputs (a sampler may be made from tensors inside a traced
function; they are then checked when the program runs). Only `num_beams` shapes the program.

A repetition penalty is a wrapper rather than a field of every sampler: one class for one idea
that composes with every sampler, a user's own and beam search included, keeping each
sampler's arguments its own (keras-hub's); the penalty applies to the raw logits before any
temperature or filter, as in Hugging Face's `generate`.

`get(identifier)` takes a name (`"greedy"`, `"beam"`, `"random"`, `"top_k"`, `"top_p"`,
`"min_p"`), a config (`serialize(sampler)`) or a sampler; every sampler is registered under
the package `"keras_attn"` and saved in a `.keras` file with its task.
"""

from __future__ import annotations

import copy

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_int
from keras_attn.decoding import checks, choices


class Sampler:
    """The base class: chooses the next token of each row from a step's logits.

    A subclass overrides `process_logits` (the distribution chosen from) and, when it does not
    take the most likely token, `get_next_token`; it lists in `numbers` the attributes that are
    numbers (they become tensors in the compiled program: read them in these two methods, never
    elsewhere, and they may be tensors there) and returns its arguments in `get_config`.

    Example:
    >>> class Cold(keras_attn.decoding.samplers.Sampler):
    ...     def get_next_token(self, logits, token_ids, index):
    ...         return keras.ops.cast(keras.ops.argmax(logits, axis=-1), "int32")
    """

    numbers: tuple = ()  # the numeric attributes, in the order of `tensors()`
    integers: tuple = ()  # those of `numbers` that are integers
    children: tuple = ()  # attributes holding samplers (a wrapper's)

    def process_logits(self, logits, token_ids, index):
        """The logits the next token is chosen from.

        Args:
            logits: float32 `(B, V)`, a step's logits (ids never emitted at a very low
                value).
            token_ids: int32 `(B, L)`: the sequences, positions `0..index` so far (the
                prompt included); the later positions are to be ignored.
            index: scalar int32 tensor, the position of the last token (it also numbers the
                step for a seeded draw).

        Returns:
            float32 `(B, V)`.
        """
        return ops.cast(logits, "float32")

    def get_next_token(self, logits, token_ids, index):
        """The next token of each row, int32 `(B,)` (arguments of `process_logits`); by
        default the most likely one under `process_logits`."""
        return choices.greedy(self.process_logits(logits, token_ids, index))

    def beam(self) -> Beam | None:
        """The `Beam` that searches (a wrapper's inner one), or None: one token at a time."""
        return None

    # ---- the numbers as tensors of the compiled program ----------------------------------------

    def _number(self, name: str):
        """The attribute `name` as an int32 / float32 scalar tensor (a `seed` of None: a fresh
        one drawn from NumPy's global generator)."""
        value = getattr(self, name)
        if name == "seed" and value is None:
            value = int(np.random.randint(0, checks.INT32_MAX))
        elif value is None:  # an optional limit: 0 = none
            value = 0
        return checks.as_tensor(value, name in self.integers)

    def _size(self) -> int:
        return len(self.numbers) + sum(getattr(self, c)._size() for c in self.children)

    def tensors(self) -> tuple:
        """The numbers (`numbers`, then the children's) as scalar tensors, in order."""
        own = tuple(self._number(name) for name in self.numbers)
        return own + sum((getattr(self, c).tensors() for c in self.children), ())

    def bind(self, tensors):
        """A copy of this sampler with its numbers (and its children's) replaced by `tensors`
        (as `tensors()` orders them): what the compiled program runs."""
        bound = copy.copy(self)
        tensors = tuple(tensors)
        for name, value in zip(self.numbers, tensors):
            setattr(bound, name, value)
        rest = tensors[len(self.numbers):]
        for name in self.children:
            child = getattr(self, name)
            setattr(bound, name, child.bind(rest[:child._size()]))
            rest = rest[child._size():]
        return bound

    def compile_key(self) -> tuple:
        """What shapes the compiled program: the class and the arguments that are not numbers
        (one program serves every value of those)."""
        static = tuple(sorted((k, _hashable(v)) for k, v in vars(self).items()
                              if k not in self.numbers and k not in self.children))
        return (type(self),) + static + tuple(getattr(self, c).compile_key()
                                              for c in self.children)

    # ---- serialization ----------------------------------------------------------------------

    def _config_number(self, name: str):
        value = getattr(self, name)
        if value is not None and not isinstance(value, (int, float)):
            raise ValueError(
                f"{type(self).__name__} holds `{name}` as a tensor (made inside a traced "
                f"function), which a config cannot hold. Received: {name}={value!r}")
        return value

    def get_config(self) -> dict:
        return {name: self._config_number(name) for name in self.numbers}

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)

    def __repr__(self) -> str:
        try:
            config = self.get_config()
        except ValueError:  # tensor numbers
            config = {name: getattr(self, name) for name in self.numbers}
        config.update({name: getattr(self, name) for name in self.children})
        arguments = ", ".join(f"{k}={v!r}" for k, v in config.items())
        return f"{type(self).__name__}({arguments})"


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _checked(name: str, value, kind: tuple, optional: bool = False):
    """`checks.scalar` of a sampler argument (None passes where `optional`)."""
    if optional and value is None:
        return None
    return checks.scalar(name, value, kind)


@keras.saving.register_keras_serializable(package="keras_attn")
class Greedy(Sampler):
    """The most likely next token (`Beam(1)`, `TopK(1)` and a `temperature=0` draw choose the
    same).

    Example:
    >>> keras_attn.decoding.generate(model, prompt_ids, 32, sampler=Greedy())
    """


@keras.saving.register_keras_serializable(package="keras_attn")
class Beam(Sampler):
    """Beam search with GNMT length normalization: `num_beams` hypotheses per sequence, ranked
    by `log P(Y) / ((5 + |Y|) / 6) ** length_penalty` (see `keras_attn.decoding.loops`).

    Args:
        num_beams: int >= 1, hypotheses kept per sequence (1 is greedy search). It shapes
            the compiled program. Defaults to `4`.
        length_penalty: float >= 0, GNMT's exponent `alpha`: 0 ranks by log-probability, more
            favours longer outputs. It also normalizes the scores `generate` returns.
            Defaults to `0.6`.

    Example:
    >>> keras_attn.decoding.generate(model, source_ids, 20, sampler=Beam(4))

    References:
        Wu et al., 2016, "Google's Neural Machine Translation System",
        https://arxiv.org/abs/1609.08144
    """

    numbers = ("length_penalty",)

    def __init__(self, num_beams: int = 4, length_penalty: float = 0.6):
        check_int("num_beams", num_beams, 1)
        self.num_beams = int(num_beams)
        self.length_penalty = _checked("length_penalty", length_penalty, checks.NON_NEGATIVE)

    def beam(self):
        return self

    def get_config(self) -> dict:
        return {"num_beams": self.num_beams, **super().get_config()}


@keras.saving.register_keras_serializable(package="keras_attn")
class Random(Sampler):
    """A draw from the model's distribution, `softmax(logits / temperature)`.

    The draw is seeded and stateless: the same `seed` gives the same tokens (on one backend,
    and on TensorFlow with the same `jit_compile`: XLA draws other numbers).

    Args:
        temperature: float >= 0: the logits are divided by it; 0 chooses the most likely
            token. Defaults to `1.0`.
        seed: optional int in `[0, 2**31 - 1]`. Defaults to `None`: a new seed at each
            `generate` call, drawn from NumPy's global generator (so
            `keras.utils.set_random_seed` makes a run repeatable).

    Example:
    >>> keras_attn.decoding.generate(model, prompt_ids, 32, sampler=Random(0.8, seed=7))
    """

    numbers = ("temperature", "seed")
    integers = ("seed",)

    def __init__(self, temperature: float = 1.0, seed: int | None = None):
        self.temperature = _checked("temperature", temperature, checks.TEMPERATURE)
        self.seed = _checked("seed", seed, checks.SEED, optional=True)

    def filter(self, logits):
        """The filter applied after the temperature (none here)."""
        return logits

    def process_logits(self, logits, token_ids, index):
        return self.filter(choices.scale(logits, self._number("temperature")))

    def get_next_token(self, logits, token_ids, index):
        temperature = self._number("temperature")
        drawn = choices.sample(self.process_logits(logits, token_ids, index),
                               self._number("seed"), index)
        return ops.where(temperature > 0, drawn, choices.greedy(logits))


@keras.saving.register_keras_serializable(package="keras_attn")
class TopK(Random):
    """A draw from the `k` most likely tokens (Fan et al., 2018), after the temperature.

    Args:
        k: int >= 1, tokens kept (those tied with the k-th are kept too). Defaults to `5`.
        temperature, seed: as `Random`.

    Example:
    >>> keras_attn.decoding.generate(model, prompt_ids, 32, sampler=TopK(40, seed=1))
    """

    numbers = ("k", "temperature", "seed")
    integers = ("k", "seed")

    def __init__(self, k: int = 5, temperature: float = 1.0, seed: int | None = None):
        super().__init__(temperature, seed)
        self.k = _checked("k", k, checks.POSITIVE_INT)

    def filter(self, logits):
        return choices.top_k_filter(logits, self._number("k"))


@keras.saving.register_keras_serializable(package="keras_attn")
class TopP(Random):
    """Nucleus sampling (Holtzman et al., 2020): a draw from the smallest set of most likely
    tokens whose probability reaches `p`, after the temperature and an optional top-k.

    Args:
        p: float in (0, 1]: the token that crosses `p` is kept, and always the most likely
            one; 1 keeps every token. Defaults to `0.1`.
        k: optional int >= 0, only the `k` most likely tokens are considered first (as
            `TopK`); None or 0: all of them. Defaults to `None`.
        temperature, seed: as `Random`.

    Example:
    >>> keras_attn.decoding.generate(model, prompt_ids, 32, sampler=TopP(0.9, seed=1))

    References:
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration",
        https://arxiv.org/abs/1904.09751
    """

    numbers = ("p", "k", "temperature", "seed")
    integers = ("k", "seed")

    def __init__(self, p: float = 0.1, k: int | None = None, temperature: float = 1.0,
                 seed: int | None = None):
        super().__init__(temperature, seed)
        self.p = _checked("p", p, checks.PROBABILITY)
        self.k = _checked("k", k, checks.NON_NEGATIVE_INT, optional=True)

    def filter(self, logits):
        return choices.top_p_filter(choices.top_k_filter(logits, self._number("k")),
                                    self._number("p"))


@keras.saving.register_keras_serializable(package="keras_attn")
class MinP(Random):
    """Min-p sampling (Nguyen et al., 2024): a draw from the tokens whose probability, after the
    temperature, is at least `min_p` times the most likely token's (`transformers`'
    `MinPLogitsWarper`).

    Args:
        min_p: float in [0, 1]; 0 keeps every token, 1 only the most likely. Defaults to
            `0.1`.
        temperature, seed: as `Random`.

    Example:
    >>> keras_attn.decoding.generate(model, prompt_ids, 32, sampler=MinP(0.05, seed=1))

    References:
        Nguyen et al., 2024, "Turning Up the Heat: Min-p Sampling for Creative and Coherent
        LLM Outputs", https://arxiv.org/abs/2407.01082
    """

    numbers = ("min_p", "temperature", "seed")
    integers = ("seed",)

    def __init__(self, min_p: float = 0.1, temperature: float = 1.0, seed: int | None = None):
        super().__init__(temperature, seed)
        self.min_p = _checked("min_p", min_p, checks.FRACTION)

    def filter(self, logits):
        return choices.min_p_filter(logits, self._number("min_p"))


@keras.saving.register_keras_serializable(package="keras_attn")
class RepetitionPenalty(Sampler):
    """`sampler` with the logits of the tokens already in the sequence (prompt included)
    divided by `penalty` where positive and multiplied by it where negative, before anything
    else (Keskar et al., 2019; `transformers`' `RepetitionPenaltyLogitsProcessor`). With
    `Beam` the penalty applies to each hypothesis' step log-probabilities, as `transformers`
    does.

    Args:
        penalty: float > 0; above 1 discourages repeating a token, below 1 encourages it,
            1 changes nothing.
        sampler: the sampler it wraps: a name, a config or a sampler (`get`). Defaults to
            `"greedy"`.

    Example:
    >>> sampler = RepetitionPenalty(1.3, TopP(0.9, seed=1))
    >>> keras_attn.decoding.generate(model, prompt_ids, 64, sampler=sampler)

    References:
        Keskar et al., 2019, "CTRL: A Conditional Transformer Language Model for Controllable
        Generation", https://arxiv.org/abs/1909.05858
    """

    numbers = ("penalty",)
    children = ("sampler",)

    def __init__(self, penalty: float, sampler="greedy"):
        self.penalty = _checked("penalty", penalty, checks.POSITIVE)
        self.sampler = get(sampler)

    def _penalized(self, logits, token_ids, index):
        return choices.repetition_penalty(ops.cast(logits, "float32"), token_ids, index,
                                          self._number("penalty"))

    def process_logits(self, logits, token_ids, index):
        return self.sampler.process_logits(self._penalized(logits, token_ids, index),
                                           token_ids, index)

    def get_next_token(self, logits, token_ids, index):
        return self.sampler.get_next_token(self._penalized(logits, token_ids, index),
                                           token_ids, index)

    def beam(self):
        return self.sampler.beam()

    def get_config(self) -> dict:
        return {**super().get_config(), "sampler": serialize(self.sampler)}

    @classmethod
    def from_config(cls, config: dict):
        return cls(config["penalty"], get(config["sampler"]))


NAMES = {"greedy": Greedy, "beam": Beam, "random": Random, "top_k": TopK, "top_p": TopP,
         "min_p": MinP}
_CLASSES = {cls.__name__: cls for cls in (*NAMES.values(), RepetitionPenalty)}


def serialize(sampler: Sampler) -> dict:
    """The config of `sampler` (`keras.saving.serialize_keras_object`), for `get`."""
    return keras.saving.serialize_keras_object(sampler)


def deserialize(config: dict, custom_objects: dict | None = None) -> Sampler:
    """The sampler of a config of `serialize`."""
    return keras.saving.deserialize_keras_object(
        config, module_objects=_CLASSES, custom_objects=custom_objects,
        printable_module_name="samplers")


def get(identifier) -> Sampler:
    """A sampler from a name, a config or a sampler (keras-hub's `samplers.get`).

    Args:
        identifier: `"greedy"`, `"beam"`, `"random"`, `"top_k"`, `"top_p"` or `"min_p"` (the
            class with its defaults), a config of `serialize` (a dict), a `Sampler` (returned
            as it is) or a `Sampler` subclass (made with its defaults).

    Returns:
        A `Sampler`.

    Raises:
        ValueError: naming `sampler`, for anything else.

    Example:
    >>> get("top_p")  # TopP(p=0.1, k=None, temperature=1.0, seed=None)
    >>> get(serialize(TopK(40)))  # TopK(k=40, temperature=1.0, seed=None)
    """
    expected = (f"one of the names {tuple(NAMES)}, a config of "
                "keras_attn.decoding.samplers.serialize or a Sampler")
    if isinstance(identifier, Sampler):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Sampler):
        return identifier()
    if isinstance(identifier, str) and identifier in NAMES:
        return NAMES[identifier]()
    if isinstance(identifier, dict):
        sampler = deserialize(identifier)
        if isinstance(sampler, Sampler):
            return sampler
    raise ValueError(f"Received an invalid value for argument `sampler`, expected {expected}. "
                     f"Received: sampler={identifier!r}")
