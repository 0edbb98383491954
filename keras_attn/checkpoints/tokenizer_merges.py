"""The BPE merge loop of the `tokenizers` library, as TensorFlow ops, in parallel rounds.

`tokenizers` merges a word's pieces one pair at a time: always the pair of lowest merge rank,
the leftmost one among equals, until no pair has a merge. Done literally in a graph (one merge
per round over the whole word, as keras-hub's `BytePairTokenizer` does), a word of n bytes
takes about n rounds of O(n) work: 800 CJK characters took 4.6 s, 10,000 digits 44 s.

`BytePairMerger` reaches the same result in a few rounds (5-14 on 10,000-character words of
CJK, digits, spaces or letters without a space, against up to 7 for ordinary words) by making
in each round every merge that provably comes next at its place, whatever happens elsewhere:

1. the word's lowest-ranked pair, at every place it occurs (a run `a a a` pairs from its left
   end: `aa a`): after it merges, every pair with the new token ranks after it (the merge is
   *consistent*), so `tokenizers` merges all of them in a row; for an inconsistent merge only
   its leftmost place (one step of `tokenizers`' loop);
2. every other pair `(x_i, x_i+1)` of rank r with a consistent merge that nothing can reach
   before rank r: walking left from `x_i`, the pairs passed rank after r, and the walk ends
   at the word's start or at a token `x_j` that no token ending with `x_j-1`'s text can merge
   with below rank r (`left_bound`); the same to the right (`right_bound`). Then no merge of
   `tokenizers`' loop touches `x_i` or `x_i+1` before it takes this pair, and taking it first
   changes none of the merges before it (the new token's pairs rank after r).

Both rules are exact for any merge list; the walks look at most `depth` tokens each way (a
longer walk is not followed, the pair waits for a later round). A token that no token ending
with its left neighbour's text nor any starting with its right neighbour's text merges with
never changes: it leaves the rounds, and the two sides of it go on as independent pieces (no
merge crosses it; rule 1 then takes the lowest rank of each piece). So the rounds shrink to
the tokens still merging, and the work is about linear in the length of a word. Words seen
before come from a bounded cache (the word's bytes are checked, not only a hash).
"""

from __future__ import annotations

import tensorflow as tf

from keras_attn.checkpoints.tokenizer_base import MARK, refuse_tokenizer
from keras_attn.checkpoints.tokenizer_ragged import place_rows

# Token ids are stored in the cache as code points, past the UTF-16 surrogates.
_SURROGATES, _SURROGATE_COUNT = 0xD800, 0x800
_MAX_CACHED_ID = 0x10FFFF - _SURROGATE_COUNT


# A pair's rank, left bound and right bound packed in one int64 (one lookup per pair).
_BITS = 21
_FIELD = (1 << _BITS) - 1


def merge_ranks(vocab: dict[str, int], merges: list) -> dict[tuple[int, int], tuple[int, int]]:
    """`(left id, right id) -> (rank, merged id)`, as `tokenizers` reads `model.merges` (a
    pair listed twice keeps its last rank); a merge naming a token outside the vocabulary, or
    whose result is outside it, is refused as `tokenizers` refuses it."""
    ranks = {}
    for rank, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(parts) != 2 or not all(isinstance(part, str) for part in parts):
            refuse_tokenizer(f"model.merges[{rank}]", merge, "expected two tokens")
        left, right = parts
        for token in (left, right, left + right):
            if token not in vocab:
                refuse_tokenizer(f"model.merges[{rank}]", merge,
                                 f"{token!r} is not in the vocabulary")
        ranks[(vocab[left], vocab[right])] = (rank, vocab[left + right])
    return ranks


