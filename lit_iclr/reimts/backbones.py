"""Two IMTS encoder-decoder backbones, each with ReIMTS's irregularity-aware gated residual fusion (plain PyTorch).

Both take a (sub-)sample as `x, x_mask` (R, L, V), `x_time` (R, L) in [0, 1], forecast queries `q_time` (R, Q) with
`q_mask` (R, Q, V), and the sub-sample's window `start, end` (R,), and return predictions (R, Q, V) plus the
representation ReIMTS hands to the next level:

* `GraFITi` (Yalavarthi et al., AAAI 2024): the sample is a bipartite graph of channel nodes and time nodes whose edges
  are the observations (and the forecast queries); graph attention alternates channel <- edges and time <- edges and
  updates edges from both ends; the prediction is read from each query edge. Representation: per-variable channel
  embeddings (R, V, D); fusion `E_chan <- E_chan + sigmoid(W r) * r` before the attention layers.
* `MTAN` (Shukla & Marlin, ICLR 2021, mTAND encoder-decoder): multi-time attention from reference points to the
  observations (per variable, masked), a bidirectional GRU over the reference points gives the latent z; the decoder
  runs a GRU over z and attends from the query times to the reference points. Representation: z at the reference points
  (R, n_ref, D) (per-time); a child gets the parent's z at its own reference times, mixed by a learnable map P
  (r~ = (r^T P)^T) and fused as `z <- z + sigmoid(W r~) * r~` before decoding.

A level whose forecast nothing reads (every level above the finest: only its representation goes down) keeps just
the encoder of that representation (`drop_decoder`): the modules that only make its forecast would get no gradient,
which DDP refuses (and they cost compute). Its forward then returns `(None, representation)`.

GraFITi works on the list of edges (segment softmax over each node's edges); mTAN's masked attention is dense over the
(reference point x time slot x variable) grid. Every op is batched over all sub-samples at once.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class GatedFusion(nn.Module):
    """Irregularity-aware gated residual fusion: h <- h + sigmoid(W r) * r (ReIMTS, representation fusion)."""

    def __init__(self, d: int):
        super().__init__()
        self.gate = nn.Linear(d, d)

    def forward(self, h: Tensor, r: Tensor) -> Tensor:
        return h + torch.sigmoid(self.gate(r)) * r


# ----------------------------------------------------------------------------------------------------------- GraFITi
def segment_softmax(scores: Tensor, group: Tensor, n_groups: int) -> Tensor:
    """Softmax of (E, H) edge scores within each group of edges (the edges incident to one node)."""
    H = scores.shape[1]
    idx = group.unsqueeze(1).expand(-1, H)
    top = scores.new_full((n_groups, H), -1e30).scatter_reduce(0, idx, scores, "amax", include_self=True)
    e = torch.exp(scores - top[group])
    return e / scores.new_zeros(n_groups, H).index_add_(0, group, e)[group]


class _GraphAttention(nn.Module):
    """Multi-head attention of nodes over their incident edges; keys/values from [edge, node at the other end].

    Only real edges (observations and queries) are touched, as in GraFITi's sparse graph: the cost is linear in the
    number of observations, not in the size of the (time x variable) grid.
    """

    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.h = n_heads
        self.q = nn.Linear(d, d)
        self.kv_edge = nn.Linear(d, 2 * d)
        self.kv_node = nn.Linear(d, 2 * d, bias=False)  # W [edge, other] = W_e edge + W_o other, other end per node
        self.ff = nn.Linear(d, d)

    def forward(self, node: Tensor, edge: Tensor, group: Tensor, other: Tensor, other_index: Tensor) -> Tensor:
        """node (N, D) query nodes; edge (E, D); group (E,) query node of each edge; other (M, D), other_index (E,)."""
        N, D = node.shape
        dh = D // self.h
        kv = (self.kv_edge(edge) + self.kv_node(other)[other_index]).view(-1, 2, self.h, dh)
        k, v = kv[:, 0], kv[:, 1]
        q = self.q(node).view(N, self.h, dh)
        att = segment_softmax((q[group] * k).sum(-1) / math.sqrt(dh), group, N)  # (E, H)
        msg = node.new_zeros(N, self.h, dh).index_add_(0, group, att.unsqueeze(-1) * v)
        out = node + msg.reshape(N, D)  # MAB: residual + feed-forward; a node without edges keeps its embedding
        return out + torch.relu(self.ff(out))


@torch.compiler.disable
def graph_edges(grid: Tensor, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The observation and query edges of a (R, T, V) grid: sample, time node and variable of each edge, whether it is
    an observation (time node < L), and the positions of the query edges.

    The number of edges depends on the data (`nonzero`), so under `torch.compile` this stays an eager island and the
    graphs before and after it take the edge count as a dynamic size."""
    r, ti, vi = grid.nonzero(as_tuple=True)
    is_ctx = ti < L
    return r, ti, vi, is_ctx, (~is_ctx).nonzero().squeeze(1)


