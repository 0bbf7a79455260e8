"""The merging FFN family against by-hand computations of each variant's equations."""
import cmath

import pytest
import torch
import torch.nn.functional as F

from lit_iclr.namex.curvature import KroneckerCurvature, nearest_factors
from lit_iclr.namex.ffn import MergeOptions, MergingFFN
from lit_iclr.namex.merging import DomainVectors, ties_mask
from lit_iclr.namex.nash import nash_weights, normalize_gram
from lit_iclr.namex.propagation import Chain

D, H = 8, 12


def layer(mode, chain=None, **kw):
    torch.manual_seed(0)
    m = MergingFFN(D, H, options=MergeOptions(mode=mode, noisy_gating=False, **kw), chain=chain).double().eval()
    with torch.no_grad():
        m.bank.normal_(0, 0.3)  # biases too, so every parameter matters
        if m.router is not None:
            m.router.w_gate.normal_(0, 1.0)
    return m


def ffn(x, flat):
    """Reference two-layer FFN of one flat expert (w1, b1, w2, b2)."""
    w1, b1, w2, b2 = flat.split((H * D, H, D * H, D))
    return F.linear(F.gelu(F.linear(x, w1.view(H, D), b1)), w2.view(D, H), b2)


def gates_of(m, x):
    return torch.softmax(x.mean(1) @ m.router.w_gate, -1)


x = torch.randn(3, 5, D, dtype=torch.float64)


@pytest.mark.parametrize("mode", ["camex", "ep_camex", "namex"])
def test_gamma_zero_returns_the_base_expert(mode):
    m = layer(mode, gamma=0.0, beta_abs=0.9, beta_phase=0.4)
    torch.testing.assert_close(m(x), ffn(x, m.bank[0]))


def test_smear_is_router_weighted_parameter_average():
    m = layer("smear")
    s = gates_of(m, x)
    ref = torch.stack([ffn(x[b], (s[b, :, None] * m.bank).sum(0)) for b in range(3)])
    torch.testing.assert_close(m(x), ref)


def test_camex_merges_around_the_base():
    m = layer("camex", gamma=0.7)
    s = gates_of(m, x)
    base, experts = m.bank[0], m.bank[1:]
    ref = torch.stack([ffn(x[b], base + 0.7 * (s[b, :, None] * (experts - base)).sum(0)) for b in range(3)])
    torch.testing.assert_close(m(x), ref)


def test_smoe_equals_token_by_token_top_k():
    m = layer("smoe", top_k=2)
    out = m(x)
    ref = torch.zeros_like(x)
    for b in range(3):
        for t in range(5):
            logits = x[b, t] @ m.router.w_gate
            top = logits.topk(2)
            for w, e in zip(top.values.softmax(-1), top.indices, strict=True):
                ref[b, t] += w * ffn(x[b, t], m.bank[e])
    torch.testing.assert_close(out, ref)


def two_layers(mode, **kw):
    chain = Chain()
    return [layer(mode, chain, **kw), layer(mode, chain, **kw)], chain


def test_ep_camex_propagates_the_merged_expert_as_next_base():
    (l1, l2), _ = two_layers("ep_camex", gamma=0.6)
    with torch.no_grad():
        l2.bank.normal_(0, 0.3)  # layer 2 has its own experts
    h = x + l1(x)
    out = l2(h)
    s1, s2 = gates_of(l1, x), gates_of(l2, h)
    merged1 = l1.bank[0] + 0.6 * (s1 @ l1.bank[1:] - s1.sum(-1, keepdim=True) * l1.bank[0])
    merged2 = merged1 + 0.6 * torch.stack([(s2[b, :, None] * (l2.bank[1:] - merged1[b])).sum(0) for b in range(3)])
    ref = torch.stack([ffn(h[b], merged2[b]) for b in range(3)])
    torch.testing.assert_close(out, ref)
    static = layer("camex", gamma=0.6)  # same layer-2 experts but its own base: must differ (propagation matters)
    static.load_state_dict(l2.state_dict())
    assert not torch.allclose(static(h), out)


