"""Decoding loops on torch: a Python loop whose step runs as one compiled program.

`keras.ops.while_loop` is a Python loop on torch, and each of its steps runs the model's layers
one Keras call at a time (argument binding, name scopes, dtype checks around every matmul).
Inside `compiling(mode)` (what `keras_attn.decoding.compiled.run` opens on torch when it
compiles), the loops' `while_loop` runs the loop body (one token: the decoder step over the
static cache, the sampler, the writes) through `torch.compile`:

- `"eager"`: TorchDynamo captures the step as one graph and replays it, without Keras' Python
  around each op (on a CPU, where the kernels themselves are the same);
- `"inductor"` / `"reduce-overhead"`: the step compiled by Inductor, with CUDA graphs for
  `"reduce-overhead"` (on a GPU, where launching each kernel is what a step costs).

The step is compiled once per model and settings: TorchDynamo keeps what it compiled on the
body's code, guarded by the model (its modules) and the shapes and dtypes of the tensors, so a
later call with the same settings (a new prompt, a new temperature: tensors) reuses it.
`compilations()` counts what was compiled (the tests check that a second call adds nothing).
The loop's condition runs between the steps, in Python (one read of the "every row is done"
flag per token, as transformers' loop reads its stopping criteria).

With `on_step` (streaming), the loop runs in Python on every backend and hands its state out
after each step.
"""

from __future__ import annotations

import contextlib
import contextvars

from keras import ops

MODES = ("eager", "inductor", "reduce-overhead")

_MODE: contextvars.ContextVar = contextvars.ContextVar("keras_attn_step_mode", default=None)
_ON_STEP: contextvars.ContextVar = contextvars.ContextVar("keras_attn_on_step", default=None)
_BACKENDS: dict = {}
_COUNT = [0]


def compilations() -> int:
    """How many graphs the compiled decoding steps have compiled so far (in this process)."""
    return _COUNT[0]


@contextlib.contextmanager
def compiling(mode: str | None, on_step=None):
    """Run the decoding loops opened inside with their step compiled by `mode`.

    Args:
        mode: one of `MODES` (torch), or None: the step as it is (eagerly; inside a traced
            function, traced).
        on_step: optional `on_step(loop_vars) -> bool`, called after each step of the loop
            with its variables (`keras_attn.decoding.loops`: the index, then the token
            buffer, ...); True stops the loop there. With it the loop runs in Python on every
            backend. Defaults to `None` (`keras.ops.while_loop` where `mode` is None).
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"Argument `mode` must be one of {MODES} or None. Received: "
                         f"mode={mode!r}")
    tokens = (_MODE.set(mode), _ON_STEP.set(on_step))
    try:
        yield
    finally:
        _MODE.reset(tokens[0])
        _ON_STEP.reset(tokens[1])


def _backend(mode: str):
    """The `torch.compile` backend of `mode`, one object per mode (TorchDynamo keeps a compiled
    step for the backend it was compiled with), counting each graph it compiles."""
    if mode not in _BACKENDS:
        def backend(graph, example_inputs):
            _COUNT[0] += 1
            if mode == "eager":
                return graph.forward
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(graph, example_inputs,
                              config_patches={"triton.cudagraphs": mode == "reduce-overhead"})

        _BACKENDS[mode] = backend
    return _BACKENDS[mode]


def compiled_step(body):
    """`body` under `torch.compile` with the mode of the enclosing `compiling`, or `body`
    itself outside one."""
    mode = _MODE.get()
    if mode is None:
        return body
    import torch

    return torch.compile(body, backend=_backend(mode), dynamic=None)


def while_loop(cond, body, loop_vars: tuple) -> tuple:
    """`keras.ops.while_loop(cond, body, loop_vars)`, its body compiled (and its state handed
    out) as the enclosing `compiling` says."""
    on_step = _ON_STEP.get()
    if _MODE.get() is None and on_step is None:
        return ops.while_loop(cond, body, loop_vars)
    step = compiled_step(body)
    loop_vars = tuple(loop_vars)
    done = 0
    while bool(cond(*loop_vars)):
        with _guards(checked=_MODE.get() is None or done < _CHECKED_STEPS):
            loop_vars = tuple(step(*loop_vars))
        done += 1
        if on_step is not None and on_step(loop_vars):
            break
    return loop_vars


# Steps whose compiled code TorchDynamo picks by evaluating all its guards; after them the
# loop's variables keep their types, shapes and dtypes (a loop body returns what it takes), so
# the later steps skip the full evaluation (7.5 ms a step at GPT-2's size, a fifth of a step
# of a 4-layer d256 model on a CPU) and only tell apart the code compiled for other settings.
_CHECKED_STEPS = 2


def _guards(checked: bool):
    """A context where TorchDynamo evaluates every guard (`checked`) or only those that tell
    its compiled entries apart (`skip_guard_eval_unsafe`)."""
    if checked:
        return contextlib.nullcontext()
    import torch

    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