class BytePairMerger(tf.Module):
    """The BPE model of a `tokenizer.json` on pre-tokenized words, as TensorFlow ops.

    Args:
        vocab: dict from token (in the model's alphabet) to id.
        merges: list of `"a b"` strings or `[a, b]` pairs, in rank order.
        byte_tokens: list of 256 str, the token of every byte (GPT-2's `ByteLevel` alphabet).
        ignore_merges: bool, keep a word that is a token whole (Llama 3). Defaults to `False`.
        depth: int, how far the walks of rule 2 look (see the module docstring). Defaults
            to `4`.
        cache_size: int, how many distinct words (of at most 256 bytes) the cache keeps; 0
            turns it off (the attribute `cache_size` is read when `merge` is traced).
            Defaults to `65536`.

    The attribute `inconsistent` counts the merges that a lower-ranked merge of their own
    result can undercut (rule 1 takes those at one place per round; trained merge lists
    have none).

    Example:
    >>> merger = BytePairMerger({"a": 0, "b": 1, "ab": 2, ...}, ["a b"], byte_tokens)
    >>> merger.merge(tf.constant(["abab"])).to_list()  # [[2, 2]]
    """

    def __init__(self, vocab: dict[str, int], merges: list, byte_tokens: list[str],
                 ignore_merges: bool = False, depth: int = 4, cache_size: int = 65536,
                 name=None):
        super().__init__(name=name)
        ranks = merge_ranks(vocab, merges)
        size = max(vocab.values(), default=0) + 1
        self._size = size
        self._depth = depth
        self._none = count = max(len(merges), 1)  # the rank of a pair without a merge
        if count > _FIELD:
            refuse_tokenizer("model.merges", f"{count} merges", f"at most {_FIELD} are packed")
        merged, consistent = [0] * count, [False] * (count + 1)
        first_use = {}  # token id -> lowest rank of a merge it is a part of
        for (left, right), (rank, _) in ranks.items():
            for token in (left, right):
                first_use[token] = min(first_use.get(token, count), rank)
        for rank, result in ranks.values():
            merged[rank] = result
            consistent[rank] = first_use.get(result, count) > rank
        self._merged = tf.constant(merged, tf.int32)
        self._consistent = tf.constant(consistent)
        # merges some lower-ranked merge of their result undercuts: one place per round
        self.inconsistent = sum(not consistent[rank] for rank, _ in ranks.values())
        pairs = _pair_table(ranks, vocab, count)  # (u, v) -> [rank, left bound, right bound]
        keys = tf.constant(list(pairs), tf.int64, shape=[len(pairs)])
        packed = tf.constant([rank | left << _BITS | right << 2 * _BITS
                              for rank, left, right in pairs.values()], tf.int64,
                             shape=[len(pairs)])
        self._pairs = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            keys, packed), count | count << _BITS | count << 2 * _BITS)
        self._byte_ids = tf.constant([vocab[token] for token in byte_tokens], tf.int32)
        self._whole = None
        if ignore_merges:  # a word whose bytes are a token is that token
            inverse = {token: byte for byte, token in enumerate(byte_tokens)}
            words, ids = [], []
            for token, index in vocab.items():
                if token and all(char in inverse for char in token):
                    words.append(bytes(inverse[char] for char in token))
                    ids.append(index)
            self._whole = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(words, tf.string), tf.constant(ids, tf.int32)), -1)
        self.cache_size = cache_size if size <= _MAX_CACHED_ID else 0  # read when traced
        self._cache = tf.lookup.experimental.MutableHashTable(tf.int64, tf.string, "")

    def merge(self, words: tf.Tensor) -> tf.RaggedTensor:
        """Pre-tokenized words `(W,)` (their UTF-8 bytes) -> token ids `(W, None)` int32, as
        the `tokenizers` BPE model (`""` gives no id)."""
        words = tf.convert_to_tensor(words, tf.string)
        found = tf.equal(tf.strings.length(words), 0)  # nothing to look up
        parts = []  # (word indices, ids, ids per word) from the whole-word table, cache, merges
        if self._whole is not None:
            whole = self._whole.lookup(words)
            index = tf.where(~found & (whole >= 0))[:, 0]
            parts.append((index, tf.gather(whole, index), tf.ones_like(index)))
            found |= whole >= 0
        if self.cache_size:
            hit, ids, lengths = self._lookup(words, ~found)
            parts.append((tf.where(hit)[:, 0], ids, lengths))
            found |= hit
        index = tf.where(~found)[:, 0]
        unseen = tf.gather(words, index)
        ids, lengths = tf.cond(tf.size(unseen) > 0, lambda: self._merge_bytes(unseen)[:2],
                               lambda: (tf.zeros([0], tf.int32), tf.zeros([0], tf.int64)))
        if self.cache_size:
            ids = self._insert(unseen, ids, lengths)
        parts.append((index, ids, lengths))
        return place_rows(parts, tf.size(words, tf.int64))

    # --- the cache ------------------------------------------------------------------------

    def cached(self) -> tf.Tensor:
        """How many words the cache holds: int64 scalar."""
        return self._cache.size()

    def _keys(self, words):
        return tf.bitcast(tf.fingerprint(words), tf.int64)  # (W, 8) uint8 -> (W,)

    def _lookup(self, words, wanted):
        """Which `wanted` words are cached `(W,)`, and their ids and ids per word."""
        values = self._cache.lookup(self._keys(words))  # ids as code points, MARK, the word
        parts = tf.strings.split(values, sep=MARK, maxsplit=1)  # (W, 1 or 2)
        padded = parts.to_tensor(default_value="", shape=[None, 2])
        hit = wanted & (parts.row_lengths() == 2) & tf.equal(padded[:, 1], words)
        codes = tf.strings.unicode_decode(tf.boolean_mask(padded[:, 0], hit), "UTF-8")
        ids = codes.flat_values - tf.where(codes.flat_values > _SURROGATES, _SURROGATE_COUNT, 0)
        return hit, ids, codes.row_lengths()

    def _insert(self, words, ids, lengths):
        """Cache the words of at most 256 bytes while the cache has room; returns `ids`."""
        small = tf.strings.length(words) <= 256
        codes = ids + tf.where(ids >= _SURROGATES, _SURROGATE_COUNT, 0)
        encoded = tf.strings.unicode_encode(tf.RaggedTensor.from_row_lengths(codes, lengths),
                                            "UTF-8")
        values = tf.strings.join([encoded, words], separator=MARK)

        def insert():
            insert_op = self._cache.insert(self._keys(tf.boolean_mask(words, small)),
                                           tf.boolean_mask(values, small))
            with tf.control_dependencies([insert_op]):
                return tf.identity(ids)

        room = self._cache.size() < self.cache_size
        return tf.cond(room & tf.reduce_any(small), insert, lambda: ids)

    # --- the merges -----------------------------------------------------------------------

    def rounds(self, words: tf.Tensor) -> tf.Tensor:
        """How many rounds the merges of `words` `(W,)` take (their cost grows with it; the
        cache and whole-word table are not used): int32 scalar."""
        return self._merge_bytes(tf.boolean_mask(words, tf.strings.length(words) > 0))[2]

    def _merge_bytes(self, words):
        """Words `(U,)` of at least one byte -> merged ids, ids per word `(U,)` and the number
        of rounds."""
        pieces = tf.strings.bytes_split(words)  # (U, None) one byte each
        values = tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1])
        ids = tf.gather(self._byte_ids, tf.cast(values, tf.int32))  # (N,)
        pieces_of = tf.cast(pieces.value_rowids(), tf.int32)  # (N,) the word, then the piece
        places = tf.range(tf.size(ids))  # (N,) where each token starts, in all the bytes
        none = tf.zeros([0], tf.int32)

        def step(ids, pieces_of, places, done, done_places, _, rounds):
            ids, pieces_of, places, final, final_places, merged = self._round(
                ids, pieces_of, places)
            return (ids, pieces_of, places, tf.concat([done, final], 0),
                    tf.concat([done_places, final_places], 0), merged,
                    rounds + tf.cast(merged, tf.int32))

        unknown = tf.TensorShape([None])
        ids, _, places, done, done_places, _, rounds = tf.while_loop(
            lambda *state: state[5], step,
            (ids, pieces_of, places, none, none, tf.constant(True), tf.constant(0)),
            shape_invariants=(unknown,) * 5 + (tf.TensorShape([]),) * 2)
        order = tf.argsort(tf.concat([done_places, places], 0))  # (M,) back in text order
        ids = tf.gather(tf.concat([done, ids], 0), order)
        words_of = tf.searchsorted(tf.cast(pieces.row_splits[1:], tf.int32), tf.gather(
            tf.concat([done_places, places], 0), order), side="right")
        lengths = tf.math.unsorted_segment_sum(tf.ones_like(words_of, tf.int64), words_of,
                                               tf.size(words))
        return ids, lengths, rounds

    def _round(self, ids, rows, places):
        """One round: every merge that provably comes next (module docstring) is made, and
        the tokens that can never merge leave (`final`), splitting their piece of a word in
        two independent pieces.

        Args:
            ids: `(N,)` the tokens of the pieces being merged.
            rows: `(N,)` int32, the piece of every token, 0 ... P - 1 in order.
            places: `(N,)` int32, where every token starts among all the bytes.

        Returns:
            The new `ids`, `rows` and `places`, the final tokens and their places, and
            whether a pair was merged.
        """
        none, depth, words = self._none, self._depth, tf.size(ids)
        same = tf.equal(rows[:-1], rows[1:])  # (N - 1,) pair i = (ids[i], ids[i + 1])
        pair_keys = tf.cast(ids[:-1], tf.int64) * self._size + tf.cast(ids[1:], tf.int64)
        packed = self._pairs.lookup(pair_keys)

        def field(index):  # of every pair, `none` across words; (N - 1,)
            value = tf.cast(tf.bitwise.bitwise_and(
                tf.bitwise.right_shift(packed, index * _BITS), _FIELD), tf.int32)
            return tf.where(same, value, none)

        infinite = tf.fill([1], none)
        rank = tf.concat([field(0), infinite], 0)
        mergeable = rank < none  # (N,) pair i has a merge (the last of a row never)
        # rule 1: the lowest rank of each word, everywhere (runs paired from their left end)
        lowest = tf.gather(tf.math.unsorted_segment_min(rank, rows, words), rows)
        candidate = mergeable & tf.equal(rank, lowest)
        consistent = tf.gather(self._consistent, rank)
        position = tf.range(tf.size(ids))
        run_start = candidate & ~tf.concat([[False], candidate[:-1]], 0)
        run = tf.maximum(tf.cumsum(tf.cast(run_start, tf.int32)) - 1, 0)
        offset = position - tf.gather(_starts(run_start), run)  # in its run of candidates
        chosen = offset % 2 == 0
        if self.inconsistent:  # an inconsistent lowest merge: its leftmost place only
            leftmost = tf.equal(position, tf.gather(tf.math.unsorted_segment_min(
                tf.where(candidate, position, tf.size(ids)), rows, words), rows))
            chosen = tf.where(consistent, chosen, leftmost)
        chosen &= candidate
        # rule 2: pairs nothing can reach before their rank. The walk left of pair i passes
        # token ids[i - s] (s < depth) if the pair before it ranks after rank[i], and stops
        # there if no token ending with ids[i - s - 1] merges with it below rank[i] (left
        # bound); the same to the right. `none` across words and past the ends stops a walk.
        left_bound = tf.concat([infinite, field(1)], 0)  # (N,) of pair (ids[i - 1], ids[i])
        right_bound = tf.concat([field(2), infinite], 0)  # (N,) of pair (ids[i], ids[i + 1])
        size = tf.size(ids)

        def at(values):  # values[i + offset] for every i (`none` past the ends)
            padded = tf.concat([tf.fill([depth + 1], none), values, tf.fill([depth + 1], none)],
                               0)
            return lambda offset: padded[depth + 1 + offset:depth + 1 + offset + size]

        rank_at, left_at, right_at = at(rank), at(left_bound), at(right_bound)
        left_ok = right_ok = tf.zeros_like(mergeable)
        for step in range(depth - 1, -1, -1):  # the farthest token first
            left_ok = (rank_at(-step - 1) > rank) & ((left_at(-step) > rank) | left_ok)
            right_ok = (rank_at(step + 1) > rank) & ((right_at(step + 1) > rank) | right_ok)
        chosen |= mergeable & consistent & left_ok & right_ok
        merged = tf.where(chosen, tf.gather(self._merged, tf.minimum(rank, none - 1)), ids)
        # a token no token ending with its left neighbour's text nor any starting with its
        # right neighbour's merges with is final: no merge ever crosses it (nor is chosen)
        final = tf.equal(left_bound, none) & tf.equal(right_bound, none)
        stay = ~tf.concat([[False], chosen[:-1]], 0) & ~final  # a merged pair's right goes
        starts = tf.concat([[True], ~same | final[:-1]], 0)  # of a piece, after a final
        rows = tf.cumsum(tf.cast(tf.boolean_mask(starts, stay), tf.int32)) - 1
        more = tf.reduce_any(mergeable) & tf.reduce_any(stay)
        return (tf.boolean_mask(merged, stay), rows, tf.boolean_mask(places, stay),
                tf.boolean_mask(ids, final), tf.boolean_mask(places, final), more)