def nash_alpha_ref(experts, base):
    tau = experts - base
    return nash_weights(normalize_gram(tau @ tau.T))


def test_namex_three_layer_complex_momentum_by_hand():
    chain, beta, gamma = Chain(), 0.85 * cmath.exp(0.5j), 0.6
    layers = [layer("namex", chain, gamma=gamma, beta_abs=0.85, beta_phase=0.5) for _ in range(3)]
    with torch.no_grad():
        for i, m in enumerate(layers):
            m.bank.normal_(0, 0.3, generator=torch.Generator().manual_seed(i))
    h, outs = x, []
    for m in layers:
        y = m(h)
        outs.append((h, y))
        h = h + y
    for b in range(3):
        base, mu = layers[0].bank[0], torch.zeros(layers[0].bank.shape[1], dtype=torch.complex128)
        for m, (hin, y) in zip(layers, outs, strict=True):
            s = gates_of(m, hin)[b]
            alpha = nash_alpha_ref(m.bank[1:], base)
            delta = ((s * alpha)[:, None] * (m.bank[1:] - base)).sum(0)     # sum_i s_i alpha_i tau_i
            mu = beta * mu + delta                                            # complex momentum
            base = base + gamma * mu.real                                     # next base = this layer's merge
            torch.testing.assert_close(y[b], ffn(hin[b], base), rtol=1e-6, atol=1e-8)


def test_namex_without_momentum_is_ep_camex_with_nash_weights():
    (n1, n2), _ = two_layers("namex", beta_abs=0.0, gamma=0.6)
    h = x + n1(x)
    out = n2(h)
    s1 = gates_of(n1, x)
    a1 = nash_alpha_ref(n1.bank[1:], n1.bank[0])
    merged1 = n1.bank[0] + 0.6 * (s1 * a1) @ (n1.bank[1:] - n1.bank[0])
    s2 = gates_of(n2, h)
    for b in range(3):
        a2 = nash_alpha_ref(n2.bank[1:], merged1[b])
        merged2 = merged1[b] + 0.6 * (s2[b] * a2) @ (n2.bank[1:] - merged1[b])
        torch.testing.assert_close(out[b], ffn(h[b], merged2))


def test_linear_domain_vectors_equal_materialised_ones():
    experts, base = torch.randn(4, 30, dtype=torch.float64), torch.randn(6, 30, dtype=torch.float64)
    tau = experts.unsqueeze(0) - base.unsqueeze(1)
    fast, slow = DomainVectors(experts, base), DomainVectors(experts, base, tau)
    w = torch.rand(6, 4, dtype=torch.float64)
    torch.testing.assert_close(fast.weighted(w), slow.weighted(w))
    torch.testing.assert_close(fast.gram(), slow.gram())
    torch.testing.assert_close(fast.gram(), torch.einsum("uip,ujp->uij", tau, tau))


def test_curvature_is_identity_at_init_and_a_kronecker_product():
    curv = KroneckerCurvature(2, [(0, 6, 4)], rank=1).double()
    tau = torch.randn(3, 2, 24 + 5, dtype=torch.float64)  # a 6x4 block followed by 5 pass-through entries
    torch.testing.assert_close(curv(tau), tau)
    with torch.no_grad():
        for f in curv.factors:
            f.normal_()
    out = curv(tau)
    o1, o2 = nearest_factors(6)
    i1, i2 = nearest_factors(4)
    for i in range(2):
        a, b, c, d = (f[0, i] for f in curv.factors)
        kron = torch.kron(torch.kron(a, b), torch.kron(c, d))  # acts on the row-major vec of the (o1,o2,i1,i2) block
        torch.testing.assert_close(out[:, i, :24], tau[:, i, :24] @ kron.T)
        torch.testing.assert_close(out[:, i, 24:], tau[:, i, 24:])
    assert (o1, o2, i1, i2) == (2, 3, 2, 2)