class GraFITi(nn.Module):
    repr_kind = "variable"

    def __init__(self, n_vars: int, d_model: int = 32, n_layers: int = 2, n_heads: int = 4, fusion: bool = False):
        """
        Args:
            n_vars: Number of variables V (channel nodes).
            d_model: Width D of node and edge embeddings.
            n_layers: Graph attention layers.
            n_heads: Attention heads (must divide d_model).
            fusion: Build the gated fusion that takes a parent level's per-variable representation.
        """
        super().__init__()
        self.chan = nn.Parameter(torch.randn(n_vars, d_model) / math.sqrt(d_model))  # channel node init (one-hot @ W)
        self.time_init = nn.Linear(1, d_model)
        self.edge_init = nn.Linear(2, d_model)  # (value, 1 = observed context / 0 = query)
        self.chan_att = nn.ModuleList(_GraphAttention(d_model, n_heads) for _ in range(n_layers))
        self.time_att = nn.ModuleList(_GraphAttention(d_model, n_heads) for _ in range(n_layers))
        self.edge_nn = nn.ModuleList(nn.Linear(3 * d_model, d_model) for _ in range(n_layers))
        self.out = nn.Linear(3 * d_model, 1)
        self.fusion = GatedFusion(d_model) if fusion else None

    def drop_decoder(self) -> None:
        """Keep only what the channel embeddings C depend on: the forecast head `out` and the last layer's time and
        edge updates (which feed only the forecast read from the query edges) are removed."""
        self.out = None
        self.time_att, self.edge_nn = self.time_att[:-1], self.edge_nn[:-1]

    def forward(self, x, x_mask, x_time, q_time, q_mask, start=None, end=None, parent: Tensor | None = None):
        R, L, V = x.shape
        Q = q_time.shape[1]
        T = L + Q
        t = torch.cat([x_time, q_time], 1)  # (R, T) time nodes: observed slots then forecast queries
        grid = torch.cat([x_mask, q_mask], 1) > 0  # (R, T, V): the graph's edges, observations and queries
        r, ti, vi, is_ctx, q = graph_edges(grid, L)
        val = torch.where(is_ctx, x[r, ti.clamp(max=L - 1), vi], torch.zeros_like(ti, dtype=x.dtype))
        U = self.edge_init(torch.stack([val, is_ctx.to(x.dtype)], -1))  # (E, D)
        g_c = r * V + vi  # channel node of each edge
        g_t = r * T + ti  # time node of each edge
        Tn = self.time_init(t.reshape(-1, 1))  # (R*T, D)
        C = self.chan.repeat(R, 1)  # (R*V, D)
        if parent is not None and self.fusion is not None:
            C = self.fusion(C, parent.reshape(R * V, -1))  # E_chan <- E_chan + sigmoid(W r_var) * r_var
        layers = zip(self.chan_att[:len(self.time_att)], self.time_att, self.edge_nn, strict=True)
        for chan_att, time_att, edge_nn in layers:
            C_new = chan_att(C, U, g_c, Tn, g_t)  # channel <- its observations and their times
            Tn = time_att(Tn, U, g_t, C, g_c)  # time <- its observations and their channels
            C = C_new
            U = U + torch.relu(edge_nn(torch.cat([U, C[g_c], Tn[g_t]], -1)))
        if self.out is None:  # representation only (`drop_decoder`): the last layer's channel update is all that is left
            C = self.chan_att[-1](C, U, g_c, Tn, g_t)
            return None, C.view(R, V, -1)
        pred = self.out(torch.cat([U[q], C[g_c[q]], Tn[g_t[q]]], -1)).squeeze(-1)
        out = x.new_zeros(R, Q, V)
        out[r[q], ti[q] - L, vi[q]] = pred  # predictions only where a query exists (the rest is masked anyway)
        return out, C.view(R, V, -1)  # predictions (R, Q, V); per-variable representation (R, V, D)

    @staticmethod
    def pass_down(rep: Tensor, n_children: int, start: Tensor, end: Tensor, p_start: Tensor, p_end: Tensor) -> Tensor:
        """Every child inherits its parent's per-variable representation."""
        return rep.repeat_interleave(n_children, 0)


