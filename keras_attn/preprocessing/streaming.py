"""Incremental detokenization: the text of continuations that grow one token at a time, handed
out in pieces that never change afterwards.

Decoding one more token can rewrite the end of a text: a byte-level BPE token may hold part
of a UTF-8 character (decoded as U+FFFD until the rest arrives); SentencePiece's byte fallback
decodes a run of byte tokens together, so one more byte can turn the whole run's valid
characters into U+FFFD (`<0x64><0x36>` is `"d6"`, `<0x64><0x36><0xB8>` three U+FFFD); a
WordPiece `##` piece joins the word before it, and WordPiece's cleanup removes the space
before punctuation (`"hello ,"` -> `"hello,"`; the `tokenizers` library cleans each token, so
never further back). So a piece is only handed out once it is settled: the common prefix of
the text of all the tokens and of the tokens before the last one (before the trailing run of
byte-fallback tokens, where there is one), without trailing U+FFFD; a row that has ended
hands out the rest. Stop strings end a row's text after the first
of them (kept), as `CausalLM.generate` cuts it, whichever pieces they straddle.

The pieces of a row, joined, are its text as decoded at once (`TextStream.finish` checks it).
"""

from __future__ import annotations

import re

import numpy as np

REPLACEMENT = "\ufffd"


def byte_fallback_tokens(tokenizer) -> np.ndarray | None:
    """Which ids of a SentencePiece tokenizer are byte-fallback tokens (`<0x41>`), or None
    (other kinds: their bytes are decoded all together)."""
    inner = getattr(tokenizer, "_tokenizer", None)
    if getattr(inner, "kind", None) != "sentencepiece":
        return None
    pattern = re.compile(r"<0x[0-9A-Fa-f]{2}>")
    return np.array([bool(pattern.fullmatch(token)) for token in inner.tokens], bool)


def _common_prefix(a: str, b: str) -> str:
    end = min(len(a), len(b))
    for i in range(end):
        if a[i] != b[i]:
            return a[:i]
    return a[:end]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to and including the earliest end of a stop string in it, and whether one
    was found."""
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return (text[:min(ends)], True) if ends else (text, False)


class TextStream:
    """The settled text of a batch of continuations as their tokens arrive.

    Args:
        tokenizer: the `keras_attn.preprocessing.Tokenizer` whose `detokenize` makes the text.
        lengths: int `(B,)`, each row's prompt length (its continuation starts there).
        limits: int `(B,)`, each row's end position (exclusive).
        stop_ids: tuple of int, the ids that end a row (excluded from the text).
        stops: tuple of str, stop strings (kept, the text ends after the first).
        prompts: optional list of str, the prompts as read: the text is then that of the
            prompt and its continuation detokenized as one sequence (as `CausalLM.generate`
            returns it), a stop string counting after the prompt only. Defaults to `None`
            (the continuations alone).
    """

    def __init__(self, tokenizer, lengths, limits, stop_ids=(), stops=(), prompts=None):
        self.tokenizer = tokenizer
        self.prompts = None if prompts is None else list(prompts)
        self.lengths = np.asarray(lengths, "int64")
        self.limits = np.asarray(limits, "int64")
        self.stop_ids, self.stops = tuple(stop_ids), tuple(stops)
        self.byte_tokens = byte_fallback_tokens(tokenizer)
        self.emitted = [""] * len(self.lengths)
        self.done = [False] * len(self.lengths)

    def _continuations(self, tokens, last: int) -> tuple[list[list[int]], list[int]]:
        """The rows' tokens to detokenize (with their prompts where `prompts` is given), and
        how many new tokens each holds."""
        rows, counts = [], []
        for row, start, limit in zip(np.asarray(tokens), self.lengths, self.limits):
            new = [int(t) for t in row[start:min(limit, last + 1)]]
            ends = [i for i, t in enumerate(new) if t in self.stop_ids]
            new = new[:ends[0]] if ends else new
            counts.append(len(new))
            rows.append(new if self.prompts is None else [int(t) for t in row[:start]] + new)
        return rows, counts

    def _cut(self, i: int, text: str) -> tuple[str, bool]:
        """`text` cut after its first stop string past the prompt, and whether it was."""
        offset = 0 if self.prompts is None else len(_common_prefix(self.prompts[i], text))
        rest, stopped = cut_at_stop(text[offset:], self.stops)
        return text[:offset] + rest, stopped

    def _texts(self, rows: list[list[int]]) -> list[str]:
        return [t.decode("utf-8") for t in self.tokenizer.detokenize(rows).numpy()]

    def update(self, tokens, last: int, finished) -> list[str]:
        """The new settled piece of every row (`""` where none) once `tokens` `(B, L)` hold
        the continuations up to position `last` (included); `finished` `(B,)` says which rows
        have ended (all their text is settled)."""
        rows, counts = self._continuations(tokens, last)
        finished = np.asarray(finished, bool)
        ended = [bool(finished[i]) or counts[i] >= self.limits[i] - self.lengths[i] or (
            self.stop_ids and counts[i] < last + 1 - self.lengths[i])
            for i in range(len(rows))]
        shorter = [row[:self._settled_tokens(row)] for row in rows]
        whole = self._texts(rows + shorter)
        pieces = []
        for i in range(len(rows)):
            if self.done[i]:
                pieces.append("")
                continue
            text = whole[i] if ended[i] else _common_prefix(whole[i], whole[len(rows) + i])
            if not ended[i]:
                text = text.rstrip(REPLACEMENT)
            text, stopped = self._cut(i, text)
            self.done[i] = ended[i] or stopped
            pieces.append(self._advance(i, text))
        return pieces

    def _settled_tokens(self, row: list[int]) -> int:
        """How many of `row`'s first tokens one more token cannot change the text of: all but
        the last, or all before the trailing run of byte-fallback tokens."""
        run = 0
        if self.byte_tokens is not None:
            size = len(self.byte_tokens)
            while run < len(row) and 0 <= row[-1 - run] < size and self.byte_tokens[
                    row[-1 - run]]:
                run += 1
        return max(len(row) - max(run, 1), 0)

    def _advance(self, i: int, text: str) -> str:
        if len(text) <= len(self.emitted[i]):
            return ""
        if not text.startswith(self.emitted[i]):  # pragma: no cover - a settled piece changed
            raise RuntimeError(f"Streamed text changed: {self.emitted[i]!r} -> {text!r}")
        piece = text[len(self.emitted[i]):]
        self.emitted[i] = text
        return piece

    def finish(self, texts: list[str]) -> list[str]:
        """The last piece of every row, given the rows' whole texts (as decoded at once)."""
        pieces = []
        for i, text in enumerate(texts):
            if not text.startswith(self.emitted[i]):  # pragma: no cover - never, by design
                raise RuntimeError(f"Streamed text {self.emitted[i]!r} is not a prefix of the "
                                   f"text {text!r}")
            pieces.append(self._advance(i, text))
            self.done[i] = True
        return pieces