def test_ties_mask_brute_force():
    tau = torch.randn(2, 3, 7)
    mask = ties_mask(tau)
    for u in range(2):
        for i in range(3):
            for p in range(7):
                assert mask[u, i, p] == float(torch.sign(tau[u, i, p]) == torch.sign(tau[u, :, p].sum()))


def test_segment_routing_is_causal():
    """With segment routing, changing tokens of later segments never changes earlier outputs (through 2 layers)."""
    chain = Chain()
    layers = [layer("namex", chain, segment=4, beta_abs=0.9, beta_phase=0.3) for _ in range(2)]
    a = torch.randn(2, 12, D, dtype=torch.float64)
    b = a.clone()
    b[:, 8:] = torch.randn(2, 4, D, dtype=torch.float64)

    def run(z):
        for m in layers:
            z = z + m(z)
        return z

    torch.testing.assert_close(run(a)[:, :8], run(b)[:, :8])
    assert not torch.allclose(run(a)[:, 8:], run(b)[:, 8:])


def test_nash_every_k_reuses_the_cached_weights():
    m = layer("namex", nash_every=3).train()
    m.router.noisy = False
    for _ in range(3):
        m(x)
    assert int(m.merger.nash_calls) == 3
    cached = m.merger.alpha_cache.clone()
    m(x)  # 4th call: a refresh (calls 0 and 3 solve)
    assert not torch.equal(cached, torch.ones_like(cached))
    assert torch.isfinite(m.merger.alpha_cache).all()


def test_equal_parameter_count_across_modes():
    counts = {mode: MergingFFN(D, H, options=MergeOptions(mode=mode)).bank.numel()
              for mode in ["smoe", "smear", "camex", "ep_camex", "namex"]}
    assert len(set(counts.values())) == 1
    dense = MergingFFN(D, H, options=MergeOptions(mode="dense", num_experts=4)).bank
    assert abs(dense.numel() - 4 * (2 * H * D + H + D)) <= 3 * D  # the same weights as 4 experts, one output bias


def test_gamma_one_cancels_the_base_which_is_why_the_default_is_below_one():
    """E_base + sum_i s_i (E_i - E_base) = sum_i s_i E_i when sum_i s_i = 1: the base (and its propagation) drops out."""
    m = layer("camex", gamma=1.0)
    s = gates_of(m, x)
    ref = torch.stack([ffn(x[b], s[b] @ m.bank[1:]) for b in range(3)])
    torch.testing.assert_close(m(x), ref)
    assert MergeOptions().gamma < 1.0


def test_alpha_mode_propagation_uses_nash_weights_for_the_base_and_router_for_the_layer():
    (n1, n2), _ = two_layers("namex", beta_abs=0.0, gamma=0.6, alpha_mode="propagation")
    h = x + n1(x)
    out = n2(h)
    base1 = n1.bank[0]
    a1 = nash_alpha_ref(n1.bank[1:], base1)
    base2 = base1 + 0.6 * a1 @ (n1.bank[1:] - base1)        # input-independent propagation with alpha alone
    s2 = gates_of(n2, h)
    for b in range(3):
        torch.testing.assert_close(out[b], ffn(h[b], base2 + 0.6 * s2[b] @ (n2.bank[1:] - base2)))


def test_layer_with_curvature_and_ties_mask_by_hand():
    m = layer("camex", gamma=0.6, curvature_rank=1, mask="ties")
    plain = layer("camex", gamma=0.6, mask="ties")
    torch.testing.assert_close(m(x), plain(x))  # curvature starts at the identity
    with torch.no_grad():
        for f in m.curvature.factors:
            f.add_(0.1 * torch.randn_like(f))
    s = gates_of(m, x)
    base, experts = m.bank[0], m.bank[1:]
    tau = m.curvature((experts - base).unsqueeze(0))[0]            # M_i (E_i - E_base), checked above as a Kronecker
    tau = tau * (torch.sign(tau) == torch.sign(tau.sum(0))).to(tau.dtype)
    ref = torch.stack([ffn(x[b], base + 0.6 * s[b] @ tau) for b in range(3)])
    torch.testing.assert_close(m(x), ref)
    assert not torch.allclose(m(x), plain(x))