# -------------------------------------------------------------------------------------------------------------- mTAN
class _TimeEmbedding(nn.Module):
    """Learnable time embedding phi(t) = [w0 t + b0, sin(W t + b)] (mTAN eq. 2)."""

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(1, 1)
        self.periodic = nn.Linear(1, d - 1)

    def forward(self, t: Tensor) -> Tensor:
        t = t.unsqueeze(-1)
        return torch.cat([self.linear(t), torch.sin(self.periodic(t))], -1)


def per_channel_attention(scores: Tensor, vals: Tensor, mask: Tensor) -> Tensor:
    """mTAN's masked attention: for each channel c, softmax of `scores` over the slots where mask[..., c] = 1.

    scores (R, H, Nq, L); vals, mask (R, L, C) -> (R, H, Nq, C). Computed as two matmuls,
    sum_l e_l m_lc v_lc / sum_l e_l m_lc with e = exp(s - max_l s) (the shared max cancels in the ratio), instead of a
    (R, H, Nq, L, C) softmax; a channel with no observation gets 0.
    """
    R, H, Nq, L = scores.shape
    e = torch.exp(scores - scores.amax(-1, keepdim=True)).reshape(R, H * Nq, L)
    num, den = torch.bmm(e, vals * mask), torch.bmm(e, mask)
    return (num / den.clamp_min(1e-30) * (den > 0)).view(R, H, Nq, -1)