def stream_pieces(decode, text_stream: TextStream, texts_of, first=None):
    """Run `decode(on_step)` (a decoding whose loop calls `on_step(loop_vars)` after each
    token and stops when it returns True; `keras_attn.decoding.stepwise.compiling`) in a
    thread and yield the new settled pieces of every row (a list of str, one per row) as the
    tokens arrive; the loop is stopped once every row's text has ended (a stop string), or when
    the caller stops iterating.

    Args:
        decode: `decode(on_step) -> tokens (B, L)`.
        text_stream: the `TextStream` of the rows.
        texts_of: `texts_of(tokens) -> list of str`, the rows' whole texts (as decoded at
            once): the last pieces complete them.
        first: optional list of str, yielded first (the prompts as read). Defaults to `None`.
    """
    import queue
    import threading

    from keras import ops

    updates: queue.Queue = queue.Queue()
    stop = threading.Event()

    def on_step(loop_vars):
        index, tokens, finished = loop_vars[:3]
        updates.put(("step", ops.convert_to_numpy(tokens), int(ops.convert_to_numpy(index)),
                     ops.convert_to_numpy(finished)))
        return stop.is_set()

    def work():
        try:
            updates.put(("end", ops.convert_to_numpy(decode(on_step))))
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            updates.put(("error", error))

    if first and any(first):
        yield list(first)
    thread = threading.Thread(target=work, name="keras_attn_stream", daemon=True)
    thread.start()
    try:
        while True:
            kind, *values = updates.get()
            while kind == "step" and not updates.empty():  # behind: the latest tokens only
                kind, *values = updates.get_nowait()
            if kind == "error":
                raise values[0]
            pieces = (text_stream.finish(texts_of(values[0])) if kind == "end"
                      else text_stream.update(*values))
            if all(text_stream.done):
                stop.set()
            if any(pieces):
                yield pieces
            if kind == "end":
                return
    finally:
        stop.set()
        thread.join()