def _starts(flags):
    """Positions of the True entries of `flags` `(N,)`, with one 0 after them (so that a
    gather of index 0 is valid when there is none)."""
    return tf.concat([tf.cast(tf.where(flags)[:, 0], tf.int32), [0]], 0)


def _pair_table(ranks: dict, vocab: dict[str, int], none: int) -> dict[int, list[int]]:
    """`u * V + v -> [rank, left bound, right bound]` of every pair (u, v) with one of them
    (V: the id space; `none` where a pair has no merge or no bound): the rank of the merge
    `(u, v)`; the left bound, the lowest rank of a merge `(t, v)` where the text of t ends
    with the text of u; the right bound, of a merge `(u, t)` where t starts with v's text."""
    size = max(vocab.values(), default=0) + 1
    tokens = {index: token for token, index in vocab.items()}
    table = {}

    def lower(key, field, rank):
        entry = table.setdefault(key, [none, none, none])
        entry[field] = min(entry[field], rank)

    for (left, right), (rank, _) in ranks.items():
        lower(left * size + right, 0, rank)
        text = tokens[left]
        for cut in range(len(text)):
            suffix = vocab.get(text[cut:])
            if suffix is not None:
                lower(suffix * size + right, 1, rank)
        text = tokens[right]
        for cut in range(1, len(text) + 1):
            prefix = vocab.get(text[:cut])
            if prefix is not None:
                lower(left * size + prefix, 2, rank)
    return table
