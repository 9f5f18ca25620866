"""`RecentWindow`: the newest tokens' keys and values also kept exact, beside their codes.

Why: on the shipped model at 4k tokens most of a 4-bit cache's KL comes from the few newest
tokens, the current one included (a step otherwise attends to its own quantized key): reading
the last 32 exactly lowers rotated affine-4's KL about 3x for 32 x (D + Dv) x 2 bytes per layer
and KV head (docs/results.md). KIVI keeps such a residual window (Liu et al., 2024, arXiv
2402.02750); here it is an overlay on any per-token codec: every token is still encoded, and a
query at position t reads the keys and values at t - W < p <= t from the exact copy instead of
the codes. The rule is per query, so a prompt gives the same result whether it is prefilled in
one chunk, in many, or token by token; and trimming, batching and persistence never requantize.

Layout: the window is aligned to the end of the token buffer, slot j of C holding position
`end - C + j`; `valid` [B, C] says which slots hold a real token's exact copy (a slot moved out of
the held range by a trim or a per-row roll reads codes again). Between calls C is the reach W.
During a call the chunk's own L tokens are held too (C = W + L, the chunk's keys exist anyway),
so every query of the chunk finds its W predecessors; `shrink` drops them after attention. While
a batch prefills right-padded prompts, rows end in `pads[b]` padding tokens and the window keeps
max-padding more slots; `settle` keeps each row's W real ones once the padding is rolled left.
Keys and values are held in the codec's attention frame (`TokenCodec.window_keys` and
`window_values`, e.g. rotated), in the dtype they arrived in.
"""

from __future__ import annotations

import mlx.core as mx

TOKEN_AXIS = 2


class RecentWindow:
    """Exact copies of the last C buffer positions: keys [B, H, C, D], values [B, H, C, Dv]."""

    def __init__(self, keys: mx.array, values: mx.array, valid: mx.array, reach: int | None = None) -> None:
        self.keys, self.values, self.valid = keys, values, valid  # valid: [B, C] bool
        self.reach = self.size if reach is None else reach  # W: how far back a query reads exactly
        self.pads: mx.array | None = None  # [B]: padding tokens ending each row (a padded prefill)

    @classmethod
    def empty(cls, reach: int, like_keys: mx.array, like_values: mx.array, batch: int | None = None) -> RecentWindow:
        """A window of `reach` slots, none valid, shaped like [B, H, *, D] keys and values."""
        B = like_keys.shape[0] if batch is None else batch
        keys = mx.zeros((B, like_keys.shape[1], reach, like_keys.shape[3]), like_keys.dtype)
        values = mx.zeros((B, like_values.shape[1], reach, like_values.shape[3]), like_values.dtype)
        return cls(keys, values, mx.zeros((B, reach), mx.bool_), reach)

    @property
    def size(self) -> int:
        return self.keys.shape[TOKEN_AXIS]

    def arrays(self) -> list[mx.array]:
        return [self.keys, self.values, self.valid]

    # --- moves: each keeps the window aligned to the buffer's end ---
    def append(self, keys: mx.array, values: mx.array, spare: int = 0) -> None:
        """The buffer grew by L tokens (keys [B, H, L, D]): they become the newest slots, and
        W + L + `spare` slots are held until `shrink` (the chunk's queries read W back)."""
        L = keys.shape[TOKEN_AXIS]
        self.keys = mx.concatenate([self.keys, keys], axis=TOKEN_AXIS)  # [B, H, C + L, D]
        self.values = mx.concatenate([self.values, values], axis=TOKEN_AXIS)
        self.valid = mx.concatenate([self.valid, mx.ones((keys.shape[0], L), mx.bool_)], axis=1)  # [B, C + L]
        self.shrink(L + spare)

    def shrink(self, spare: int = 0) -> None:
        """Hold the newest W + `spare` slots (after a call's attention: its chunk is read)."""
        C = self.reach + spare
        if self.size < C:  # grow on the old side, holding nothing there
            room = C - self.size
            self.keys, self.values = (mx.pad(a, [(0, 0), (0, 0), (room, 0), (0, 0)]) for a in (self.keys, self.values))
            self.valid = mx.pad(self.valid, [(0, 0), (room, 0)])
        elif self.size > C:
            self.keys, self.values = mx.contiguous(self.keys[:, :, -C:]), mx.contiguous(self.values[:, :, -C:])
            self.valid = mx.contiguous(self.valid[:, -C:])

    def settle(self) -> None:
        """After a padded prefill (padding rolled into the left): keep each row's W slots that end
        before its padding, which now end at the buffer's end."""
        if self.pads is None:
            return
        start = self.size - self.pads - self.reach  # [B]: first slot kept per row
        self._gather(start[:, None] + mx.arange(self.reach)[None])  # [B, W]
        self.pads = None

    def trim(self, n: int) -> None:
        """The buffer lost its last n tokens: slots shift right, the oldest n are no longer held."""
        if n > 0:
            self.roll_rows(mx.full((self.keys.shape[0],), n, mx.int32))

    def roll_rows(self, shifts: mx.array) -> None:
        """Each row's tokens moved right by shifts[b] buffer positions (left padding grew by it):
        the window keeps what is still inside it; the slots rolled in hold nothing exact."""
        self._gather(mx.arange(self.size)[None] - shifts[:, None])  # [B, C]: slot each slot now reads from

    def _gather(self, source: mx.array) -> None:
        """Slots [B, n] taken from `source` slots per row; a source outside the window holds nothing."""
        inside = (source >= 0) & (source < self.size)
        index = mx.clip(source, 0, self.size - 1)
        self.valid = mx.take_along_axis(self.valid, index, axis=1) & inside
        gather = index[:, None, :, None]  # [B, 1, n, 1]
        self.keys = mx.take_along_axis(self.keys, gather, axis=TOKEN_AXIS)
        self.values = mx.take_along_axis(self.values, gather, axis=TOKEN_AXIS)

    def rows(self, rows: mx.array | slice) -> RecentWindow:
        """Owned copies of the given batch rows (between prefills: no padding pending)."""
        keys, values, valid = (mx.contiguous(a[rows]) for a in self.arrays())
        return RecentWindow(keys, values, valid, reach=self.reach)

    @staticmethod
    def concat(windows: list[RecentWindow]) -> RecentWindow:
        """Rows of several windows, all aligned to one buffer end, as one batch (each shrunk to W:
        a window appended to but not yet attended with holds its chunk too)."""
        for w in windows:
            w.shrink()
        keys, values, valid = (mx.concatenate([w.arrays()[i] for w in windows]) for i in range(3))
        return RecentWindow(keys, values, valid, reach=windows[0].reach)


