"""The token table's two uses: the embedding at the bottom and the tied head at the top.

tok_emb is bound whole where it fits one binding. Where it does not, it is bound in chunks of rows
(layout.vocab_chunks); a chunk's logits are a column block of the logit rows, which the matmul
kernels cannot address, so each block passes through a dense scratch (embed.wgsl's copy_block), a
block of rows at a time. The forward's logits are the same sums over the same K in the same
order, bit for bit. The backward's sums over rows (dtok) and over the vocabulary (dx) are split
into blocks and chunks added in turn, so their float32 rounding differs (tests/model/test_model.py
bounds it).
"""
from __future__ import annotations

from ..device.gpu import Tensor
from ..device.kernels import Kernels
from .block import PolicyKernels
from .layout import head_block_rows, rows, vocab_chunks


def table_rows(t: Tensor, v0: int, n: int) -> Tensor:
    """Rows v0 .. v0+n-1 of a [VP, ...] table, as a tensor of its own."""
    return Tensor(t.buf, t.offset + 4 * v0 * t.shape[1], (n, t.shape[1]), t.dtype, t.name)


class Head:
    """logits [n, VP] = x [n, C] @ tok_emb^T, and in the backward dtok_emb and dx.

    tok: the float32 table [VP, C] (the embedding reads it); tok_read: the table as the head's
    matmuls read it (the policy's weight copy, or tok itself); scratch: the block scratch of the
    split head from the buffer table (None where the table is bound whole, or there is no head)."""

    def __init__(self, kn: Kernels, pk: PolicyKernels, tok: Tensor, tok_read: Tensor, C: int, max_rows: int,
                 scratch: Tensor | None):
        self.kn, self.pk, self.tok, self.tok_read, self.C = kn, pk, tok, tok_read, C
        self.VP = tok.shape[0]
        self.vchunks = vocab_chunks(self.VP, C, kn.gpu.max_binding)
        self.split = len(self.vchunks) > 1
        self.block, _ = head_block_rows(self.VP, C, max_rows, kn.gpu.max_binding)
        self.scratch = scratch

    def _blocks(self, n: int):
        """[(block index, first row, rows, vocab chunk index, first token, tokens, scratch)]"""
        out = []
        for b, s in enumerate(range(0, n, self.block)):
            nb = min(self.block, n - s)
            for j, (v0, nv) in enumerate(self.vchunks):
                blk = Tensor(self.scratch.buf, self.scratch.offset, (nb, nv), "f32", "head block")
                out.append((b, s, nb, j, v0, nv, blk))
        return out

    def forward(self, x: Tensor, logits: Tensor, n: int) -> list:
        """logits [n, VP] of x [n, C], capped where the block soft-caps them (core.block)."""
        kn, pk, VP, C, tok = self.kn, self.pk, self.VP, self.C, self.tok_read
        cap = [kn.losses.softcap(logits, n, VP, pk.block.softcap)] if pk.block.softcap else []
        if not self.split:
            return [pk.matmul_abt(x, tok, logits, n, VP, C)] + cap
        ds = []
        for _, s, nb, _, v0, nv, blk in self._blocks(n):
            ds += [pk.matmul_abt(rows(x, s, nb), table_rows(tok, v0, nv), blk, nb, nv, C),
                   kn.copy_block(blk, rows(logits, s, nb), nb, nv, nv, 0, VP, v0)]
        return ds + cap

    def backward(self, dl: Tensor, x: Tensor, dtok: Tensor, dx: Tensor, n: int, accumulate: bool) -> list:
        """dl [n, VP] dlogits, x [n, C] the head's input -> dtok [VP, C] (added to where
        `accumulate`; None: the table is frozen), dx [n, C] (written)."""
        kn, pk, VP, C, tok = self.kn, self.pk, self.VP, self.C, self.tok_read
        if not self.split:
            return ([pk.matmul_atb(dl, x, dtok, VP, C, n, accumulate=accumulate)] if dtok is not None else []) + \
                [pk.matmul(dl, tok, None, dx, n, C, VP)]
        ds = []
        for b, s, nb, j, v0, nv, blk in self._blocks(n):
            ds.append(kn.copy_block(rows(dl, s, nb), blk, nb, nv, VP, v0, nv, 0))
            if dtok is not None:
                ds.append(pk.matmul_atb(blk, rows(x, s, nb), table_rows(dtok, v0, nv), nv, C, nb,
                                        accumulate=accumulate or b > 0))
            ds.append(pk.matmul(blk, table_rows(tok, v0, nv), None, rows(dx, s, nb), nb, C, nv, accumulate=j > 0))
        return ds

    def embed(self, tokens: Tensor, pos: Tensor, out: Tensor, B: int, T: int, docs: Tensor | None = None) -> list:
        """out [B*T, C] = tok_emb[tokens] + pos_emb, one dispatch per chunk of the table (docs: a packed
        window's positions of each row in its record, the rows of pos_emb)."""
        return [self.kn.embed_forward(tokens, table_rows(self.tok, v0, nv), pos, out, B, T, self.C, v0, nv, docs)
                for v0, nv in self.vchunks]

    def embed_grad(self, buckets: Tensor, dout: Tensor, dtok: Tensor, B: int, T: int, V: int,
                   accumulate: bool = True) -> list:
        """dtok [VP, C] (+)= the embedding's gradient, rows of the first V tokens, chunk by chunk
        (added to the tied head's; written where the head has a table of its own)."""
        return [self.kn.embed_tok_grad(buckets, dout, table_rows(dtok, v0, min(nv, V - v0)), B, T, self.C, V,
                                       accumulate, v0, min(nv, V - v0))
                for v0, nv in self.vchunks if v0 < V]