class MTAN(nn.Module):
    repr_kind = "time"

    def __init__(self, n_vars: int, d_model: int = 32, n_ref: int = 16, n_heads: int = 1, embed_time: int = 16,
                 fusion: bool = False):
        """
        Args:
            n_vars: Number of variables V.
            d_model: Hidden width of the attention output, GRUs and latent z.
            n_ref: Reference points, evenly spaced over the (sub-)sample's window.
            n_heads: Heads of the multi-time attention.
            embed_time: Width of the learnable time embedding.
            fusion: Build the gated fusion (and the map P) that takes a parent level's per-time representation.
        """
        super().__init__()
        self.n_ref, self.h, self.e = n_ref, n_heads, embed_time
        self.phi = _TimeEmbedding(embed_time)
        self.wq = nn.Linear(embed_time, embed_time * n_heads)
        self.wk = nn.Linear(embed_time, embed_time * n_heads)
        self.enc_att_out = nn.Linear(2 * n_vars * n_heads, d_model)
        self.enc_gru = nn.GRU(d_model, d_model, batch_first=True, bidirectional=True)
        self.to_z = nn.Linear(2 * d_model, d_model)
        self.dec_gru = nn.GRU(d_model, d_model, batch_first=True, bidirectional=True)
        self.dec_q = nn.Linear(embed_time, embed_time)
        self.dec_k = nn.Linear(embed_time, embed_time)
        self.out = nn.Sequential(nn.Linear(2 * d_model, d_model), nn.ReLU(), nn.Linear(d_model, n_vars))
        if fusion:
            self.fusion = GatedFusion(d_model)
            self.P = nn.Parameter(torch.eye(n_ref))  # maps the parent's reference points onto the child's
        else:
            self.fusion = None

    def drop_decoder(self) -> None:
        """Keep only the encoder of z: the decoder GRU, its query/key maps and the output head are removed."""
        self.dec_gru = self.dec_q = self.dec_k = self.out = None

    def ref_times(self, start: Tensor, end: Tensor) -> Tensor:
        """(R, n_ref) reference times at the centres of n_ref equal cells of each window."""
        frac = (torch.arange(self.n_ref, device=start.device, dtype=start.dtype) + 0.5) / self.n_ref
        return start.unsqueeze(1) + (end - start).unsqueeze(1) * frac

    def forward(self, x, x_mask, x_time, q_time, q_mask, start, end, parent: Tensor | None = None):
        R, L, V = x.shape
        ref = self.ref_times(start, end)
        # encoder: multi-time attention, queries phi(ref), keys phi(t), values [x, mask] per variable (mTAN eq. 3-4)
        q = self.wq(self.phi(ref)).view(R, self.n_ref, self.h, self.e)
        k = self.wk(self.phi(x_time)).view(R, L, self.h, self.e)
        scores = torch.einsum("rihe,rlhe->rhil", q, k) / math.sqrt(self.e)  # (R, H, n_ref, L)
        vals = torch.cat([x * x_mask, x_mask], -1)  # (R, L, 2V)
        h = per_channel_attention(scores, vals, torch.cat([x_mask, x_mask], -1))  # (R, H, n_ref, 2V)
        h = h.transpose(1, 2).reshape(R, self.n_ref, -1)
        z = self.to_z(self.enc_gru(self.enc_att_out(h))[0])  # (R, n_ref, D)
        if parent is not None and self.fusion is not None:
            r = torch.einsum("rsd,st->rtd", parent, self.P)  # r~ = (r_time^T P)^T
            z = self.fusion(z, r)  # z0 <- z0 + sigmoid(W r~) * r~
        if self.out is None:  # representation only (`drop_decoder`)
            return None, z
        # decoder: GRU over z, then attention from the query times to the reference points
        hdec = self.dec_gru(z)[0]  # (R, n_ref, 2D)
        sq = self.dec_q(self.phi(q_time))
        sk = self.dec_k(self.phi(ref))
        a = torch.softmax(torch.einsum("rqe,rie->rqi", sq, sk) / math.sqrt(self.e), -1)
        return self.out(torch.einsum("rqi,rid->rqd", a, hdec)), z

    def pass_down(self, rep: Tensor, n_children: int, start: Tensor, end: Tensor, p_start: Tensor, p_end: Tensor
                  ) -> Tensor:
        """Each child gets the parent's z linearly interpolated at the child's own reference times.

        `start, end` are the children's windows and `p_start, p_end` their parents' windows, all (R_child,).
        """
        Rc = start.shape[0]
        parent = rep.repeat_interleave(n_children, 0)  # (R_child, n_ref, D)
        tau = self.ref_times(start, end)
        # parent reference i sits at p_start + (i + 0.5) / n_ref * (p_end - p_start)
        pos = ((tau - p_start[:, None]) / (p_end - p_start)[:, None] * self.n_ref - 0.5).clamp(0, self.n_ref - 1)
        lo = pos.floor().long()
        hi = (lo + 1).clamp(max=self.n_ref - 1)
        w = (pos - lo).unsqueeze(-1)
        idx = lambda i: i.unsqueeze(-1).expand(Rc, self.n_ref, parent.shape[-1])
        return parent.gather(1, idx(lo)) * (1 - w) + parent.gather(1, idx(hi)) * w


BACKBONES = {"grafiti": GraFITi, "mtan": MTAN}