class WindowRead:
    """How one attention call of L queries (the last L of `end` positions) reads the window."""

    def __init__(self, window: RecentWindow, end: int, n_queries: int) -> None:
        self.window, self.end, self.first_query = window, end, end - n_queries

    def _span(self, qs: int, qe: int, start: int, stop: int) -> tuple[int, int, int, mx.array] | None:
        """(first and end offset in the block, first slot, exact-read mask [B, 1, 1, Lq, m]) of keys
        [start, stop) for queries [qs, qe) of the call; None when none of them reads it exactly."""
        w = self.window
        base = self.end - w.size  # buffer position of slot 0
        lo = max(start, base, self.first_query + qs - w.reach + 1)  # the oldest key a query reads exactly
        hi = min(stop, self.first_query + qe)  # keys after the newest query are never read
        if lo >= hi:
            return None
        t = mx.arange(self.first_query + qs, self.first_query + qe)[:, None]  # [Lq, 1] query positions
        p = mx.arange(lo, hi)[None]  # [1, m] key positions
        near = (t - p < w.reach) & (t >= p)  # [Lq, m]: p among t's W newest (t itself included)
        held = w.valid[:, lo - base : hi - base][:, None, None, None, :]  # [B, 1, 1, 1, m]
        return lo - start, hi - start, lo - base, near[None, None, None] & held

    def decode_part(self, q: mx.array) -> tuple[int, mx.array, mx.array, mx.array] | None:
        """A decode step's exact part (veloxd.kv.quant.onepass), None when the window reads nothing:
        (first position read, scores [B, Hkv, R, 1, m] with -inf where a slot is not read exactly,
        values [B, Hkv, 1, m, Dv], exact-read mask [B, 1, 1, 1, m]) for positions first..end.

        q [B, Hkv, R, 1, >= D]: the codec's rotated, pre-scaled queries."""
        w = self.window
        base = self.end - w.size  # buffer position of slot 0
        lo, hi = max(0, base, self.end - w.reach), self.end  # the one query (end - 1) reads lo..end exactly
        if lo >= hi:
            return None
        slot = lo - base
        # every position lo..end is among the query's W newest: what is held is what is read
        read = w.valid[:, slot : slot + hi - lo][:, None, None, None, :]  # [B, 1, 1, 1, m]
        keys = self.window.keys[:, :, None, slot : slot + hi - lo]  # [B, Hkv, 1, m, D]
        exact = (q[..., : keys.shape[-1]] @ keys.swapaxes(-1, -2).astype(q.dtype)).astype(
            mx.float32
        )  # [B, Hkv, R, 1, m]
        values = self.window.values[:, :, None, slot : slot + hi - lo]  # [B, Hkv, 1, m, Dv]
        return lo, mx.where(read, exact, -mx.inf), values, read

    def scores(self, s: mx.array, q: mx.array, qs: int, qe: int, start: int, stop: int) -> mx.array:
        """Scores s [B, Hkv, R, Lq, n] of keys [start, stop), exact q·k where the window reads
        (s is updated in place: pass scores nothing else holds).

        q [B, Hkv, R, Lq, >= D]: the codec's rotated queries, whose first D dims meet window_keys.
        """
        span = self._span(qs, qe, start, stop)
        if span is None:
            return s
        lo, hi, slot, read = span
        keys = self.window.keys[:, :, None, slot : slot + hi - lo]  # [B, Hkv, 1, m, D]
        exact = (q[..., : keys.shape[-1]] @ keys.swapaxes(-1, -2).astype(q.dtype)).astype(s.dtype)  # [B, Hkv, R, Lq, m]
        # a slice update, not a concatenation: MLX writes the band into s's buffer (s is the
        # caller's fresh scores, used nowhere else), 13% of a 512-token prefill's attention
        s[..., lo:hi] = mx.where(read, exact, s[..., lo:hi])
        return s

    def split(self, p: mx.array, qs: int, qe: int, start: int, stop: int) -> tuple[mx.array, mx.array | None]:
        """(weights p [B, Hkv, R, Lq, n] left for the codes, the window's exact part of p @ values)."""
        span = self._span(qs, qe, start, stop)
        if span is None:
            return p, None
        lo, hi, slot, read = span
        exact_p = mx.where(read, p[..., lo:hi], 0)  # [B, Hkv, R, Lq, m]
        codes_p = mx.concatenate([p[..., :lo], p[..., lo:hi] - exact_p, p[..., hi:]], axis=-1)
        values = self.window.values[:, :, None, slot : slot + hi - lo]  # [B, Hkv, 1, m, Dv]
        return codes_p, exact_p @ values.astype(p.dtype)  # [B, Hkv, R, Lq, Dv]
